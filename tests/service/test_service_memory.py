"""Issue 13, item 3: a run's retained state and the whole store are bounded in bytes."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from pathlib import Path
from typing import Any

from test_service_app import make_client, turn_events

from stopserve.api import DecideRequest
from stopserve.service.engine import Engine
from stopserve.service.metrics import Metrics
from stopserve.settings import Settings


def fat(i: int, pad: int = 2000) -> dict[str, Any]:
    return {"id": f"f{i}", "t": float(i), "type": "return", "agent": "a", "note": "n" * pad}


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_a_run_is_refused_before_it_grows_past_its_byte_cap(tmp_path: Path) -> None:
    cap = 64 * 1024
    with make_client(tmp_path, max_run_bytes=cap) as c:
        refused = None
        for k in range(100):
            r = c.post("/v1/runs/big/decide", json={"events": [fat(10 * k + j) for j in range(10)]})
            if r.status_code != 200:
                refused = r
                break
        assert refused is not None and refused.status_code == 413, "a run grew without bound"
        err = refused.json()["error"]
        assert err["type"] == "run_limit" and "bytes" in err["message"]
        assert err["issues"][0]["field"] == "events"
        store_bytes = metric(c.get("/metrics").text, "stopserve_store_bytes")
        assert 0 < store_bytes <= cap
        # nothing of the refused call was folded, and the run still answers
        n = c.get("/v1/runs/big").json()["n_events"]
        assert n % 10 == 0 and n < 10 * k + 10
        assert c.post("/v1/runs/big/decide", json={}).status_code == 200


def test_one_event_above_the_event_cap_is_refused(tmp_path: Path) -> None:
    with make_client(tmp_path, max_event_bytes=4096) as c:
        r = c.post("/v1/runs/e/decide", json={"events": [fat(0, 100), fat(1, 5000)]})
        assert r.status_code == 413 and r.json()["error"]["issues"][0]["field"] == "events[1]"
        assert c.get("/v1/runs/e").json()["n_events"] == 0


def test_the_store_total_is_bounded_in_bytes(tmp_path: Path) -> None:
    cap = 256 * 1024
    with make_client(tmp_path, max_store_bytes=cap, max_run_bytes=64 * 1024) as c:
        for i in range(30):  # ~30 KiB each: the store must drop the least recently used
            r = c.post(f"/v1/runs/s{i}/decide", json={"events": [fat(j) for j in range(12)]})
            assert r.status_code == 200, r.text
            assert metric(c.get("/metrics").text, "stopserve_store_bytes") <= cap
        text = c.get("/metrics").text
        assert 'stopserve_evictions_total{cause="bytes"}' in text
        r = c.post("/v1/runs/s0/decide", json={"events": [fat(99)]})
        assert r.status_code == 409 and r.json()["error"]["type"] == "run_evicted"


def _retained(engine: Engine, run_id: str, bodies: list[dict[str, Any]]) -> tuple[int, int]:
    """(bytes tracemalloc sees the run hold, bytes the store charges it)."""
    loop = asyncio.new_event_loop()  # one loop, made before the count, as the service has one
    try:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for body in bodies:
            loop.run_until_complete(engine.decide(run_id, DecideRequest.model_validate(body)))
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
    finally:
        loop.close()
    held = sum(s.size_diff for s in after.compare_to(before, "filename"))
    run = engine.store.get(run_id)
    assert run is not None and not isinstance(run, type(None))
    return held, run.nbytes  # type: ignore[union-attr]


def test_the_charged_bytes_bound_the_real_memory_of_a_run() -> None:
    engine = Engine(Settings(no_model=True, log_dir=None), Metrics())
    engine.start()
    shapes = {
        "small turns": [{"events": turn_events(i)} for i in range(200)],
        "long ids": [
            {"events": [{"id": f"{i:04d}" + "i" * 250, "t": i, "type": "return", "agent": "g" * 256}]}
            for i in range(200)
        ],
        "fat extras": [{"events": [fat(i, 3000)]} for i in range(100)],
        "non-ascii": [{"events": [fat(i, 0) | {"note": "\U0001f600" * 500}]} for i in range(100)],
        "empty decides": [{"events": turn_events(0)}] + [{} for _ in range(300)],
    }
    for name, bodies in shapes.items():
        held, charged = _retained(engine, name.replace(" ", "-"), bodies)
        assert held <= charged, f"{name}: holds {held} bytes, charged {charged}"
        assert charged <= 4 * held, f"{name}: charged {charged} bytes for {held} held (too coarse)"
