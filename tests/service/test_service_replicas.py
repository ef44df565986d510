"""Issue 15: several real ``stopserve serve`` replicas sharing runs through a real ``redis-server``.

Every replica is a real server process on loopback (tests/servers.py); Redis is a real
``redis-server`` on a free port (tests/redis_server.py), skipped with a clear message when
it is not installed (CI installs it).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _service_models import tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis_server import RedisServer, need_redis
from servers import LiveServer

pytestmark = pytest.mark.timeout(600)

_KINDS = ("tool_use", "return", "communicate", "aggregate", "reward", "delegate")


def rows(path: Path) -> list[dict[str, Any]]:
    """The whole lines of a JSONL log (a killed writer may leave half a line at the end)."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    return [json.loads(line) for line in raw[: raw.rfind(b"\n") + 1].splitlines()]


def post(client: httpx.Client, url: str, body: dict[str, Any]) -> httpx.Response:
    return client.post(url, json=body, timeout=30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One Redis, three replicas on it, and one in-memory replica to compare with; same model."""
    need_redis()
    base = tmp_path_factory.mktemp("replicas")
    model = tiny_model(base / "model", "tiny-mixed", stop_bias=0.0)
    redis = RedisServer(base / "redis").start()
    env = {"STOPSERVE_STORE": redis.url}
    replicas = [LiveServer(log_dir=base / f"r{k}", model=model, env=env) for k in range(3)]
    alone = LiveServer(log_dir=base / "alone", model=model)
    try:
        starting = [threading.Thread(target=server.start) for server in [*replicas, alone]]
        for t in starting:
            t.start()
        for t in starting:
            t.join()
        for server in [*replicas, alone]:
            assert server.proc is not None and server.proc.poll() is None, server.read_output()
        yield {"redis": redis, "replicas": replicas, "alone": alone, "base": base}
    finally:
        for server in [*replicas, alone]:
            server.stop()
        redis.stop(hard=True)


@st.composite
def scripted_runs(draw: st.DrawFn) -> dict[str, Any]:
    """A run as the calls a client makes: new events, retries, empty decides, proposed stops."""
    n = draw(st.integers(2, 40))
    t = 0.0
    events = []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 1.0, 2.5]))
        kind = draw(st.sampled_from(_KINDS))
        e: dict[str, Any] = {
            "id": f"e{i}",
            "t": t,
            "type": kind,
            "agent": draw(st.sampled_from(["coder", "critic"])),
            "content_ref": draw(st.sampled_from([None, "same", f"ref{i}"])),
            "tokens": draw(st.integers(0, 900)),
        }
        if kind == "tool_use":
            e["tool"] = "bash"
        if kind == "reward":
            e["value"] = draw(st.sampled_from([0.0, 0.5, 1.0]))
        events.append({k: v for k, v in e.items() if v is not None})
    calls: list[dict[str, Any]] = []
    i = 0
    while i < n:
        j = min(n, i + draw(st.integers(1, 5)))
        calls.append({"events": events[i:j], "proposed_stop": draw(st.booleans())})
        roll = draw(st.integers(0, 9))
        if roll == 0:
            calls.append(dict(calls[-1]))  # a retry of the same call
        elif roll == 1:
            calls.append({"events": [], "proposed_stop": draw(st.booleans())})  # decided again
        i = j
    first = calls[0]
    first["safety"] = draw(
        st.sampled_from(
            [{"max_turns": 6, "min_turns": 0}, {"loop": True, "min_turns": 1}, {"max_tokens": 8000}]
        )
    )
    first["budget"] = {"max_turns": 30, "max_tokens": 20000}
    first["task_id"] = "task-" + draw(st.sampled_from(["a", "b"]))
    return {
        "calls": calls,
        "replica": draw(st.lists(st.integers(0, 2), min_size=len(calls), max_size=len(calls))),
    }


_EXAMPLES = iter(range(10**6))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(script=scripted_runs())
def test_round_robin_over_three_replicas_decides_like_one_process(
    cluster: dict[str, Any], script: dict[str, Any]
) -> None:
    run_id = f"rr-{next(_EXAMPLES)}"
    replicas: list[LiveServer] = cluster["replicas"]
    alone: LiveServer = cluster["alone"]
    with httpx.Client() as client:
        for k, (call, which) in enumerate(zip(script["calls"], script["replica"], strict=True)):
            shared = post(client, f"{replicas[which].url}/v1/runs/{run_id}/decide", call)
            single = post(client, f"{alone.url}/v1/runs/{run_id}/decide", call)
            assert shared.status_code == single.status_code == 200, (k, shared.text, single.text)
            assert shared.json() == single.json(), f"call {k} on replica {which}"
        outcome = {"rewards": {"team": 1.0}, "metrics": {"m": 2.0}}
        last = script["replica"][-1]
        done = post(client, f"{replicas[(last + 1) % 3].url}/v1/runs/{run_id}/outcome", outcome)
        single = post(client, f"{alone.url}/v1/runs/{run_id}/outcome", outcome)
        assert done.status_code == single.status_code == 200, (done.text, single.text)
        assert {**done.json(), "trace_log": None} == {**single.json(), "trace_log": None}
        # closed for every replica
        for server in replicas:
            again = post(client, f"{server.url}/v1/runs/{run_id}/decide", {"events": []})
            assert again.status_code == 409 and again.json()["error"]["type"] == "run_closed"
    base: Path = cluster["base"]
    written = [t for k in range(3) for t in rows(base / f"r{k}" / "traces.jsonl") if t["trace_id"] == run_id]
    expected = [t for t in rows(base / "alone" / "traces.jsonl") if t["trace_id"] == run_id]
    assert len(written) == 1 and len(expected) == 1
    # when the run started: the wall clock of whichever process saw its first call
    started = [t["metrics"].pop("service_started") for t in (written[0], expected[0])]
    assert abs(started[0] - started[1]) < 120
    assert written[0] == expected[0]


def _drive(
    urls: list[str], run_id: str, turns: int, acked: list[dict[str, Any]], errors: list[str], seed: int
) -> None:
    """One client: a turn per call, round robin over the replicas; a failed call is retried on the next."""
    rng = random.Random(seed)
    delivered = 0
    k = rng.randrange(len(urls))
    with httpx.Client() as client:
        for turn in range(turns):
            body = {
                "events": [
                    {"id": f"c{turn}", "t": 2.0 * turn, "type": "tool_use", "agent": "coder", "tokens": 10},
                    {"id": f"r{turn}", "t": 2.0 * turn + 1, "type": "return", "agent": "bash", "tokens": 5},
                ],
                "prior_events": delivered,
            }
            for _attempt in range(12):
                url = urls[k % len(urls)]
                k += 1
                try:
                    r = client.post(f"{url}/v1/runs/{run_id}/decide", json=body, timeout=10)
                except httpx.TransportError:
                    continue  # that replica is gone: the next one
                if r.status_code == 503:
                    time.sleep(0.05)
                    continue
                if r.status_code != 200:
                    errors.append(f"{run_id} turn {turn}: {r.status_code} {r.text}")
                    return
                answer = r.json()
                acked.append({"run_id": run_id, "event_id": f"r{turn}", "turn": answer["turn"]})
                if answer["turn"] != turn + 1:
                    errors.append(f"{run_id}: turn {answer['turn']} answered for turn {turn + 1}")
                delivered += 2
                break
            else:
                errors.append(f"{run_id} turn {turn}: no replica answered")
                return


def test_kill_9_of_one_replica_mid_run_the_others_go_on(tmp_path: Path) -> None:
    need_redis()
    with RedisServer(tmp_path / "redis") as redis:
        env = {"STOPSERVE_STORE": redis.url}
        replicas = [LiveServer(log_dir=tmp_path / f"r{k}", no_model=True, env=env).start() for k in range(3)]
        try:
            urls = [s.url for s in replicas]
            acked: list[dict[str, Any]] = []
            errors: list[str] = []
            clients = [
                threading.Thread(target=_drive, args=(urls, f"k9-{n}", 60, acked, errors, n))
                for n in range(4)
            ]
            for c in clients:
                c.start()
            deadline = time.monotonic() + 60
            while len(acked) < 40 and time.monotonic() < deadline:
                time.sleep(0.01)
            replicas[1].kill()  # mid-run, requests in flight
            for c in clients:
                c.join(120)
        finally:
            for s in replicas:
                s.stop()
        assert not errors, errors[:5]
        assert len(acked) == 4 * 60  # every run went on to its last turn, at the right turn count
        logged = {
            (x["run_id"], x["event_id"], x["turn"])
            for k in range(3)
            for x in rows(tmp_path / f"r{k}" / "decisions.jsonl")
        }
        missing = [a for a in acked if (a["run_id"], a["event_id"], a["turn"]) not in logged]
        assert not missing, f"{len(missing)} acknowledged decisions in no replica's log, e.g. {missing[:3]}"


def test_redis_restarted_mid_run_resumes_with_persistence_and_refuses_without(tmp_path: Path) -> None:
    need_redis()
    turn = {"n": 0}

    def call(client: httpx.Client, url: str, run_id: str, delivered: int) -> httpx.Response:
        i = turn["n"]
        turn["n"] += 1
        body = {
            "events": [
                {"id": f"c{i}", "t": 2.0 * i, "type": "tool_use", "agent": "coder"},
                {"id": f"r{i}", "t": 2.0 * i + 1, "type": "return", "agent": "bash"},
            ],
            "prior_events": delivered,
        }
        return client.post(f"{url}/v1/runs/{run_id}/decide", json=body, timeout=30)

    with RedisServer(tmp_path / "redis", persist=True) as redis:
        env = {"STOPSERVE_STORE": redis.url}
        with LiveServer(log_dir=tmp_path / "r0", no_model=True, env=env) as server, httpx.Client() as client:
            for i in range(3):
                assert call(client, server.url, "p", 2 * i).json()["turn"] == i + 1
            redis.stop(hard=True)  # kill -9: the append-only file has every acknowledged write
            down = call(client, server.url, "p", 6)
            turn["n"] -= 1
            assert down.status_code == 503 and down.json()["error"]["type"] == "store_unavailable"
            assert client.get(server.url + "/readyz").status_code == 503
            redis.start()
            r = call(client, server.url, "p", 6)
            assert r.status_code == 200 and r.json()["turn"] == 4, r.text  # resumed, not reset
            assert client.get(server.url + "/readyz").status_code == 200
            # a snapshot now, two more turns, then Redis comes back from the snapshot alone
            redis_cli(redis, "CONFIG", "SET", "appendonly", "no")
            redis_cli(redis, "SAVE")
            for i in range(2):
                assert call(client, server.url, "p", 8 + 2 * i).json()["turn"] == 5 + i
            redis.stop(hard=True)
            redis.persist = False  # restart from dump.rdb: the last two turns are lost
            redis.start()
            lost = call(client, server.url, "p", 12)
            assert lost.status_code == 409, lost.text
            err = lost.json()["error"]
            assert (
                err["type"] == "run_evicted"
                and "holds 8 of its events but 12 were delivered" in err["message"]
            )
            # no data at all (a new, empty Redis): refused the same way, never turn 1
            redis_cli(redis, "FLUSHALL")
            gone = call(client, server.url, "p", 12)
            assert gone.status_code == 409 and gone.json()["error"]["type"] == "run_evicted"


def redis_cli(redis: RedisServer, *args: str) -> Any:
    import redis as redis_py

    client = redis_py.Redis.from_url(redis.url)
    try:
        return client.execute_command(*args)
    finally:
        client.close()


def test_two_replicas_racing_on_one_run_lose_and_double_count_nothing(tmp_path: Path) -> None:
    need_redis()
    n_threads, per_thread = 4, 30
    with RedisServer(tmp_path / "redis") as redis:
        env = {"STOPSERVE_STORE": redis.url}
        replicas = [LiveServer(log_dir=tmp_path / f"r{k}", no_model=True, env=env).start() for k in range(2)]
        try:
            accepted: list[int] = []
            statuses: list[int] = []
            lock = threading.Lock()

            def racer(k: int) -> None:
                rng = random.Random(k)
                with httpx.Client() as client:
                    for j in range(per_thread):
                        mine = {
                            "id": f"t{k}-{j}",
                            "t": 1.0,
                            "type": "return",
                            "agent": f"a{k}",
                            "tokens": 1 + k,
                        }
                        # and one event another racer also sends: only one of them may count it
                        common = {
                            "id": f"common-{j}",
                            "t": 1.0,
                            "type": "return",
                            "agent": "x",
                            "tokens": 1000,
                        }
                        body = {"events": rng.sample([mine, common], 2)}
                        url = replicas[(k + j) % 2].url
                        r = client.post(f"{url}/v1/runs/race/decide", json=body, timeout=30)
                        with lock:
                            statuses.append(r.status_code)
                            if r.status_code == 200:
                                accepted.append(r.json()["events_accepted"])

            threads = [threading.Thread(target=racer, args=(k,)) for k in range(n_threads)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert set(statuses) == {200}, sorted(set(statuses))
            distinct = n_threads * per_thread + per_thread
            assert sum(accepted) == distinct  # every event accepted exactly once, across both replicas
            info = httpx.get(f"{replicas[0].url}/v1/runs/race", timeout=30).json()
            assert info["n_events"] == distinct
            tokens = per_thread * sum(1 + k for k in range(n_threads)) + per_thread * 1000
            assert info["features"]["tokens"] == tokens
            out = httpx.post(
                f"{replicas[1].url}/v1/runs/race/outcome", json={"rewards": {"r": 1.0}}, timeout=30
            )
            assert out.status_code == 200 and out.json()["n_events"] == distinct
        finally:
            for s in replicas:
                s.stop()
        trace = next(t for k in range(2) for t in rows(tmp_path / f"r{k}" / "traces.jsonl"))
        ids = [e["id"] for e in trace["events"]]
        assert len(ids) == len(set(ids)) == distinct
