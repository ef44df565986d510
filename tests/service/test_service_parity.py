"""Train/serve parity: the trainer sees, at every decision point, the features the service decided on.

Random traces go through the REAL service (``stopserve serve`` with the shipped model, on
loopback) in random chunks, as an orchestrator would send them. After each call the run's
features are read back (``GET /v1/runs/{id}``: the state the decision was just made on; no
event is folded in between). The service's ``traces.jsonl`` is then read back and
``build_decision_points`` (the trainer's featurizer) folds it; its row at every decision
point where a call ended must equal what the service saw, feature for feature, bit for bit.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import LiveServer

from stopserve.features import FEATURE_NAMES, RunState
from stopserve.trace import TOPOLOGIES, is_decision_point, read_traces
from stopserve.training.labels import build_decision_points, fold_events
from stopserve.training.simulate import simulate

TYPES = ("spawn", "delegate", "communicate", "tool_use", "return", "aggregate", "reward", "stop")
WEIGHTS = (1, 3, 3, 8, 6, 2, 2, 1)


def random_trace(rng: random.Random, i: int) -> dict[str, Any]:
    """A format-v1 trace with random agents, tools, refs (some repeating), costs, errors and rewards."""
    events: list[dict[str, Any]] = []
    t = 0.0
    for k in range(rng.randint(1, 40)):
        t += rng.choice((0.0, rng.random() * 5, rng.random() * 60))
        kind = rng.choices(TYPES, WEIGHTS)[0]
        ev: dict[str, Any] = {"id": f"x{k}", "t": round(t, 3), "type": kind, "agent": rng.choice("abc")}
        if kind in ("tool_use", "return"):
            ev["tool"] = rng.choice(("bash", "search", "python"))
        if kind in ("delegate", "communicate", "return") and rng.random() < 0.7:
            ev["to"] = rng.choice(("orchestrator", "a", "b"))
        if kind != "spawn" and rng.random() < 0.8:
            ev["content_ref"] = f"sha256:{rng.randrange(6):016x}"  # few refs: repeats and loops
        if rng.random() < 0.7:
            ev["tokens"] = rng.randrange(2000)
        if rng.random() < 0.4:
            ev["usd"] = round(rng.random() / 100, 6)
        if kind in ("tool_use", "return") and rng.random() < 0.3:
            ev["error"] = True
        if kind == "reward":
            ev["value"] = round(rng.random(), 3)
            ev["channel"] = rng.choice(("quality", "tests", None))
        if kind == "stop":
            ev.update(reason="information_complete", proposed=True)
        events.append({k: v for k, v in ev.items() if v is not None})
    trace: dict[str, Any] = {
        "trace_id": f"rand-{i}",
        "task_id": f"task-{i % 5}",
        "events": events,
        "rewards": {"team": float(rng.random() < 0.5)},
    }
    if rng.random() < 0.7:
        trace["topology"] = rng.choice(TOPOLOGIES)
    if rng.random() < 0.6:
        trace["budget"] = {"max_turns": rng.randint(5, 60), "max_tokens": rng.randint(5_000, 50_000)}
    return trace


def traces_to_send() -> list[dict[str, Any]]:
    rng = random.Random(17)
    out = [random_trace(rng, i) for i in range(30)]
    for trace in simulate(12, seed=3):  # every simulated topology, real-looking costs and loops
        trace["trace_id"] = "sim-" + trace["trace_id"]
        trace["events"] = [{k: v for k, v in e.items() if k != "grade"} for e in trace["events"]]
        out.append(trace)
    return out


def chunks(rng: random.Random, n: int) -> Iterator[tuple[int, int]]:
    """Random ``[start, end)`` cuts of ``range(n)``: one event to the whole run in one call."""
    start = 0
    while start < n:
        end = min(n, start + rng.choice((1, 1, 2, 3, 5, 8, 40)))
        yield start, end
        start = end


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[tuple[str, int], list[Any]], Path]:
    """Send every trace through the real service; the features it decided on at each call's end."""
    log_dir = tmp_path_factory.mktemp("parity")
    seen: dict[tuple[str, int], list[Any]] = {}
    rng = random.Random(5)
    with LiveServer(log_dir=log_dir) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        for trace in traces_to_send():
            run_id, events = trace["trace_id"], trace["events"]
            first = {k: trace[k] for k in ("budget", "topology", "task_id") if k in trace}
            for start, end in chunks(rng, len(events)):
                body = {"events": events[start:end], **(first if start == 0 else {})}
                r = http.post(f"/v1/runs/{run_id}/decide", json=body)
                assert r.status_code == 200, r.text
                info = http.get(f"/v1/runs/{run_id}")
                assert info.status_code == 200, info.text
                features = info.json()["features"]
                seen[(run_id, end - 1)] = [features[name] for name in FEATURE_NAMES]
            r = http.post(f"/v1/runs/{run_id}/outcome", json={"rewards": trace["rewards"]})
            assert r.status_code == 200, r.text
    return seen, log_dir / "traces.jsonl"


def test_the_trainer_folds_what_the_service_decided_on(
    served: tuple[dict[tuple[str, int], list[Any]], Path],
) -> None:
    seen, log = served
    logged = list(read_traces(log))
    sent = traces_to_send()
    assert [t.trace_id for t in logged] == [t["trace_id"] for t in sent]
    for trace, original in zip(logged, sent, strict=True):
        assert [e.id for e in trace.events] == [e["id"] for e in original["events"]]
    dp = build_decision_points(logged, cost_unit="ktokens")
    compared = 0
    for ti, trace in enumerate(logged):
        rows = iter(range(int(dp.offsets[ti]), int(dp.offsets[ti + 1])))
        state = RunState(topology=trace.topology, budget=trace.budget)
        for k, (_, is_row) in enumerate(fold_events(trace, state)):
            row = next(rows) if is_row else None
            service = seen.get((trace.trace_id, k))
            if row is None or service is None:
                continue  # a call ended between decision points, or a row no call ended at
            trainer = dp.X[row]
            for name, ours, theirs in zip(FEATURE_NAMES, trainer, service, strict=True):
                if theirs is None:  # the service reports a non-finite feature as null
                    assert not math.isfinite(ours), (trace.trace_id, k, name, ours)
                else:
                    assert ours == theirs, (trace.trace_id, k, name, ours, theirs)
            compared += 1
        assert next(rows, None) is None
    n_rows_called = sum(
        1
        for trace in logged
        for k, e in enumerate(trace.events)
        if (trace.trace_id, k) in seen and is_decision_point(e)
    )
    assert compared >= n_rows_called > 100  # every call that ended at a decision point, and many
