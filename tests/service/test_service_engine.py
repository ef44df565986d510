"""The engine without HTTP: runs, retries, limits, outcomes, evictions, batches and model swaps.

Plain Python calls on :class:`stopserve.service.engine.Engine` (its docstring's promise): no
FastAPI, no server; the logs are real files in ``tmp_path``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from _service_models import tiny_model

from stopserve.api import (
    BatchDecideRequest,
    BatchDecideResponse,
    DecideRequest,
    DecideResponse,
    OutcomeRequest,
    StatelessDecideRequest,
)
from stopserve.errors import (
    ConfigError,
    ModelNotFoundError,
    RunClosedError,
    RunEvictedError,
    RunLimitError,
    RunNotFoundError,
    TraceValidationError,
)
from stopserve.service.engine import Engine
from stopserve.service.metrics import Metrics
from stopserve.settings import Settings
from stopserve.trace import read_traces


def engine_for(tmp_path: Path, **settings: Any) -> Engine:
    options: dict[str, Any] = {"log_dir": tmp_path / "logs", "no_model": True, "fsync": "always"}
    options.update(settings)
    engine = Engine(Settings(**options), Metrics())
    engine.start()
    return engine


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = engine_for(tmp_path, safety={"max_turns": 3, "min_turns": 0})
    try:
        yield eng
    finally:
        eng.close()


def events(start: int, n: int, *, t0: float | None = None) -> list[dict[str, Any]]:
    """``n`` tool_use/return pairs from pair ``start`` on (ids e<i>u, e<i>r; one turn each)."""
    out: list[dict[str, Any]] = []
    for i in range(start, start + n):
        t = float(i) if t0 is None else t0
        out.append({"id": f"e{i}u", "t": t, "type": "tool_use", "agent": "a", "tool": "bash"})
        out.append({"id": f"e{i}r", "t": t, "type": "return", "agent": "a", "tool": "bash"})
    return out


def decide(engine: Engine, run_id: str, evs: list[dict[str, Any]], **body: Any) -> DecideResponse:
    answer = asyncio.run(engine.decide(run_id, DecideRequest.model_validate({"events": evs, **body})))
    return DecideResponse.model_validate(answer)


def logged(engine: Engine, name: str) -> list[dict[str, Any]]:
    path = Path(engine.settings.log_dir or "") / name
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def test_decide_folds_and_a_retry_gets_the_same_answer_logged_once(engine: Engine) -> None:
    first = decide(engine, "r1", events(0, 1))
    assert (first.turn, first.action, first.events_accepted, first.events_ignored) == (1, "continue", 2, 0)
    again = decide(engine, "r1", events(0, 1))  # the caller retries the same call
    assert (again.turn, again.action, again.events_accepted, again.events_ignored) == (1, "continue", 0, 2)
    third = decide(engine, "r1", events(0, 3))  # the old events and two new pairs
    assert (third.turn, third.events_accepted, third.events_ignored) == (3, 4, 2)
    assert (third.action, third.safety_net, third.limit) == ("stop", "max_turns", "turns")
    records = logged(engine, "decisions.jsonl")
    assert [(r["run_id"], r["seq"], r["n_events"]) for r in records] == [("r1", 0, 2), ("r1", 1, 6)]


def test_a_bad_call_changes_nothing(engine: Engine) -> None:
    decide(engine, "r2", events(5, 1))
    with pytest.raises(TraceValidationError) as err:
        decide(engine, "r2", [*events(6, 1), *events(7, 1, t0=1.0)])  # the second pair goes back in time
    assert [i.path for i in err.value.issues] == ["events[2].t"]
    with pytest.raises(ConfigError) as bad:
        decide(engine, "r2", events(6, 1), safety={"max_turns": "many"})
    assert [i.path for i in bad.value.issues] == ["safety.max_turns"]
    info = engine.run_info("r2")
    assert (info.n_events, info.turn, info.n_decisions) == (2, 1, 1)  # all or nothing


def test_limits_are_checked_before_folding(tmp_path: Path) -> None:
    eng = engine_for(tmp_path, max_events_per_request=4, max_events_per_run=6)
    try:
        with pytest.raises(RunLimitError) as err:
            decide(eng, "big", events(0, 3))
        assert [i.path for i in err.value.issues] == ["events"]
        decide(eng, "big", events(0, 2))
        with pytest.raises(RunLimitError):
            decide(eng, "big", events(2, 2))  # 8 events in the run: over 6
        assert eng.run_info("big").n_events == 4
    finally:
        eng.close()


def test_outcome_logs_a_valid_trace_and_closes_the_run(engine: Engine) -> None:
    decide(engine, "r3", events(0, 1), task_id="task-3")
    decide(engine, "r3", events(1, 2))  # the third turn: the nets stop it
    done = engine.outcome("r3", OutcomeRequest.model_validate({"rewards": {"team": 1.0}}))
    assert (done.n_events, done.n_decisions) == (6, 2)
    (trace,) = read_traces(Path(done.trace_log or ""))
    assert (trace.trace_id, trace.task_id, len(trace.events)) == ("r3", "task-3", 6)
    assert trace.stop is not None and (trace.stop.by, trace.stop.limit) == ("safety_net", "turns")
    assert [e.decision.action for e in trace.events if e.decision is not None] == ["continue", "stop"]
    with pytest.raises(RunClosedError):
        decide(engine, "r3", events(3, 1))
    with pytest.raises(RunClosedError):
        engine.outcome("r3", OutcomeRequest.model_validate({"rewards": {"team": 1.0}}))
    with pytest.raises(RunNotFoundError):
        engine.run_info("never")
    with pytest.raises(RunNotFoundError):
        engine.delete("never")


def test_an_evicted_run_is_refused_until_it_is_sent_whole(tmp_path: Path) -> None:
    eng = engine_for(tmp_path, max_runs=1)
    try:
        decide(eng, "old", events(0, 2))
        decide(eng, "new", events(0, 1))  # the store holds one run: "old" goes
        with pytest.raises(RunEvictedError) as err:
            decide(eng, "old", events(2, 1), prior_events=4)
        assert "STOPSERVE_MAX_RUNS" in err.value.message
        assert [i.path for i in err.value.issues] == ["prior_events"]
        # the caller sends the whole run again: it resumes at its real turn
        again = decide(eng, "old", events(0, 3), prior_events=0)
        assert (again.turn, again.events_accepted) == (3, 6)
    finally:
        eng.close()


def test_a_batch_answers_each_run_in_its_slot(engine: Engine) -> None:
    decide(engine, "closed", events(0, 1))
    engine.outcome("closed", OutcomeRequest.model_validate({"rewards": {"team": 0.0}}))
    batch = BatchDecideRequest.model_validate(
        {
            "runs": [
                {"run_id": "b1", "events": events(0, 1)},
                {"run_id": "closed", "events": events(1, 1)},
                {"run_id": "b2", "events": events(0, 1), "safety": {"max_turns": -1}},
            ]
        }
    )
    results = BatchDecideResponse.model_validate(asyncio.run(engine.decide_batch(batch))).results
    assert results[0].decision is not None and results[0].decision.turn == 1 and results[0].error is None
    closed = results[1].error
    assert closed is not None and (closed.type, closed.status) == ("run_closed", 409)
    assert [i.field for i in closed.issues] == ["runs[1]"]  # an error without issues still names its slot
    bad = results[2].error
    assert bad is not None and bad.type == "config_error"
    assert [i.field for i in bad.issues] == ["runs[2].safety.max_turns"]
    # the same batch sent again: b1's events are already seen, the other two fail the same way
    again = asyncio.run(engine.decide_batch(batch))["results"]
    assert (again[0]["decision"]["turn"], again[0]["decision"]["events_ignored"]) == (1, 2)
    assert again[1]["error"]["type"] == "run_closed" and again[2]["error"]["type"] == "config_error"


def test_stateless_decides_without_keeping_the_run(engine: Engine) -> None:
    req = StatelessDecideRequest.model_validate({"events": events(0, 3), "run_id": "s1"})
    answer = asyncio.run(engine.decide_stateless(req))
    assert (answer["run_id"], answer["turn"], answer["action"]) == ("s1", 3, "stop")
    assert asyncio.run(engine.decide_stateless(req))["turn"] == 3  # nothing kept: the same answer again
    with pytest.raises(RunNotFoundError):
        engine.run_info("s1")
    dup = StatelessDecideRequest.model_validate({"events": [*events(0, 1), *events(0, 1)]})
    with pytest.raises(TraceValidationError):
        asyncio.run(engine.decide_stateless(dup))


def test_a_failed_reload_keeps_the_model_served(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "model", "tiny-1", stop_bias=0.4)
    eng = engine_for(tmp_path, no_model=False, model_dir=model)
    try:
        assert eng.model_info().model_version == "tiny-1" and eng.ready().ready
        with pytest.raises(ModelNotFoundError):
            eng.reload(str(tmp_path / "nowhere"))
        assert eng.model_info().model_version == "tiny-1"
        swapped = eng.reload(str(tiny_model(tmp_path / "model-2", "tiny-2")))
        assert (swapped.previous_version, swapped.model_version) == ("tiny-1", "tiny-2")
        assert eng.model_info().model_version == "tiny-2"
    finally:
        eng.close()
