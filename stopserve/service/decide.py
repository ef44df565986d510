"""The three decide calls: a live run's (stateful), a whole trace prefix (stateless), a batch.

Each is a coroutine run on the event loop: fold + predict is CPU-bound for tens of µs,
cheaper than a hop to a thread; a call folding more than :data:`INLINE_EVENTS` events
folds in a worker thread instead, so one large request does not hold up the others.
The only awaits are a shared store's read and write and the wait for the decision log,
and the answer comes after the log: every answered decision is in the log (durable
under ``fsync="always"``).

A run's ``alock`` (asyncio) serialises its decide calls across those awaits; its
``lock`` (threading) guards its state against the routes that run in the thread pool
(outcome, delete, info). A shared run changed by another call between this call's
read and write is read again and decided again (:data:`~stopserve.service.runs.ATTEMPTS`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol, TypeVar

import anyio.to_thread
import orjson

from stopserve.api import (
    BatchDecideRequest,
    DecideRequest,
    ErrorDetail,
    ErrorIssue,
    StatelessDecideRequest,
)
from stopserve.decision import to_trace, to_wire
from stopserve.error_table import error_detail
from stopserve.errors import (
    Issue,
    LogUnavailableError,
    RunClosedError,
    RunLimitError,
    StopServeError,
    TraceValidationError,
)
from stopserve.service.decider import Decided, Decider, objective_of
from stopserve.service.recorder import Recorder
from stopserve.service.records import decision_record
from stopserve.service.runs import ATTEMPTS, Runs, backoff_s, contended
from stopserve.service.safety_configs import RequestSafety
from stopserve.service.serving import Models
from stopserve.service.store import Run, StoreUnavailableError, decision_bytes
from stopserve.settings import Settings

__all__ = ["INLINE_EVENTS", "DecideCalls"]

_log = logging.getLogger("stopserve.service")

#: A decide call folding more events than this runs off the event loop (in a worker thread).
INLINE_EVENTS: Final = 64
#: Room kept in a run's byte cap for the decision a call adds (its JSON text is a few hundred bytes).
_DECISION_RESERVE: Final = 1024

_Answer = tuple[dict[str, Any], dict[str, Any] | None, Decided | None]
_T = TypeVar("_T")


class Offload(Protocol):
    """Runs ``func(*args)`` in a worker thread (:meth:`stopserve.service.engine.Engine.offload`)."""

    def __call__(self, func: Callable[..., _T], /, *args: Any) -> Awaitable[_T]: ...


class DecideCalls:
    """The decide calls of one service process, over its runs, models, decider and logs."""

    def __init__(
        self,
        settings: Settings,
        *,
        runs: Runs,
        models: Models,
        safety: RequestSafety,
        decider: Decider,
        recorder: Recorder,
        offload: Offload,
    ) -> None:
        self.settings = settings
        self.runs = runs
        self.store = runs.store
        self.models = models
        self.safety = safety
        self.decider = decider
        self.recorder = recorder
        self._offload = offload

    # ------------------------------------------------------------------ a live run

    async def decide(self, run_id: str, req: DecideRequest) -> dict[str, Any]:
        """Fold the new events of ``run_id`` (creating it on the first call) and decide.

        The answer is a plain dict (DecideResponse fields), given once its log line is written.
        """
        start = time.perf_counter()
        self.runs.check_request(req.events)
        for attempt in range(ATTEMPTS):
            run = await self.runs.aget_or_create(run_id, req)
            async with run.alock:
                if len(req.events) > INLINE_EVENTS:
                    answer, record, decided = await self._offload(self._decide_with_lock, run, run_id, req)
                else:
                    with run.lock:
                        answer, record, decided = self._decide_locked(run, run_id, req)
                if record is not None and not await self.store.asave(run, record):
                    await asyncio.sleep(backoff_s(attempt))
                    continue  # a shared run changed since it was read: again, from the read
                line = record if record is not None else _replayed(run)
                if line is not None:
                    try:
                        await self.recorder.commit(line)
                    except LogUnavailableError:
                        await anyio.to_thread.run_sync(self._unanswered, run)
                        raise
            break
        else:
            raise contended(run_id)
        if decided is not None:
            self.decider.count(decided, start)
        return answer

    def _decide_with_lock(self, run: Run, run_id: str, req: DecideRequest) -> _Answer:
        with run.lock:
            return self._decide_locked(run, run_id, req)

    def _unanswered(self, run: Run) -> None:
        """The decision's log line failed: it is not answered, so a retry must decide again."""
        run.last_response = None
        if self.store.shared:
            try:
                self.store.save(run)  # best effort: a conflict means another call moved the run on
            except StoreUnavailableError as exc:
                _log.warning("run %r: could not clear its unlogged answer: %s", run.run_id, exc)

    def _decide_locked(self, run: Run, run_id: str, req: DecideRequest) -> _Answer:
        """Under the run's lock: fold and decide; the answer, and the log record (None on a retry).

        All or nothing: every check (time order, safety config, byte caps) comes before
        the first event is folded.
        """
        if run.closed:
            raise RunClosedError(f"run {run_id!r} is closed: its outcome was posted")
        new, ignored = self.runs.new_events(run, req.events)
        retry = req.events and not new and req.proposed_stop == run.last_proposed
        if retry and run.last_response is not None:
            # a retry of a call already answered: the same answer, nothing logged twice
            return dict(run.last_response, events_accepted=0, events_ignored=ignored), None, None
        safety = self.safety.for_request(req, run.safety)
        asked = objective_of(req.lam, req.cost_share)  # checked before any event is folded
        nbytes = self.runs.fold(run, new, reserve=_DECISION_RESERVE)
        if req.budget is not None:
            run.budget = req.budget
            run.state.set_budget(req.budget)
        if asked is not None:
            run.lam, run.cost_share = asked.lam, asked.cost_share
        if safety is not None:
            run.safety = safety
        policy = self.models.serving.policy
        objective = objective_of(run.lam, run.cost_share, self.settings.objective)
        decided = self.decider.decide(policy, run.state, objective, run.safety, req.proposed_stop, run)
        decision = decided.decision
        fields = to_wire(decision)
        answer = {"run_id": run_id, **fields, "events_accepted": len(new), "events_ignored": ignored}
        record = decision_record(
            run_id,
            {"seq": run.n_decisions, "event_id": run.last_event_id, "n_events": run.n_events},
            fields,
            {
                "lambda": None if objective is None else objective.lam,
                "cost_share": None if objective is None else objective.cost_share,
                "proposed_stop": req.proposed_stop,
            },
            decided.shadow,
        )
        if run.n_events:
            # JSON text, not a dict: a str is not tracked by the garbage collector, so
            # thousands of live runs do not lengthen its full collections (p99)
            text = orjson.dumps(to_trace(decision)).decode()
            run.decisions.append((run.n_events - 1, text))  # after that event (again: in order)
            nbytes += decision_bytes(text)
        self.store.charge(run, nbytes)
        run.n_decisions += 1
        run.last_proposed = req.proposed_stop
        run.last_response = answer  # cleared again if its log line cannot be written
        return answer, record, decided

    # ------------------------------------------------------------------ a trace prefix

    async def decide_stateless(self, req: StatelessDecideRequest) -> dict[str, Any]:
        """Decide on a whole trace prefix (a long one in a worker thread); nothing is stored but the log line.

        The answer is a plain dict (DecideResponse fields), given once the log line is written.
        """
        start = time.perf_counter()
        if len(req.events) > INLINE_EVENTS:
            answer, record, decided = await self._offload(self._stateless, req)
        else:
            answer, record, decided = self._stateless(req)
        await self.recorder.commit(record)
        self.decider.count(decided, start)
        return answer

    def _stateless(self, req: StatelessDecideRequest) -> tuple[dict[str, Any], dict[str, Any], Decided]:
        self.runs.check_request(req.events)
        objective = objective_of(req.lam, req.cost_share, self.settings.objective)
        ids: set[str] = set()
        for i, event in enumerate(req.events):
            if event.id in ids:
                raise TraceValidationError(
                    "duplicate event id", [Issue(f"duplicate event id {event.id!r}", path=f"events[{i}].id")]
                )
            ids.add(event.id)
        state = self.runs.new_state(req.topology, req)
        state.fold_many(req.events)
        safety = self.safety.for_request(req, None)
        policy = self.models.serving.policy
        decided = self.decider.decide(policy, state, objective, safety, req.proposed_stop)
        fields = to_wire(decided.decision)
        answer = {"run_id": req.run_id, **fields, "events_accepted": len(req.events), "events_ignored": 0}
        record = decision_record(
            req.run_id,
            {"stateless": True, "event_id": req.events[-1].id, "n_events": state.n_events},
            fields,
            {"lambda": req.lam, "cost_share": req.cost_share, "proposed_stop": req.proposed_stop},
            decided.shadow,
        )
        return answer, record, decided

    # ------------------------------------------------------------------ a batch

    async def decide_batch(self, req: BatchDecideRequest) -> dict[str, Any]:
        """Decide for many runs; one run's error does not fail the others (a plain dict, BatchDecideResponse).

        The runs are decided concurrently and their log lines share one group commit;
        a run named twice is decided twice, in request order.
        """
        self._check_batch(req)

        async def one(i: int, item: Any) -> dict[str, Any]:
            try:
                decision = await self.decide(item.run_id, item)
                return {"run_id": item.run_id, "decision": decision, "error": None}
            except StopServeError as exc:
                detail = _slot_error(error_detail(exc), i)
                return {"run_id": item.run_id, "decision": None, "error": detail.model_dump(mode="json")}
            except Exception:  # a bug on one run must not lose the others' answers
                _log.exception("batch item %d (run %r) failed", i, item.run_id)
                detail = _internal_slot_error(i)
                return {"run_id": item.run_id, "decision": None, "error": detail.model_dump(mode="json")}

        # the calls of one run go one after the other, in request order (a shared store's
        # calls do not queue on a lock: concurrent ones would race for the same version)
        chains: dict[str, list[tuple[int, Any]]] = {}
        for i, item in enumerate(req.runs):
            chains.setdefault(item.run_id, []).append((i, item))

        async def chain(items: list[tuple[int, Any]]) -> list[tuple[int, dict[str, Any]]]:
            return [(i, await one(i, item)) for i, item in items]

        results: list[dict[str, Any]] = [{}] * len(req.runs)
        for done in await asyncio.gather(*(chain(items) for items in chains.values())):
            for i, result in done:
                results[i] = result
        return {"results": results}

    def _check_batch(self, req: BatchDecideRequest) -> None:
        s = self.settings
        if len(req.runs) > s.max_batch_runs:
            raise RunLimitError(
                f"too many runs in one batch: {len(req.runs)} > {s.max_batch_runs}",
                [Issue(f"at most {s.max_batch_runs} runs per batch", path="runs")],
            )
        total = sum(len(item.events) for item in req.runs)
        if total > s.max_events_per_request:
            raise RunLimitError(
                f"too many events in one request: {total} > {s.max_events_per_request}",
                [Issue(f"at most {s.max_events_per_request} events per request", path="runs")],
            )


def _replayed(run: Run) -> dict[str, Any] | None:
    """A shared run's stored answer, answered again: its log line, written again.

    The replica that decided it may have died between saving it and logging it; a reader
    of the logs counts each (run_id, seq) once.
    """
    return {**run.last_record, "replayed": True} if run.last_record is not None else None


def _internal_slot_error(i: int) -> ErrorDetail:
    return ErrorDetail(
        type="internal_error",
        message="internal error on this run: the server logged it",
        status=500,
        issues=[ErrorIssue(field=f"runs[{i}]", message="internal error")],
    )


def _slot_error(detail: ErrorDetail, i: int) -> ErrorDetail:
    """A run's error in a batch, its fields located under ``runs[i]`` (at least one issue names it)."""
    for issue in detail.issues:
        issue.field = f"runs[{i}].{issue.field}" if issue.field else f"runs[{i}]"
    if not detail.issues:
        detail.issues.append(ErrorIssue(field=f"runs[{i}]", message=detail.message))
    return detail
