"""GET /v1/runs/{run_id}/credit: the core's credit of a live run, errors through the one table."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from credit_models import sim_traces, value_models
from fastapi.testclient import TestClient
from servers import LiveServer

from stopserve.policy import Policy
from stopserve.service.app import create_app
from stopserve.service.engine import CREDIT_ABLATION_LAST_K
from stopserve.settings import Settings
from stopserve.trace import Trace
from stopserve.training.credit import credit_trace


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return value_models(tmp_path_factory.mktemp("credit-service"), sim_traces(160, seed=4))["optimal-per-run"]


@pytest.fixture(scope="module")
def run() -> Trace:
    return next(t for t in sim_traces(20, seed=6) if len(t.events) > 60)


def _events(trace: Trace, lo: int, hi: int) -> list[dict[str, Any]]:
    return [e.dump() for e in trace.events[lo:hi]]


@pytest.fixture
def client(tmp_path: Path, model: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(log_dir=tmp_path / "logs", model_dir=model))) as c:
        yield c


def _post(client: TestClient | httpx.Client, run_id: str, trace: Trace, hi: int, **extra: Any) -> None:
    body = {"events": _events(trace, 0, hi), "topology": trace.topology, **extra}
    r = client.post(f"/v1/runs/{run_id}/decide", json=body)
    assert r.status_code == 200, r.text


def test_credit_of_a_live_run_is_the_cores(client: TestClient, model: Path, run: Trace) -> None:
    _post(client, "run-1", run, 30)
    _post(client, "run-1", run, 50)  # the first 30 again (retries are skipped), then 20 more
    r = client.get("/v1/runs/run-1/credit")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["run_id"] == "run-1" and body["method"] == "td" and body["cost_share"] == 0.3
    so_far = Trace(trace_id="run-1", task_id="t", topology=run.topology, events=run.events[:50])
    expected = credit_trace(Policy.load(model), so_far)
    assert [e["event_id"] for e in body["events"]] == [e.id for e in run.events[:50]]
    assert [e["credit"] for e in body["events"]] == pytest.approx([e.credit for e in expected.events])
    assert [v["v"] for v in body["values"]] == pytest.approx([v.v for v in expected.values])
    # the offline labels the events carried come back beside the credit
    assert any(e["contribution"] is not None for e in body["events"])
    agents = {row["agent"]: row["credit"] for row in body["aggregates"]["agent"]}
    assert set(body["aggregates"]) == {"agent", "role", "type", "agent_type"}
    worker = sum(
        e["credit"] for e in body["events"] if e["agent"] == "orchestrator" and e["credit"] is not None
    )
    assert agents["orchestrator"] == pytest.approx(worker)
    # the run route is still the run route
    assert client.get("/v1/runs/run-1").json()["n_events"] == 50


def test_options_and_the_runs_own_cost_weight(client: TestClient, run: Trace) -> None:
    _post(client, "run-2", run, len(run.events) - 1, **{"lambda": 0.5})
    body = client.get("/v1/runs/run-2/credit").json()
    assert body["lambda"] == 0.5 and body["cost_share"] is None
    assert all(v["price"] == pytest.approx(0.5) for v in body["values"][1:])
    body = client.get("/v1/runs/run-2/credit", params={"cost_share": 0.1}).json()
    assert body["lambda"] is None and body["cost_share"] == 0.1
    r = client.get("/v1/runs/run-2/credit", params={"method": "ablation"})
    assert r.status_code == 200, r.text
    body = r.json()
    n_points = len(body["values"]) - 1
    credited = [e for e in body["events"] if e["credit"] is not None]
    assert credited and all(e["point"] > n_points - CREDIT_ABLATION_LAST_K for e in credited)
    r = client.get("/v1/runs/run-2/credit", params={"method": "ablation", "types": "return", "last_k": 6})
    assert {e["type"] for e in r.json()["events"] if e["credit"] is not None} == {"return"}
    body = client.get("/v1/runs/run-2/credit", params={"window": "reward", "split": "equal"}).json()
    assert body["window"] == "reward" and body["split"] == "equal"


def _error(r: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error: dict[str, Any] = r.json()["error"]
    assert error["type"] == kind
    return error


def test_bad_requests_name_what_is_wrong(client: TestClient, run: Trace) -> None:
    _post(client, "run-3", run, 20)
    _error(client.get("/v1/runs/nobody/credit"), 404, "run_not_found")
    err = _error(client.get("/v1/runs/run-3/credit", params={"method": "shapley"}), 422, "validation_error")
    assert err["issues"][0]["field"] == "query.method"
    err = _error(client.get("/v1/runs/run-3/credit", params={"lambda": -1}), 422, "validation_error")
    assert err["issues"][0]["field"] == "query.lambda"
    err = _error(
        client.get("/v1/runs/run-3/credit", params={"lambda": 0.1, "cost_share": 0.2}), 422, "config_error"
    )
    assert "not both" in err["message"]
    err = _error(
        client.get("/v1/runs/run-3/credit", params={"method": "ablation", "types": "return,mesage"}),
        422,
        "config_error",
    )
    assert "'mesage' is not an event type" in err["message"]
    r = client.post("/v1/runs/run-3/outcome", json={"rewards": {"team": 1.0}})
    assert r.status_code == 200, r.text
    _error(client.get("/v1/runs/run-3/credit"), 409, "run_closed")


def test_without_a_learned_model_credit_says_so(tmp_path: Path, run: Trace) -> None:
    with TestClient(create_app(Settings(log_dir=tmp_path / "logs", no_model=True))) as c:
        _post(c, "run-4", run, 10)
        err = _error(c.get("/v1/runs/run-4/credit"), 422, "model_error")
        assert "learned value" in err["message"]


def test_credit_on_a_real_server(tmp_path: Path, model: Path, run: Trace) -> None:
    with LiveServer(log_dir=tmp_path / "logs", model=model) as server, httpx.Client(base_url=server.url) as c:
        _post(c, "live-1", run, 40)
        r = c.get("/v1/runs/live-1/credit", params={"method": "td", "window": "reward"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["events"]) == 40 and body["window"] == "reward"
        total = sum(e["credit"] for e in body["events"] if e["credit"] is not None)
        assert sum(row["credit"] for row in body["aggregates"]["type"]) == pytest.approx(total)
        _error(c.get("/v1/runs/live-2/credit"), 404, "run_not_found")
