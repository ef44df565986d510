"""Issue 13's attacks against a real server on loopback: nothing answered is lost, no 5xx, memory bounded.

The fast rounds run by default; the load rounds (10,000 live runs) are ``slow``.
``bench/bench_reliability.py`` runs the same attacks longer and records the figures.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (
    Disk,
    Load,
    fill_hostile_run,
    hostile_bodies,
    hostile_senders,
    logged_decisions,
    rss_kib,
    turn,
)
from servers import LiveServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {"STOPSERVE_MAX_RUNS": "64", "STOPSERVE_MAX_RUN_BYTES": str(256 * 1024)}
    with LiveServer(log_dir=tmp_path_factory.mktemp("reliability"), no_model=True, env=env) as srv:
        yield srv


def test_kill_9_rounds_lose_no_answered_decision(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    answered: set[tuple[str, int]] = set()
    for _ in range(2):
        server = LiveServer(log_dir=logs, no_model=True).start()
        load = Load(server.url, workers=3).start()
        try:
            load.wait_for(150, timeout=60)
            server.kill()  # SIGKILL with requests in flight
        finally:
            load.stop()
            server.kill()
        assert len(load.received) >= 150, server.read_output()
        assert load.server_errors == 0, load.statuses
        answered |= set(load.received)
    with LiveServer(log_dir=logs, no_model=True):  # the restart repairs the log; every line parses
        pass
    lost = answered - logged_decisions(logs)
    assert not lost, f"{len(lost)} answered decisions not in the log, e.g. {sorted(lost)[:3]}"


def test_a_full_disk_round_loses_nothing_and_leaves_no_torn_line(tmp_path: Path) -> None:
    with Disk(tmp_path / "disk") as disk:
        logs = disk.root / "logs"
        server = LiveServer(log_dir=logs, no_model=True).start()
        assert server.proc is not None
        disk.pid = server.proc.pid
        load = Load(server.url, workers=3, tag=f"{disk.kind}-").start()
        try:
            load.wait_for(60)
            disk.fill()
            before = load.statuses.get(503, 0)
            deadline = time.monotonic() + 30
            while load.statuses.get(503, 0) - before < 5 and time.monotonic() < deadline:
                time.sleep(0.02)
            refused = load.statuses.get(503, 0) - before
            disk.free()
            n = len(load.received)
            load.wait_for(n + 60)
            ready = httpx.get(server.url + "/readyz").json()
            server.kill()
        finally:
            load.stop()
            server.kill()
        assert refused >= 5, (disk.kind, load.statuses, server.read_output()[-2000:])
        assert ready["log_ok"] is True  # writes succeed again once there is room
        assert load.server_errors == 0, load.statuses
        with LiveServer(log_dir=logs, no_model=True):
            pass
        lost = set(load.received) - logged_decisions(logs)
        assert not lost, f"{disk.kind}: {len(lost)} answered decisions lost, e.g. {sorted(lost)[:3]}"
        assert not (logs / "decisions.quarantine").exists()  # no torn line was ever left to repair


def test_the_issue_attacks_get_4xx_never_5xx(server: LiveServer) -> None:
    url = server.url
    with httpx.Client(base_url=url, timeout=30) as http:
        # 1. eviction by a flood of batch calls does not reset a run's turn count
        safety = {"max_turns": 5, "min_turns": 0}
        for i in range(3):
            assert (
                http.post("/v1/runs/victim/decide", json={"events": turn(i), "safety": safety}).status_code
                == 200
            )
        for k in range(3):
            batch = {"runs": [{"run_id": f"flood-{k}-{i}", "events": turn(0)} for i in range(64)]}
            assert http.post("/v1/decide:batch", json=batch).status_code == 200
        r = http.post("/v1/runs/victim/decide", json={"events": turn(3)})
        assert r.status_code == 409 and r.json()["error"]["type"] == "run_evicted"
        # 2. a huge id is refused, so empty decides cannot grow the log
        r = http.post("/v1/runs/big-id/decide", json={"events": [turn(0)[1] | {"id": "x" * 7_000_000}]})
        assert r.status_code in (413, 422)
        # 3. one run cannot grow without bound
        statuses = []
        for k in range(40):
            fat = [
                {"id": f"f{k}-{j}", "t": k, "type": "return", "agent": "a", "n": "x" * 8000} for j in range(4)
            ]
            statuses.append(http.post("/v1/runs/fat/decide", json={"events": fat}).status_code)
        assert statuses[-1] == 413 and set(statuses) <= {200, 413}
        # 5. numbers out of range
        huge = b"1" + b"0" * 400
        for body in (
            b'{"events":[{"id":"a","t":1,"type":"return","agent":"x","tokens":' + huge + b"}]}",
            b'{"events":[],"safety":{"max_turns":' + huge + b"}}",
            b'{"runs":[{"run_id":"ok"},{"run_id":"bad","safety":{"max_turns":' + huge + b"}}]}",
        ):
            path = "/v1/decide:batch" if body.startswith(b'{"runs"') else "/v1/runs/nums/decide"
            r = http.post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code in (200, 422), r.text
        # 7. a run id with a slash
        assert http.post("/v1/runs/a%2Fb/decide", json={}).status_code == 422
    # 6. maximum-size bodies: refused or served, never a 5xx, and the server still answers
    for name, body in hostile_bodies(8 * 1024 * 1024).items():
        with hostile_senders(url, body, clients=1) as counts:
            deadline = time.monotonic() + 30
            while sum(counts.values()) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert not any(k.startswith("5") for k in counts), (name, counts)
        assert httpx.post(url + "/v1/runs/after/decide", json={}, timeout=10).status_code == 200
    assert "Traceback" not in server.read_output()


def test_metrics_show_the_store_bytes(server: LiveServer) -> None:
    text = httpx.get(server.url + "/metrics").text
    value = next(float(x.split()[1]) for x in text.splitlines() if x.startswith("stopserve_store_bytes "))
    assert value > 0


@pytest.mark.slow
def test_memory_stays_under_the_byte_caps_with_10000_runs_and_a_hostile_one(tmp_path: Path) -> None:
    cap = 64 * 1024 * 1024
    env = {"STOPSERVE_MAX_STORE_BYTES": str(cap), "STOPSERVE_MAX_RUN_BYTES": str(8 * 1024 * 1024)}
    with LiveServer(log_dir=tmp_path / "logs", no_model=True, env=env) as server:
        assert server.proc is not None
        base, _ = rss_kib(server.proc.pid)
        with httpx.Client(base_url=server.url, timeout=60) as http:
            for t in range(5):
                for b in range(20):
                    runs = [{"run_id": f"r{b}-{i}", "events": turn(t)} for i in range(500)]
                    r = http.post(
                        "/v1/decide:batch",
                        content=orjson.dumps({"runs": runs}),
                        headers={"content-type": "application/json"},
                    )
                    assert r.status_code == 200
            fill_hostile_run(http, 2000)
            text = http.get("/metrics").text
        _, peak = rss_kib(server.proc.pid)
    store = next(float(x.split()[1]) for x in text.splitlines() if x.startswith("stopserve_store_bytes "))
    assert store <= cap
    grown = (peak - base) * 1024
    assert grown <= 3 * cap, (
        f"resident memory grew {grown / 2**20:.0f} MiB with a {cap / 2**20:.0f} MiB store cap"
    )
    json.dumps({"base_kib": base, "peak_kib": peak})
