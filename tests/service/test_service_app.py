"""The service in process (TestClient runs the real app, lifespan included)."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _service_models import tiny_model
from fastapi.testclient import TestClient
from servers import free_port

from stopserve.service.app import create_app
from stopserve.settings import Settings
from stopserve.trace import read_traces

TOKEN = "s3cret-token"


def ev(i: int, kind: str = "return", **extra: Any) -> dict[str, Any]:
    return {"id": f"e{i}", "t": float(i), "type": kind, "agent": "coder", "tokens": 100, **extra}


def turn_events(i: int) -> list[dict[str, Any]]:
    """One turn: a tool call and its result (a decision point)."""
    return [
        {
            "id": f"c{i}",
            "t": 2.0 * i,
            "type": "tool_use",
            "agent": "coder",
            "tokens": 50,
            "content_ref": f"cmd{i}",
        },
        {"id": f"r{i}", "t": 2.0 * i + 1, "type": "return", "agent": "bash", "content_ref": f"out{i}"},
    ]


def make_client(tmp_path: Path, **kw: Any) -> TestClient:
    kw.setdefault("log_dir", tmp_path / "logs")
    kw.setdefault("no_model", "model_dir" not in kw)
    return TestClient(create_app(Settings(**kw)))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with make_client(tmp_path, admin_token=TOKEN) as c:
        yield c


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_decide_creates_run_counts_turns_and_logs_before_answering(
    client: TestClient, tmp_path: Path
) -> None:
    for i in range(3):
        r = client.post("/v1/runs/run-1/decide", json={"events": turn_events(i)})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["run_id"] == "run-1"
        assert body["turn"] == i + 1
        assert body["action"] == "continue"
        assert body["propensity"] == 1.0
        logged = lines(tmp_path / "logs" / "decisions.jsonl")
        # the line is on disk by the time the answer arrives
        assert len(logged) == i + 1
        assert logged[-1]["run_id"] == "run-1" and logged[-1]["event_id"] == f"r{i}"
    info = client.get("/v1/runs/run-1").json()
    assert info["n_events"] == 6 and info["turn"] == 3 and info["n_decisions"] == 3
    assert info["tokens"] == 150
    assert set(info["features"]) and all(v is None or isinstance(v, float) for v in info["features"].values())


def test_retry_with_seen_events_is_idempotent(client: TestClient, tmp_path: Path) -> None:
    first = client.post("/v1/runs/r/decide", json={"events": turn_events(0)}).json()
    again = client.post("/v1/runs/r/decide", json={"events": turn_events(0)}).json()
    assert again["events_ignored"] == 2 and again["events_accepted"] == 0
    assert again["turn"] == first["turn"] == 1
    assert len(lines(tmp_path / "logs" / "decisions.jsonl")) == 1
    # a partial overlap folds only the new events
    mixed = client.post("/v1/runs/r/decide", json={"events": turn_events(0) + turn_events(1)}).json()
    assert mixed["events_accepted"] == 2 and mixed["events_ignored"] == 2 and mixed["turn"] == 2
    # a proposed stop with no new event is a new question, not a retry
    proposed = client.post("/v1/runs/r/decide", json={"events": turn_events(1), "proposed_stop": True}).json()
    assert proposed["action"] == "stop" and proposed["events_ignored"] == 2
    assert len(lines(tmp_path / "logs" / "decisions.jsonl")) == 3


def test_safety_net_stops_and_outcome_writes_a_v1_trace(client: TestClient, tmp_path: Path) -> None:
    body = {"events": turn_events(0), "budget": {"max_turns": 2}, "task_id": "task-9", "topology": "harness"}
    assert client.post("/v1/runs/run-7/decide", json=body).json()["action"] == "continue"
    stop = client.post("/v1/runs/run-7/decide", json={"events": turn_events(1)}).json()
    assert stop["action"] == "stop" and stop["finalize"] is True
    assert stop["reason"] == "budget_exhausted" and stop["limit"] == "turns" and stop["safety_net"]
    out = client.post("/v1/runs/run-7/outcome", json={"rewards": {"team": 1.0}})
    assert out.status_code == 200, out.text
    assert out.json()["n_events"] == 4 and out.json()["n_decisions"] == 2
    traces = list(read_traces(tmp_path / "logs" / "traces.jsonl"))
    assert len(traces) == 1
    t = traces[0]
    assert t.trace_id == "run-7" and t.task_id == "task-9" and t.topology == "harness"
    assert t.rewards == {"team": 1.0}
    assert t.budget is not None and t.budget.max_turns == 2
    assert t.stop is not None and t.stop.reason == "budget_exhausted" and t.stop.by == "safety_net"
    decided = [(e.id, e.decision.action) for e in t.events if e.decision is not None]
    assert decided == [("r0", "continue"), ("r1", "stop")]
    # closed: further calls are refused with 409, and the run is gone
    again = client.post("/v1/runs/run-7/decide", json={"events": turn_events(2)})
    assert again.status_code == 409 and again.json()["error"]["type"] == "run_closed"
    assert client.post("/v1/runs/run-7/outcome", json={"rewards": {"team": 1}}).status_code == 409


def test_sketches_are_taken_kept_in_the_trace_and_a_bad_one_named(client: TestClient, tmp_path: Path) -> None:
    from stopserve.signals.sketch import sketch

    wire = sketch("FAILED tests/test_x.py::test_y at 10:00:01")
    r = client.post("/v1/runs/sk/decide", json={"events": [ev(0, sketch=wire)]})
    assert r.status_code == 200, r.text
    bad = client.post("/v1/runs/sk/decide", json={"events": [ev(1, sketch="mh1:zz")]})
    assert bad.status_code == 422
    issue = bad.json()["error"]["issues"][0]
    assert issue["field"] == "body.events[0].sketch" and "128 hex digits" in issue["message"]
    assert client.post("/v1/runs/sk/outcome", json={"rewards": {"team": 1.0}}).status_code == 200
    (trace,) = [t for t in read_traces(tmp_path / "logs" / "traces.jsonl") if t.trace_id == "sk"]
    assert [e.sketch for e in trace.events] == [wire]


def test_progress_is_taken_and_logged_with_its_event(client: TestClient, tmp_path: Path) -> None:
    events = turn_events(0)
    events[1]["progress"] = {"tests_passed": 3, "tests_failed": 1, "exit_code": 1, "source": "pytest"}
    assert client.post("/v1/runs/p/decide", json={"events": events}).status_code == 200
    assert client.post("/v1/runs/p/outcome", json={"rewards": {"team": 0.0}}).status_code == 200
    (trace,) = read_traces(tmp_path / "logs" / "traces.jsonl")
    assert trace.events[1].dump()["progress"] == events[1]["progress"]
    assert trace.events[0].progress is None


def test_outcome_of_unknown_run_and_empty_run(client: TestClient) -> None:
    r = client.post("/v1/runs/nope/outcome", json={"rewards": {"team": 0}})
    assert r.status_code == 404 and "nope" in r.json()["error"]["message"]
    client.post("/v1/runs/empty/decide", json={})
    r = client.post("/v1/runs/empty/outcome", json={"rewards": {"team": 0}})
    assert r.status_code == 422
    assert r.json()["error"]["issues"][0]["field"] == "events"


def test_events_out_of_time_order_are_refused_whole(client: TestClient) -> None:
    client.post("/v1/runs/r/decide", json={"events": [ev(5)]})
    r = client.post("/v1/runs/r/decide", json={"events": [ev(6), ev(3)]})
    assert r.status_code == 422
    issue = r.json()["error"]["issues"][0]
    assert issue["field"] == "events[1].t" and "backwards" in issue["message"]
    # nothing of the bad batch was folded
    assert client.get("/v1/runs/r").json()["n_events"] == 1


def test_bad_requests_name_the_field(client: TestClient) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"events": [{"id": "a", "t": 0, "type": "spwan", "agent": "x"}]}, "body.events[0].type"),
        ({"events": [{"id": "a", "t": -1, "type": "return", "agent": "x"}]}, "body.events[0].t"),
        ({"events": [], "lambda": -1}, "body.lambda"),
        ({"events": [], "budget": {"max_turns": "many"}}, "body.budget.max_turns"),
        ({"events": [], "surprise": 1}, "body.surprise"),
        ({"events": [{"id": "a", "t": 0, "type": "reward", "agent": "x"}]}, "body.events[0]"),
        ({"events": [ev(0, progress={"tests_failed": -2})]}, "body.events[0].progress.tests_failed"),
        ({"events": [ev(0, progress={"in_loop": "maybe"})]}, "body.events[0].progress.in_loop"),
        ({"events": [ev(0, progress={"stuck": True})]}, "body.events[0].progress.stuck"),
    ]
    for body, field in cases:
        r = client.post("/v1/runs/r/decide", json=body)
        assert r.status_code == 422, (body, r.text)
        err = r.json()["error"]
        assert err["type"] == "validation_error"
        assert any(i["field"] == field for i in err["issues"]), (field, err)
    r = client.post("/v1/runs/r/decide", json={"events": [], "safety": {"max_turns": -3}})
    assert r.status_code == 422 and r.json()["error"]["issues"][0]["field"] == "safety.max_turns"
    r = client.post("/v1/runs/r/decide", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["type"] == "validation_error"
    r = client.post("/v1/runs/bad%20id/decide", json={})
    assert r.status_code == 422 and r.json()["error"]["issues"][0]["field"] == "path.run_id"
    assert client.get("/v1/nothing").json()["error"]["type"] == "not_found"
    assert client.put("/v1/model").status_code == 405


def test_survey_event_types_are_accepted(client: TestClient, survey_dir: Path) -> None:
    example = json.loads((survey_dir / "example_trace.json").read_text())
    events = example["events"] if isinstance(example, dict) else example[0]["events"]
    r = client.post("/v1/runs/survey/decide", json={"events": events})
    assert r.status_code == 200, r.text
    assert r.json()["events_accepted"] == len(events)


def test_limits(tmp_path: Path) -> None:
    with make_client(tmp_path, max_events_per_request=3, max_events_per_run=5, max_body_bytes=4096) as c:
        r = c.post("/v1/runs/r/decide", json={"events": [ev(i) for i in range(4)]})
        assert r.status_code == 413 and r.json()["error"]["issues"][0]["field"] == "events"
        assert c.post("/v1/runs/r/decide", json={"events": [ev(i) for i in range(3)]}).status_code == 200
        r = c.post("/v1/runs/r/decide", json={"events": [ev(i) for i in range(3, 6)]})
        assert r.status_code == 413 and "5 events" in r.json()["error"]["message"]
        big = {"events": [ev(0, content_ref="x" * 5000)]}
        r = c.post("/v1/runs/r2/decide", json=big)
        assert r.status_code == 413 and r.json()["error"]["type"] == "payload_too_large"

        def chunks() -> Iterator[bytes]:  # no content-length: counted as it streams
            yield from (b" " * 1000 for _ in range(10))

        r = c.post("/v1/decide", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["type"] == "payload_too_large"


def test_lru_eviction_and_idle_ttl(tmp_path: Path) -> None:
    with make_client(tmp_path, max_runs=2) as c:
        for rid in ("a", "b", "c"):
            assert c.post(f"/v1/runs/{rid}/decide", json={"events": [ev(0)]}).status_code == 200
        a = c.get("/v1/runs/a")  # the least recently used went, and the service says so
        assert a.status_code == 409 and a.json()["error"]["type"] == "run_evicted"
        assert c.get("/v1/runs/b").status_code == 200
        assert 'stopserve_evictions_total{cause="lru"} 1.0' in c.get("/metrics").text
    with make_client(tmp_path, run_ttl_s=0.05) as c:
        c.post("/v1/runs/idle/decide", json={"events": [ev(0)]})
        threading.Event().wait(0.2)
        r = c.get("/v1/runs/idle")
        assert r.status_code == 409 and r.json()["error"]["type"] == "run_evicted"


def test_delete(client: TestClient) -> None:
    client.post("/v1/runs/d/decide", json={"events": [ev(0)]})
    assert client.delete("/v1/runs/d").status_code == 204
    assert client.get("/v1/runs/d").status_code == 404
    assert client.delete("/v1/runs/d").status_code == 404


def test_stateless_and_batch(client: TestClient, tmp_path: Path) -> None:
    events = turn_events(0) + turn_events(1)
    r = client.post("/v1/decide", json={"events": events, "budget": {"max_turns": 2}, "run_id": "mine"})
    assert r.status_code == 200 and r.json()["action"] == "stop" and r.json()["run_id"] == "mine"
    assert client.get("/v1/runs/mine").status_code == 404  # nothing stored
    dup = client.post("/v1/decide", json={"events": [ev(0), ev(0)]})
    assert dup.status_code == 422 and dup.json()["error"]["issues"][0]["field"] == "events[1].id"
    batch = {
        "runs": [
            {"run_id": "b1", "events": turn_events(0)},
            {"run_id": "b2", "events": turn_events(0), "safety": {"max_turns": "x"}},
            {"run_id": "b1", "events": turn_events(1)},
        ]
    }
    r = client.post("/v1/decide:batch", json=batch)
    assert r.status_code == 200, r.text
    res = r.json()["results"]
    assert [x["run_id"] for x in res] == ["b1", "b2", "b1"]
    assert res[0]["decision"]["turn"] == 1 and res[2]["decision"]["turn"] == 2
    assert res[1]["decision"] is None and res[1]["error"]["issues"][0]["field"] == "runs[1].safety.max_turns"
    stateless = [x for x in lines(tmp_path / "logs" / "decisions.jsonl") if x.get("stateless")]
    assert len(stateless) == 1


def test_admin_reload_auth_refusal_and_swap(tmp_path: Path, model_dir: Path) -> None:
    with make_client(tmp_path, model_dir=model_dir) as c:
        assert c.post("/v1/admin/reload").status_code == 401  # no token set: disabled
        assert "disabled" in c.post("/v1/admin/reload").json()["error"]["message"]
    other = tiny_model(tmp_path / "other", "tiny-go", stop_bias=-0.4)
    with make_client(tmp_path, model_dir=model_dir, admin_token=TOKEN) as c:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert c.get("/v1/model").json()["model_version"] == "tiny-stop"
        first = c.post("/v1/runs/m/decide", json={"events": turn_events(0)}).json()
        assert first["action"] == "stop" and first["reason"] == "no_progress" and first["v_stop"] < 0
        r = c.post(
            "/v1/admin/reload", json={"model_dir": str(other)}, headers={"Authorization": "Bearer nope"}
        )
        assert r.status_code == 401
        # a tampered model is refused; the old one keeps serving
        bad = tmp_path / "bad"
        shutil.copytree(other, bad)
        (bad / "g.txt").write_text((bad / "g.txt").read_text().replace("Tree=0", "Tree=0\n", 1))
        r = c.post("/v1/admin/reload", json={"model_dir": str(bad)}, headers=auth)
        assert r.status_code == 422 and "sha256" in r.json()["error"]["message"]
        assert c.get("/v1/model").json()["model_version"] == "tiny-stop"
        r = c.post("/v1/admin/reload", json={"model_dir": str(other)}, headers=auth)
        assert r.status_code == 200, r.text
        assert r.json() == {
            "previous_version": "tiny-stop",
            "model_version": "tiny-go",
            "kind": "model",
            "path": str(other),
        }
        after = c.post("/v1/runs/m2/decide", json={"events": turn_events(0)}).json()
        assert after["model_version"] == "tiny-go" and after["action"] == "continue"
        assert 'stopserve_model_info{kind="model",version="tiny-go"} 1.0' in c.get("/metrics").text
        info = c.get("/v1/model").json()
        assert info["kind"] == "model" and info["model_card"] and not info["safety_only"]


def test_exploration_logs_propensity(tmp_path: Path, model_dir: Path) -> None:
    with make_client(tmp_path, model_dir=model_dir, epsilon=0.5, seed=3) as c:
        answers = [c.post(f"/v1/runs/x{i}/decide", json={"events": turn_events(0)}).json() for i in range(40)]
    actions = {a["action"] for a in answers}
    assert actions == {"stop", "continue"}  # the model always says stop; exploration flips some
    assert all(a["propensity"] == 0.5 for a in answers)
    logged = lines(tmp_path / "logs" / "decisions.jsonl")
    assert [x["propensity"] for x in logged] == [0.5] * 40


def test_safety_only_mode_says_so(client: TestClient) -> None:
    model = client.get("/v1/model").json()
    assert model["kind"] == "none" and model["safety_only"] is True and model["model_version"] is None
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["safety_only"] is True
    assert client.get("/healthz").json() == {"status": "ok"}


def test_metrics_count_decisions_by_action_and_reason(client: TestClient) -> None:
    client.post("/v1/runs/m/decide", json={"events": turn_events(0), "budget": {"max_turns": 1}})
    text = client.get("/metrics").text
    assert 'stopserve_decisions_total{action="stop",reason="budget_exhausted"' in text
    assert "stopserve_decide_seconds_count 1.0" in text
    assert "stopserve_live_runs 1.0" in text
    assert "stopserve_log_write_errors_total 0.0" in text


def test_restart_continues_the_log(tmp_path: Path) -> None:
    for run in ("first", "second"):
        with make_client(tmp_path) as c:
            c.post(f"/v1/runs/{run}/decide", json={"events": turn_events(0)})
    assert [x["run_id"] for x in lines(tmp_path / "logs" / "decisions.jsonl")] == ["first", "second"]


def test_openapi_documents_examples_and_error_body(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    for path in ("/v1/runs/{run_id}/decide", "/v1/decide", "/v1/decide:batch", "/v1/runs/{run_id}/outcome"):
        assert "post" in paths[path]
        assert "422" in paths[path]["post"]["responses"]
    assert spec["components"]["schemas"]["DecideRequest"]["examples"]
    assert "ErrorBody" in spec["components"]["schemas"]


def test_serve_command_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from stopserve.cli import main

    # a port of its own: serve checks its port first, and 8080 may be anyone's
    port = str(free_port())
    missing = ["--model", str(tmp_path / "missing"), "--log-dir", str(tmp_path)]
    assert main(["serve", *missing, "--port", port]) == 2
    err = capsys.readouterr().err
    assert "no such model directory" in err and "Traceback" not in err
    monkeypatch.setenv("STOPSERVE_FSYNC", "sometimes")
    assert main(["serve", "--no-model", "--port", port]) == 2
    err = capsys.readouterr().err
    assert "STOPSERVE_FSYNC" in err and "Traceback" not in err


def test_concurrent_retries_of_one_run_are_serialized(client: TestClient, tmp_path: Path) -> None:
    body = {"events": turn_events(0)}
    answers: list[dict[str, Any]] = []
    barrier = threading.Barrier(8)

    def send() -> None:
        barrier.wait()
        answers.append(client.post("/v1/runs/same/decide", json=body).json())

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 8 and {a["turn"] for a in answers} == {1}
    assert sorted(a["events_accepted"] for a in answers) == [0] * 7 + [2]
    assert len(lines(tmp_path / "logs" / "decisions.jsonl")) == 1


def test_the_wrong_method_on_a_post_route_is_405_not_a_run_id_error(client: TestClient) -> None:
    for path in ("/v1/runs/x/decide", "/v1/runs/x/outcome"):
        for method in ("GET", "DELETE", "PUT"):
            r = client.request(method, path)
            assert r.status_code == 405, (method, path, r.text)
            assert r.json()["error"]["type"] == "method_not_allowed" and "POST" in r.headers["allow"]
    assert client.get("/v1/runs/x").json()["error"]["type"] == "run_not_found"
    assert client.get("/v1/runs/x/credit").status_code == 404
    assert client.get("/v1/runs/a%2Fb").status_code == 422  # an id with a slash is still refused
    paths = client.get("/openapi.json").json()["paths"]
    assert set(paths["/v1/runs/{run_id}/decide"]) == {"post"}


def test_metrics_count_rejected_requests_by_status(tmp_path: Path) -> None:
    def rejected(c: TestClient) -> dict[str, float]:
        counts: dict[str, float] = {}
        for line in c.get("/metrics").text.splitlines():
            if line.startswith("stopserve_rejected_requests_total{"):
                status = line.split('status="')[1].split('"')[0]
                counts[status] = float(line.rsplit(" ", 1)[1])
        return counts

    with make_client(tmp_path, max_body_bytes=2048) as c:
        assert rejected(c) == {}
        c.post("/v1/runs/r1/decide", json={"events": turn_events(0)})
        assert c.post("/v1/runs/r1/outcome", json={"rewards": {"team": 1.0}}).status_code == 200
        assert c.post("/v1/runs/r1/decide", json={"events": turn_events(1)}).status_code == 409  # closed
        assert c.post("/v1/runs/r2/decide", content=b"x" * 5000).status_code == 413  # too large
        assert c.post("/v1/runs/r2/decide", json={"events": [{"id": "a"}]}).status_code == 422
        assert c.get("/v1/runs/x/decide").status_code == 405
        assert c.get("/v1/runs/nobody").status_code == 404
        assert rejected(c) == {"409": 1.0, "413": 1.0, "422": 1.0, "405": 1.0, "404": 1.0}
