"""Issue 13, item 1: a run the store dropped is refused (409 run_evicted), never restarted at turn 1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_service_app import lines, make_client, turn_events

from stopserve.features import RunState
from stopserve.service.memory_store import MemoryRunStore
from stopserve.service.store import Evicted, Run


def run_events(n: int) -> list[dict[str, Any]]:
    return [e for i in range(n) for e in turn_events(i)]


def test_an_evicted_run_is_refused_until_its_journal_is_resent(tmp_path: Path) -> None:
    safety = {"max_turns": 5, "min_turns": 0}
    with make_client(tmp_path, max_runs=1) as c:
        for i in range(3):
            r = c.post("/v1/runs/A/decide", json={"events": turn_events(i), "safety": safety})
            assert r.status_code == 200 and r.json()["turn"] == i + 1
        assert c.post("/v1/runs/B/decide", json={"events": turn_events(0)}).status_code == 200  # evicts A
        for i in (3, 4):  # A's next decides: never "turn 1"
            r = c.post("/v1/runs/A/decide", json={"events": turn_events(i)})
            assert r.status_code == 409, r.text
            err = r.json()["error"]
            assert err["type"] == "run_evicted" and "'A'" in err["message"]
            assert "prior_events" in err["message"]
        # no truncated trace either: the outcome is refused the same way
        r = c.post("/v1/runs/A/outcome", json={"rewards": {"team": 1.0}})
        assert r.status_code == 409 and r.json()["error"]["type"] == "run_evicted"
        assert c.get("/v1/runs/A").json()["error"]["type"] == "run_evicted"
        # the client resends its journal (every event, prior_events 0): the run resumes at its real turn
        r = c.post("/v1/runs/A/decide", json={"events": run_events(5), "prior_events": 0, "safety": safety})
        assert r.status_code == 200, r.text
        assert r.json()["turn"] == 5 and r.json()["action"] == "stop" and r.json()["limit"] == "turns"
        out = c.post("/v1/runs/A/outcome", json={"rewards": {"team": 1.0}})
        assert out.status_code == 200 and out.json()["n_events"] == 10
    logged = [x for x in lines(tmp_path / "logs" / "traces.jsonl") if x["trace_id"] == "A"]
    assert len(logged) == 1 and len(logged[0]["events"]) == 10


def test_an_expired_run_is_refused(tmp_path: Path) -> None:
    with make_client(tmp_path, run_ttl_s=0.05) as c:
        assert c.post("/v1/runs/idle/decide", json={"events": turn_events(0)}).status_code == 200
        import time

        time.sleep(0.2)
        r = c.post("/v1/runs/idle/decide", json={"events": turn_events(1)})
        assert r.status_code == 409 and r.json()["error"]["type"] == "run_evicted"
        assert "ttl" in r.json()["error"]["message"]


def test_a_run_the_service_never_held_is_refused_when_the_client_says_it_continues(tmp_path: Path) -> None:
    # e.g. after a restart: the client had 4 events accepted, the new process knows nothing of the run
    with make_client(tmp_path) as c:
        r = c.post("/v1/runs/R/decide", json={"events": turn_events(2), "prior_events": 4})
        assert r.status_code == 409 and r.json()["error"]["type"] == "run_evicted"
        r = c.post("/v1/runs/R/decide", json={"events": run_events(3), "prior_events": 0})
        assert r.status_code == 200 and r.json()["turn"] == 3
        # a held run ignores the count (a retry or a resend after a lost answer)
        r = c.post("/v1/runs/R/decide", json={"events": turn_events(3), "prior_events": 6})
        assert r.status_code == 200 and r.json()["turn"] == 4


def test_batch_eviction_attack_cannot_reset_a_run(tmp_path: Path) -> None:
    with make_client(tmp_path, max_runs=8) as c:
        body = {"events": turn_events(0), "safety": {"max_turns": 2, "min_turns": 0}}
        assert c.post("/v1/runs/victim/decide", json=body).json()["turn"] == 1
        for k in range(3):
            batch = {"runs": [{"run_id": f"x{k}-{i}", "events": turn_events(0)} for i in range(8)]}
            assert c.post("/v1/decide:batch", json=batch).status_code == 200
        r = c.post("/v1/runs/victim/decide", json={"events": turn_events(1)})
        assert r.status_code == 409 and r.json()["error"]["type"] == "run_evicted"


def _run(rid: str) -> Run:
    return Run(run_id=rid, task_id=rid, state=RunState(), created_at=0.0, last_seen_at=0.0)


def test_the_store_reports_eviction_as_a_typed_outcome() -> None:
    now = [0.0]
    store = MemoryRunStore(max_runs=1, ttl_s=10, clock=lambda: now[0])
    store.add(_run("a"))
    store.add(_run("b"))
    got = store.get("a")
    assert isinstance(got, Evicted) and got.cause == "lru" and got.run_id == "a"
    now[0] = 20.0
    got = store.get("b")
    assert isinstance(got, Evicted) and got.cause == "ttl"
    assert store.get("never") is None
    store.forget("a")
    assert store.get("a") is None
