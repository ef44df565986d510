"""The decide routes: async decide on the event loop, group commit, the documented errors and bodies."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from test_service_app import lines, make_client, turn_events

from stopserve.api import BatchDecideRequest, DecideRequest, OutcomeRequest, StatelessDecideRequest
from stopserve.service.log import JsonlLog


@pytest.mark.parametrize("fsync", ["always", "interval"])
def test_every_answered_decision_is_in_the_log_when_answered(tmp_path: Path, fsync: str) -> None:
    log = tmp_path / "logs" / "decisions.jsonl"
    missing: list[tuple[str, int]] = []
    answered: list[tuple[str, int]] = []

    with make_client(tmp_path, fsync=fsync) as client:

        def agent(k: int) -> None:
            run = f"run-{k}"
            for turn in range(15):
                r = client.post(f"/v1/runs/{run}/decide", json={"events": turn_events(turn)})
                assert r.status_code == 200, r.text
                # read the file the moment the answer arrives: the line must already be there
                # (other threads' lines may be mid-write: only whole lines, those ended by a newline)
                whole = log.read_bytes().split(b"\n")[:-1]
                seen = {(x["run_id"], x["seq"]) for x in map(json.loads, whole)}
                answered.append((run, turn))
                if (run, turn) not in seen:
                    missing.append((run, turn))

        threads = [threading.Thread(target=agent, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        batch = {"runs": [{"run_id": f"b{i}", "events": turn_events(0)} for i in range(5)]}
        assert client.post("/v1/decide:batch", json=batch).status_code == 200
        assert {(x["run_id"], x["seq"]) for x in lines(log)} >= {(f"b{i}", 0) for i in range(5)}
    assert len(answered) == 6 * 15 and not missing, missing[:5]
    rows = lines(log)
    assert len(rows) == 6 * 15 + 5  # nothing twice, nothing lost
    for k in range(6):  # each run's lines in its own order
        assert [x["seq"] for x in rows if x["run_id"] == f"run-{k}"] == list(range(15))


def test_group_commit_shares_one_fsync_between_waiting_lines(tmp_path: Path) -> None:
    log = JsonlLog(tmp_path / "d.jsonl", fsync="always")

    async def main() -> None:
        # hold the file while 50 lines queue up: the writer can take at most two batches
        with log._lock:
            waiters = [log.submit({"n": i}) for i in range(50)]
            await asyncio.sleep(0.05)
            assert not any(w is not None and w.done() for w in waiters)  # not durable, not answered
        await asyncio.gather(*(w for w in waiters if w is not None))

    asyncio.run(main())
    assert 1 <= log.commits <= 2
    log.append({"n": 50})  # a blocking caller (thread pool) waits for its own commit
    assert log.commits <= 3
    log.close()
    assert [json.loads(x)["n"] for x in (tmp_path / "d.jsonl").read_bytes().splitlines()] == list(range(51))


def test_interval_lines_are_written_at_once_and_fsynced_in_the_background(tmp_path: Path) -> None:
    log = JsonlLog(tmp_path / "d.jsonl", fsync="interval", fsync_interval_s=0.02)

    async def main() -> None:
        assert log.submit({"n": 1}) is None  # nothing to await: the line is in the OS file now
        assert (tmp_path / "d.jsonl").read_bytes() == b'{"n":1}\n'

    asyncio.run(main())
    deadline = time.monotonic() + 10
    while log._dirty and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not log._dirty  # the syncer thread fsynced without any request's help
    log.close()


def test_a_failing_log_fails_the_decision_not_the_server(tmp_path: Path) -> None:
    with make_client(tmp_path, fsync="always") as client:
        assert client.post("/v1/runs/a/decide", json={"events": turn_events(0)}).status_code == 200
        engine: Any = client.app.state.engine  # type: ignore[attr-defined]
        decisions = engine.log.decisions
        good = decisions._fd
        decisions._fd = os.open(decisions.path, os.O_RDONLY)  # the same file, but writes now fail
        try:
            r = client.post("/v1/runs/a/decide", json={"events": turn_events(1)})
            assert r.status_code == 503 and r.json()["error"]["type"] == "log_unavailable"
            assert client.get("/readyz").json()["log_ok"] is False
        finally:
            os.close(decisions._fd)
            decisions._fd = good
        # the client retries the same events: decided again, logged, answered
        r = client.post("/v1/runs/a/decide", json={"events": turn_events(1)})
        assert r.status_code == 200 and r.json()["turn"] == 2
    rows = lines(tmp_path / "logs" / "decisions.jsonl")
    assert [x["seq"] for x in rows] == [0, 2]  # the unanswered decision has no line


def test_decide_errors_are_the_documented_ones(tmp_path: Path) -> None:
    with make_client(tmp_path, max_body_bytes=2000) as client:
        # not JSON
        r = client.post("/v1/runs/a/decide", content=b"{nope", headers={"content-type": "application/json"})
        assert r.status_code == 422 and r.json()["error"]["issues"][0]["field"].startswith("body")
        # no body
        r = client.post("/v1/runs/a/decide")
        assert r.status_code == 422 and r.json()["error"]["issues"][0]["field"] == "body"
        # not a JSON content type
        r = client.post("/v1/runs/a/decide", content=b"{}", headers={"content-type": "text/plain"})
        assert r.status_code == 422 and "JSON" in r.json()["error"]["issues"][0]["message"]
        # a field wrong, named
        r = client.post("/v1/decide", json={"events": [{"id": "x", "t": "soon", "type": "return"}]})
        assert r.status_code == 422
        assert r.json()["error"]["issues"][0]["field"] == "body.events[0].t"
        # a run id the route refuses: the path parameter is named
        r = client.post("/v1/runs/a%20b/decide", json={"events": []})
        assert r.status_code == 422 and r.json()["error"]["issues"][0]["field"] == "path.run_id"
        # ... and with a bad body too, both are named in one answer (as FastAPI does for its body routes)
        json_type = {"content-type": "application/json"}
        r = client.post("/v1/runs/a%20b/outcome", content=b"{nope", headers=json_type)
        assert [i["field"] for i in r.json()["error"]["issues"]] == ["path.run_id", "body"]
        # over the body limit, streamed or declared
        big = {"events": turn_events(0), "system": "x" * 5000}
        r = client.post("/v1/runs/a/decide", json=big)
        assert r.status_code == 413 and r.json()["error"]["type"] == "payload_too_large"
        # a closed run
        client.post("/v1/runs/c/decide", json={"events": turn_events(0)})
        assert client.post("/v1/runs/c/outcome", json={"rewards": {"team": 1.0}}).status_code == 200
        r = client.post("/v1/runs/c/decide", json={"events": turn_events(1)})
        assert r.status_code == 409 and r.json()["error"]["type"] == "run_closed"
        # and an answer has exactly the documented fields
        r = client.post("/v1/runs/d/decide", json={"events": turn_events(0)})
        spec = client.get("/openapi.json").json()["components"]["schemas"]["DecideResponse"]
        assert r.headers["content-type"] == "application/json"
        assert set(r.json()) == set(spec["properties"])


def test_concurrent_retries_under_group_commit_are_answered_once(tmp_path: Path) -> None:
    with make_client(tmp_path, fsync="always") as client:
        answers = _concurrent_same_call(client, 8)
    assert {a["turn"] for a in answers} == {1}
    assert sorted(a["events_accepted"] for a in answers) == [0] * 7 + [2]
    assert len(lines(tmp_path / "logs" / "decisions.jsonl")) == 1


def _concurrent_same_call(client: TestClient, n: int) -> list[dict[str, Any]]:
    body = {"events": turn_events(0)}
    answers: list[dict[str, Any]] = []
    barrier = threading.Barrier(n)

    def send() -> None:
        barrier.wait()
        answers.append(client.post("/v1/runs/same/decide", json=body).json())

    threads = [threading.Thread(target=send) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def test_each_body_is_documented_as_the_model_its_route_validates(tmp_path: Path) -> None:
    with make_client(tmp_path) as client:
        spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    routes = {
        "/v1/runs/{run_id}/decide": DecideRequest,
        "/v1/decide": StatelessDecideRequest,
        "/v1/decide:batch": BatchDecideRequest,
        "/v1/runs/{run_id}/outcome": OutcomeRequest,
    }
    for path, model in routes.items():
        body = spec["paths"][path]["post"]["requestBody"]
        ref = f"#/components/schemas/{model.__name__}"
        assert body["required"] is True and body["content"]["application/json"]["schema"] == {"$ref": ref}
        fields = {f.alias or name for name, f in model.model_fields.items()}
        assert set(schemas[model.__name__]["properties"]) == fields
    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            refs.extend(v for k, v in node.items() if k == "$ref")
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(spec)
    dangling = [r for r in refs if r.removeprefix("#/components/schemas/") not in schemas]
    assert refs and not dangling, dangling
