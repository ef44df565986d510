"""Issue 15: the Redis run store's edges, in process (the app on a real ``redis-server``).

Expiry and eviction are refused (409 ``run_evicted``) as on one process, never restarted;
a run record this version cannot read is refused the same way; a store that cannot be
reached is a 503, never a 500; ``--workers N`` serves with a shared store.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis_server import RedisServer, need_redis
from servers import LiveServer
from test_service_app import lines, make_client, turn_events

from stopserve.errors import ConfigError
from stopserve.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    need_redis()
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


def raw_client(redis: RedisServer) -> Any:
    import redis as redis_py

    return redis_py.Redis.from_url(redis.url)


def test_an_expired_run_is_refused_not_restarted(redis: RedisServer, tmp_path: Path) -> None:
    with make_client(tmp_path, store=redis.url, run_ttl_s=0.3) as c:
        assert c.post("/v1/runs/idle/decide", json={"events": turn_events(0)}).status_code == 200
        time.sleep(0.6)
        r = c.post("/v1/runs/idle/decide", json={"events": turn_events(1)})
        assert r.status_code == 409, r.text
        err = r.json()["error"]
        assert err["type"] == "run_evicted" and "ttl" in err["message"] and "prior_events" in err["message"]
        assert c.post("/v1/runs/idle/outcome", json={"rewards": {"r": 1.0}}).status_code == 409
        # the client resends the whole run: it resumes at its real turn
        whole = turn_events(0) + turn_events(1)
        r = c.post("/v1/runs/idle/decide", json={"events": whole, "prior_events": 0})
        assert r.status_code == 200 and r.json()["turn"] == 2


def test_a_run_redis_evicted_is_refused_naming_its_memory(redis: RedisServer, tmp_path: Path) -> None:
    with make_client(tmp_path, store=redis.url) as c:
        assert c.post("/v1/runs/ev/decide", json={"events": turn_events(0)}).status_code == 200
        raw_client(redis).delete("stopserve:{ev}:run")  # what maxmemory eviction does to a run
        r = c.post("/v1/runs/ev/decide", json={"events": turn_events(1)})
        assert r.status_code == 409 and "maxmemory" in r.json()["error"]["message"]
        assert c.delete("/v1/runs/ev").status_code == 204  # forgotten: the id may start again
        assert c.post("/v1/runs/ev/decide", json={"events": turn_events(0)}).json()["turn"] == 1


def test_a_record_this_version_cannot_read_is_refused(redis: RedisServer, tmp_path: Path) -> None:
    with make_client(tmp_path, store=redis.url) as c:
        assert c.post("/v1/runs/old/decide", json={"events": turn_events(0)}).status_code == 200
        raw_client(redis).hset("stopserve:{old}:run", "s", b"\x93not a record")
        r = c.post("/v1/runs/old/decide", json={"events": turn_events(1)})
        assert (
            r.status_code == 409
            and "cannot be read by this stopserve version" in r.json()["error"]["message"]
        )


def test_outcome_close_delete_and_info_are_shared(redis: RedisServer, tmp_path: Path) -> None:
    """Two apps on one Redis: what one does, the other sees."""
    with make_client(tmp_path / "a", store=redis.url) as a, make_client(tmp_path / "b", store=redis.url) as b:
        assert (
            a.post("/v1/runs/s1/decide", json={"events": turn_events(0), "task_id": "T"}).status_code == 200
        )
        r = b.post("/v1/runs/s1/decide", json={"events": turn_events(0) + turn_events(1)})
        assert r.json()["events_accepted"] == 2 and r.json()["events_ignored"] == 2 and r.json()["turn"] == 2
        info = a.get("/v1/runs/s1").json()
        assert info["n_events"] == 4 and info["n_decisions"] == 2 and info["task_id"] == "T"
        assert b.delete("/v1/runs/s1").status_code == 204
        assert a.get("/v1/runs/s1").status_code == 404
        assert a.post("/v1/runs/s2/decide", json={"events": turn_events(0)}).status_code == 200
        assert b.post("/v1/runs/s2/decide", json={}).status_code == 200  # decided again, same event
        out = b.post("/v1/runs/s2/outcome", json={"rewards": {"r": 1.0}})
        assert out.status_code == 200 and out.json()["n_events"] == 2
        assert a.post("/v1/runs/s2/decide", json={}).json()["error"]["type"] == "run_closed"
    trace = lines(tmp_path / "b" / "logs" / "traces.jsonl")[0]
    last = trace["events"][-1]
    assert "decision" in last and len(last["later_decisions"]) == 1  # both decisions, in order


def test_an_unreachable_store_is_a_503_and_not_ready(tmp_path: Path) -> None:
    need_redis()
    server = RedisServer(tmp_path / "redis").start()
    with make_client(tmp_path, store=server.url) as c:
        assert c.post("/v1/runs/d/decide", json={"events": turn_events(0)}).status_code == 200
        server.stop(hard=True)
        r = c.post("/v1/runs/d/decide", json={"events": turn_events(1)})
        assert r.status_code == 503 and r.json()["error"]["type"] == "store_unavailable"
        assert "redis://127.0.0.1" in r.json()["error"]["message"]
        batch = c.post("/v1/decide:batch", json={"runs": [{"run_id": "d", "events": turn_events(1)}]})
        assert batch.status_code == 200 and batch.json()["results"][0]["error"]["status"] == 503
        assert c.get("/readyz").status_code == 503
        server.start()  # empty (no persistence): the run is gone, and is not restarted at turn 1
        r = c.post("/v1/runs/d/decide", json={"events": turn_events(1), "prior_events": 2})
        assert r.status_code == 409 and r.json()["error"]["type"] == "run_evicted"
        assert c.get("/readyz").status_code == 200
        assert c.post("/v1/runs/new/decide", json={"events": turn_events(0)}).json()["turn"] == 1


def test_a_bad_store_setting_is_one_line_naming_it() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(store="http://localhost:6379")
    assert "STOPSERVE_STORE" in str(info.value.issues[0]) and "redis://" in str(info.value.issues[0])
    assert load_settings(store="memory").store is None and not load_settings().shared_store


def _serve(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("STOPSERVE_")}
    base.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "stopserve.cli", "serve", "--no-model", *argv],
        check=False,
        env=base,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_serve_refuses_an_unreachable_store_in_one_line(tmp_path: Path) -> None:
    from servers import free_port

    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    done = _serve(["--port", "0", "--log-dir", str(tmp_path)], {"STOPSERVE_STORE": url})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "STOPSERVE_STORE" in done.stderr and "cannot be reached" in done.stderr
    assert "hunter2" not in done.stderr  # the password is not printed


def test_two_workers_share_runs_through_redis(redis: RedisServer, tmp_path: Path) -> None:
    env = {"STOPSERVE_STORE": redis.url}
    with LiveServer(log_dir=tmp_path, no_model=True, env=env, args=["--workers", "2"]) as server:
        with httpx.Client() as client:
            turns = []
            for i in range(12):  # new connections: uvicorn's workers take them in turn
                r = client.post(
                    f"{server.url}/v1/runs/w/decide",
                    json={"events": turn_events(i), "prior_events": 2 * i},
                    headers={"connection": "close"},
                )
                assert r.status_code == 200, r.text
                turns.append(r.json()["turn"])
            assert turns == list(range(1, 13))
        # the service answers once one worker is up: the other may still be starting
        deadline = time.monotonic() + 60
        while server.read_output().count("Started server process") < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert server.read_output().count("Started server process") == 2, server.read_output()
    assert len(lines(tmp_path / "decisions.jsonl")) == 12  # one log file, shared by the workers


def test_a_run_named_twice_in_a_batch_is_decided_in_order(redis: RedisServer, tmp_path: Path) -> None:
    with make_client(tmp_path, store=redis.url) as c:
        runs = [{"run_id": "bb", "events": turn_events(i)} for i in range(4)] + [
            {"run_id": "other", "events": turn_events(0)}
        ]
        r = c.post("/v1/decide:batch", json={"runs": runs})
        assert r.status_code == 200
        turns = [x["decision"]["turn"] for x in r.json()["results"]]
        assert turns == [1, 2, 3, 4, 1]


def test_a_batch_of_more_runs_than_the_connection_pool_holds_is_decided_whole(
    redis: RedisServer, tmp_path: Path
) -> None:
    """A batch's runs are decided concurrently; past the asyncio pool's size they wait for a
    connection instead of each failing with "Too many connections"."""
    with make_client(tmp_path, store=redis.url) as c:
        runs = [{"run_id": f"pool-{i}", "events": turn_events(0)} for i in range(300)]
        r = c.post("/v1/decide:batch", json={"runs": runs})
        assert r.status_code == 200, r.text
        errors = [x["error"] for x in r.json()["results"] if x["decision"] is None]
        assert not errors, f"{len(errors)} of 300 runs failed, e.g. {errors[0]}"
