"""A run's outcome: its last events folded, the run closed and its whole trace logged (format v1).

The run is closed first (a shared store: only if no call changed it since it was read;
else the outcome starts over), then its trace is written; if that fails the run is
reopened as it was and the call answers 503, so a retry can close it.
:func:`assemble_trace` builds the trace from the run's journal: each event's JSON
text with the decisions taken after it, the stop (the caller's, or the service's last
answer), the budget, and the metrics a retrain reads (``service_lambda`` ...).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from stopserve.api import OutcomeRequest, OutcomeResponse
from stopserve.errors import Issue, LogUnavailableError, RunClosedError, TraceValidationError
from stopserve.service.decider import objective_of
from stopserve.service.recorder import Recorder
from stopserve.service.runs import ATTEMPTS, Runs, backoff_s, contended
from stopserve.service.store import Run
from stopserve.settings import Settings
from stopserve.trace import Stop, check_trace

__all__ = ["assemble_trace", "close_run"]


def close_run(runs: Runs, recorder: Recorder, run_id: str, req: OutcomeRequest) -> OutcomeResponse:
    """Fold the outcome's events, close the run and append its trace to the trace log."""
    runs.check_request(req.events)
    store = runs.store
    for attempt in range(ATTEMPTS):
        run = runs.lookup(run_id, whole=True)
        with run.lock:
            if run.closed:
                raise RunClosedError(f"run {run_id!r} is closed: its outcome was posted")
            new, _ = runs.new_events(run, req.events)
            store.charge(run, runs.fold(run, new))
            trace = assemble_trace(run, req, runs.settings, store.now())
            if not store.close(run):
                time.sleep(backoff_s(attempt))
                continue
            try:
                recorder.trace(trace)
            except LogUnavailableError:
                store.reopen(run)
                raise
        break
    else:
        raise contended(run_id)
    log = recorder.log
    return OutcomeResponse(
        run_id=run_id,
        trace_id=run_id,
        n_events=run.n_events,
        n_decisions=len({at for at, _ in run.decisions}),
        trace_log=str(log.traces.path) if log is not None else None,
    )


def assemble_trace(run: Run, req: OutcomeRequest, settings: Settings, now: float) -> dict[str, Any]:
    """The run's trace (format v1) from its journal and the outcome; refused if it does not check.

    ``now`` is the store's clock, to date the run's start on the wall clock.
    """
    after: dict[int, list[str]] = {}
    for at, text in run.decisions:
        after.setdefault(at, []).append(text)
    events = []
    for i, raw in enumerate(run.events):
        data = orjson.loads(raw)
        decisions = after.get(i)
        if decisions:
            data["decision"] = orjson.loads(decisions[0])
            if len(decisions) > 1:  # decided again at this event (no new event between the calls)
                data["later_decisions"] = [orjson.loads(x) for x in decisions[1:]]
        events.append(data)
    stop = req.stop
    last = run.last_response
    if stop is None and last is not None and last["action"] == "stop":
        stop = Stop(
            reason=last["reason"] or "unknown",
            by="safety_net" if last["safety_net"] else "service",
            t=run.last_t,
            limit=last["limit"],
        )
    trace: dict[str, Any] = {
        "format": "stopserve.trace/1",
        "trace_id": run.run_id,
        "task_id": run.task_id,
        "events": events,
        "rewards": req.rewards,
    }
    for key, value in (
        ("system", run.system),
        ("topology", run.topology),
        ("stop", stop.model_dump(by_alias=True, exclude_none=True, mode="json") if stop else None),
        ("budget", run.budget.model_dump(exclude_none=True, mode="json") if run.budget else None),
    ):
        if value is not None:
            trace[key] = value
    if req.costs:
        trace["costs"] = req.costs
    metrics = dict(req.metrics)
    metrics.setdefault("service_decisions", float(run.n_decisions))
    # when the run started (wall clock): `stopserve retrain` judges on the most recently started
    # runs, not the last to finish (in a burst those are the longest)
    metrics.setdefault("service_started", round(time.time() - (now - run.created_at), 3))
    # what cost was worth when it was decided: what `stopserve retrain` learns for by default
    objective = objective_of(run.lam, run.cost_share, settings.objective)
    if objective is not None and objective.lam is not None:
        metrics.setdefault("service_lambda", float(objective.lam))
    elif objective is not None and objective.cost_share is not None:
        metrics.setdefault("service_cost_share", float(objective.cost_share))
    trace["metrics"] = metrics
    checked, issues = check_trace(trace)
    if checked is None:
        if not events:
            issues = [Issue("a run with no events cannot be logged as a trace", path="events")]
        raise TraceValidationError(f"run {run.run_id!r}: the trace cannot be logged", issues)
    return trace
