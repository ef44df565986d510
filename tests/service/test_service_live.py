"""Against a REAL uvicorn server on a loopback port: the retraining loop, kill -9, schemathesis."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from servers import LiveServer

from stopserve.trace import Trace, is_decision_point, read_traces

TOKEN = "live-admin-token"

# small real runs, resolved and not, of three repositories (the test streams every turn)
SWE_IDS = (
    "django__django-16255",
    "django__django-11163",
    "django__django-10999",
    "pydata__xarray-4629",
    "django__django-16667",
    "scikit-learn__scikit-learn-12585",
    "django__django-14765",
    "django__django-13410",
)


def swe_traces(swe_dir: Path) -> list[Trace]:
    from stopserve.importers import mini_swe_agent

    files = [swe_dir / "trajs" / f"{i}.traj.json" for i in SWE_IDS]
    files = [f for f in files if f.exists()]
    if len(files) < len(SWE_IDS):
        pytest.skip("expected SWE runs not found in the shared data")
    return list(mini_swe_agent.read(files, results=swe_dir / "results_summary.json"))


def turns(trace: Trace) -> Iterator[list[dict[str, Any]]]:
    """The trace's events cut after each decision point: what an orchestrator sends per turn."""
    chunk: list[dict[str, Any]] = []
    for event in trace.events:
        chunk.append(event.dump())
        if is_decision_point(event):
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def test_the_retraining_loop_end_to_end(tmp_path: Path, swe_dir: Path) -> None:
    """Stream real runs turn by turn, log them, train from the log, hot-reload, decide again."""
    from stopserve.cli import main as cli

    traces = swe_traces(swe_dir)
    logs = tmp_path / "logs"
    env = {"STOPSERVE_ADMIN_TOKEN": TOKEN}
    with (
        LiveServer(log_dir=logs, no_model=True, env=env) as server,
        httpx.Client(base_url=server.url) as http,
    ):
        assert http.get("/v1/model").json()["safety_only"] is True
        answered: dict[str, int] = {}
        for trace in traces:
            rid = trace.trace_id
            first = True
            for chunk in turns(trace):
                body: dict[str, Any] = {"events": chunk}
                if first:
                    body |= {"task_id": trace.task_id, "topology": trace.topology, "system": trace.system}
                    first = False
                r = http.post(f"/v1/runs/{rid}/decide", json=body)
                assert r.status_code == 200, r.text
                d = r.json()
                assert d["action"] in ("continue", "stop") and d["run_id"] == rid
                answered[rid] = answered.get(rid, 0) + 1
            outcome = {
                "rewards": trace.rewards,
                "stop": trace.stop.model_dump(exclude_none=True) if trace.stop else None,
            }
            r = http.post(f"/v1/runs/{rid}/outcome", json=outcome)
            assert r.status_code == 200, r.text
            assert r.json()["n_events"] == len(trace.events)

        # the trace log holds each run as sent, with every decision on its event
        logged = {t.trace_id: t for t in read_traces(logs / "traces.jsonl")}
        assert set(logged) == {t.trace_id for t in traces}
        for trace in traces:
            back = logged[trace.trace_id]
            assert [e.id for e in back.events] == [e.id for e in trace.events]
            assert back.task_id == trace.task_id and back.rewards == trace.rewards
            assert sum(e.decision is not None for e in back.events) == answered[trace.trace_id]
        decisions = [json.loads(x) for x in (logs / "decisions.jsonl").read_text().splitlines()]
        assert len(decisions) == sum(answered.values())

        # train a model from the service's own log (the CLI the users run) ...
        model = tmp_path / "model"
        rc = cli(["train", str(logs / "traces.jsonl"), "-o", str(model), "--folds", "2", "--no-progress"])
        assert rc == 0
        manifest = json.loads((model / "manifest.json").read_text())

        # ... reload it into the running server, and decide again with it
        r = http.post(
            "/v1/admin/reload",
            json={"model_dir": str(model)},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=120,  # the first load imports LightGBM (seconds on a busy machine)
        )
        assert r.status_code == 200, r.text
        assert r.json()["previous_version"] is None
        assert r.json()["model_version"] == manifest["model_version"] is not None
        chunk = next(turns(traces[0]))
        d = http.post("/v1/runs/after-reload/decide", json={"events": chunk}).json()
        assert d["model_version"] == manifest["model_version"]
        assert http.get("/v1/model").json()["model_version"] == manifest["model_version"]


def _load(url: str, worker: int, stop: threading.Event, received: list[tuple[str, str]]) -> None:
    with httpx.Client(base_url=url, timeout=5.0) as http:
        run = 0
        while not stop.is_set():
            rid = f"w{worker}-r{run}"
            for i in range(20):
                events = [
                    {"id": f"c{i}", "t": 2.0 * i, "type": "tool_use", "agent": "a", "tokens": 10},
                    {"id": f"r{i}", "t": 2.0 * i + 1, "type": "return", "agent": "b"},
                ]
                try:
                    r = http.post(f"/v1/runs/{rid}/decide", json={"events": events})
                except httpx.TransportError:
                    return  # the server is gone
                if r.status_code == 200:
                    received.append((rid, f"r{i}"))
                if stop.is_set():
                    return
            run += 1


def test_kill_9_under_load_loses_no_answered_decision(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    server = LiveServer(log_dir=logs, no_model=True).start()
    received: list[tuple[str, str]] = []
    stop = threading.Event()
    workers = [threading.Thread(target=_load, args=(server.url, k, stop, received)) for k in range(4)]
    try:
        for w in workers:
            w.start()
        deadline = time.monotonic() + 30
        while len(received) < 300 and time.monotonic() < deadline:
            time.sleep(0.05)
        server.kill()  # SIGKILL while requests are in flight
    finally:
        stop.set()
        for w in workers:
            w.join(10)
        server.kill()
    assert len(received) >= 300, server.read_output()
    raw = (logs / "decisions.jsonl").read_bytes()
    complete = raw[: raw.rfind(b"\n") + 1]
    logged = {(x["run_id"], x["event_id"]) for x in map(json.loads, complete.splitlines())}
    missing = [pair for pair in received if pair not in logged]
    assert not missing, f"{len(missing)} answered decisions not in the log, e.g. {missing[:3]}"
    # a restart continues the same log, which parses whole
    with LiveServer(log_dir=logs, no_model=True) as again:
        assert httpx.post(again.url + "/v1/runs/after/decide", json={}).status_code == 200
    rows = [json.loads(line) for line in (logs / "decisions.jsonl").read_text().splitlines()]
    assert rows[-1]["run_id"] == "after" and len(rows) >= len(received) + 1


@pytest.fixture(scope="module")
def live_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    logs = tmp_path_factory.mktemp("schemathesis")
    env = {"STOPSERVE_ADMIN_TOKEN": TOKEN, "STOPSERVE_MAX_RUNS": "50"}
    with LiveServer(log_dir=logs, no_model=True, env=env) as server:
        yield schemathesis.openapi.from_url(server.url + "/openapi.json")


def _operations() -> list[str]:
    """Every operation of the app's OpenAPI schema, as ``METHOD path`` (one test each)."""
    from stopserve.service.app import create_app
    from stopserve.settings import Settings

    paths = create_app(Settings(no_model=True)).openapi()["paths"]
    return sorted(f"{method.upper()} {path}" for path, ops in paths.items() for method in ops)


# schemathesis drives hypothesis directly (not through its pytest plugin, which breaks on new pytest)
@pytest.mark.parametrize("operation", _operations())
def test_no_5xx_for_any_request_the_schema_allows(live_schema: Any, operation: str) -> None:
    method, path = operation.split(" ", 1)
    strategy = live_schema[path][method].as_strategy()

    @settings(
        max_examples=10,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    @given(case=strategy)
    def check(case: Any) -> None:
        response = case.call(timeout=10)
        assert response.status_code < 500, (
            f"{case.method} {case.formatted_path}: {response.status_code} {response.text}"
        )
        if response.status_code >= 400:
            assert "error" in response.json(), response.text

    check()
