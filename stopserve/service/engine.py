"""The service core the routes call: runs, decisions, logging, model swaps.

Routes only parse and serialise; everything here is plain Python (no FastAPI),
so it is tested and reasoned about without HTTP. The decision itself is
:meth:`stopserve.policy.Policy.decide` over a :class:`stopserve.features.RunState`.

Concurrency: the decide calls are coroutines run on the event loop (``decide``,
``decide_stateless``, ``decide_batch``; no blocking twins): fold + predict is
CPU-bound for tens of µs, cheaper than a hop to a thread. A run's ``alock``
(asyncio) serialises its decide calls across the one await, the wait for the
decision log; its ``lock`` (threading) guards its state against the routes that
still run in the thread pool (outcome, delete, info).
The model is one reference swapped atomically by a reload; a decision reads it once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar, cast

import anyio
import anyio.to_thread
import orjson
from pydantic import ValidationError

from stopserve.api import (
    MAX_ID_CHARS,
    MAX_INT,
    MAX_NUMBER,
    BatchDecideRequest,
    ChallengerInfo,
    DecideRequest,
    ErrorDetail,
    ErrorIssue,
    ModelInfo,
    OutcomeRequest,
    OutcomeResponse,
    ReadyResponse,
    ReloadResponse,
    RunInfo,
    StatelessDecideRequest,
)
from stopserve.artifacts import ModelArtifact, load_model_dir
from stopserve.decision import StopDecision, to_trace, to_wire
from stopserve.error_table import error_detail
from stopserve.errors import (
    ConfigError,
    Issue,
    LogUnavailableError,
    ModelError,
    ModelIntegrityError,
    ModelNotFoundError,
    RunClosedError,
    RunEvictedError,
    RunLimitError,
    RunNotFoundError,
    StopServeError,
    TraceValidationError,
    pydantic_issues,
)
from stopserve.features import FEATURE_NAMES, LOOP_ID_WINDOW, RunState
from stopserve.objective import Objective
from stopserve.policy import Policy
from stopserve.safety import DEFAULT_SAFETY, SafetyConfig
from stopserve.service.learning import LearningLoop
from stopserve.service.log import DecisionLog
from stopserve.service.metrics import Metrics
from stopserve.service.shadow import Challenger, Challengers, ShadowCall, challenger_dirs
from stopserve.service.store import (
    Closed,
    Evicted,
    EvictionCause,
    Found,
    Run,
    RunStore,
    StoreUnavailableError,
    decision_bytes,
    event_bytes,
)
from stopserve.service.stores import open_store
from stopserve.settings import Settings
from stopserve.trace import Event, Stop, Topology, Trace, check_trace

__all__ = ["Engine", "Serving", "load_policy"]

_log = logging.getLogger("stopserve.service")

_MAX_CARD_BYTES = 64 * 1024
_SAFETY_CACHE = 64
_NO_DECISION = {"decision"}
#: A decide call folding more events than this runs off the event loop (in a worker thread).
INLINE_EVENTS: Final = 64
#: Tries of a call whose shared run another call changed between its read and its write.
_ATTEMPTS: Final = 16
#: Room kept in a run's byte cap for the decision a call adds (its JSON text is a few hundred bytes).
_DECISION_RESERVE: Final = 1024
#: Decision points an ablation of a live run reads back by default (one refold per event).
CREDIT_ABLATION_LAST_K: Final = 10
#: Bounds of a safety config sent in a request (beyond them: 422 naming the field).
_SAFETY_DEPTH: Final = 8
_SAFETY_ITEMS: Final = 64

#: The challenger name of the model store's last refused candidate.
STORE_CANDIDATE: Final = "candidate"

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _Decided:
    """A call's decision and its challengers' (counted once the call is committed)."""

    decision: StopDecision
    shadow: list[ShadowCall]


@dataclass(frozen=True, slots=True)
class Serving:
    """The model being served; replaced whole by a reload."""

    policy: Policy
    path: Path | None
    loaded_at: float
    model_card: str | None


class Engine:
    """Runs, decisions and logs of one service process."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.store: RunStore = open_store(settings, on_evict=self._evicted, load_safety=self._safety)
        # large requests are validated and folded in a worker thread, one at a time: the GIL
        # is shared anyway, and the event loop keeps the rest for the small requests
        self.heavy = anyio.CapacityLimiter(1)
        self.log: DecisionLog | None = None
        self.log_ok = True
        self._serving: Serving | None = None
        self._reload_lock = threading.Lock()
        self._create_lock = threading.Lock()
        self._rng = random.Random(settings.seed)
        self._default_safety = self._parse_safety(settings.safety, "STOPSERVE_SAFETY")
        if settings.quality_target is not None:  # the quality target of the default config
            base = self._default_safety or DEFAULT_SAFETY
            self._default_safety = base.replace(quality_met=settings.quality_target)
        self._safety_cache: OrderedDict[bytes, SafetyConfig] = OrderedDict()
        # a large request decides in a worker thread while the event loop decides the others:
        # the policy's single-row predictor shares one output buffer, so decisions take turns
        self._policy_lock = threading.Lock()
        self._cache_lock = threading.Lock()
        self.challengers = Challengers()
        self.learning = LearningLoop(settings, metrics, self.store)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Reach the run store, open the logs and load the model (refuses to start on a bad model)."""
        self.store.ping()
        s = self.settings
        if s.log_dir is not None and str(s.log_dir):
            self.log = DecisionLog(
                s.log_dir,
                fsync=s.fsync,
                fsync_interval_s=s.fsync_interval_s,
                max_bytes=s.log_max_bytes,
                retain_bytes=s.log_retain_bytes,
            )
        path = self.settings.resolved_model_dir()
        champion = self.learning.champion()
        if champion is not None:
            try:
                self._serving = self._load(champion.path)
                self.learning.following = True
                _log.info("serving the model store's champion %s (%s)", champion.version, champion.path)
            except StopServeError as exc:
                _log.error(
                    "the model store's champion %s cannot be served (%s): serving %s",
                    champion.path,
                    exc,
                    path,
                )
        if self._serving is None:
            self._serving = self._load(path)
        self.metrics.set_model(self._serving.policy.model_version, self._serving.policy.kind)
        if self._serving.path is None:
            _log.warning("no model: serving on safety nets alone")
        if s.challengers is not None:
            for where in challenger_dirs(s.challengers):
                self.add_challenger(str(where), where.name)
        self.follow_candidate()

    def tick(self) -> None:
        """Periodic work: expire idle runs, fsync the logs on the interval, follow the champion."""
        self.follow_champion()
        self.follow_candidate()
        try:
            self.store.sweep()
        except StoreUnavailableError as exc:  # the next call says so to its client; the logs go on
            _log.warning("run store sweep: %s", exc)
        self.update_gauges()
        if self.log is not None:
            try:
                self.log.sync()
            except OSError as exc:
                self.log_ok = False
                _log.error("log sync failed: %s", exc)

    def update_gauges(self) -> None:
        """Live runs and the bytes they hold, for /metrics."""
        self.metrics.live_runs.set(len(self.store))
        self.metrics.store_bytes.set(self.store.nbytes)

    async def offload(self, func: Callable[..., _T], *args: Any) -> _T:
        """Run CPU-heavy work (a large body, many events) in a worker thread, one at a time."""
        return await anyio.to_thread.run_sync(func, *args, limiter=self.heavy)

    def close(self) -> None:
        """Flush and close the logs; release the run store's connections."""
        self.learning.close()
        if self.log is not None:
            self.log.close()
            self.log = None
        self.store.close_store()

    async def aclose(self) -> None:
        """Release what the event loop holds (a shared store's connections)."""
        await self.store.aclose_store()

    @property
    def serving(self) -> Serving:
        """The model being served."""
        if self._serving is None:
            raise RuntimeError("engine not started")
        return self._serving

    def _load(self, path: Path | None) -> Serving:
        if path is None:
            policy = Policy.safety_only(self._default_safety)
            return Serving(policy, None, time.time(), None)
        if not path.exists():
            raise ModelNotFoundError(f"{path}: no such model directory")
        artifact = load_artifact(path)
        policy = policy_from(artifact)
        names = policy.manifest.feature_names
        if names is not None and list(names) != list(FEATURE_NAMES):
            raise ModelIntegrityError(f"{path}/manifest.json: feature_names differ from this featurizer's")
        # only the card the manifest lists and hashes, read once with the other files
        card = artifact.card
        text = card[:_MAX_CARD_BYTES] if card is not None else None
        return Serving(policy, path, time.time(), text)

    def follow_champion(self) -> ReloadResponse | None:
        """Serve the model store's champion if a promotion or a rollback changed it since last seen."""
        champion = self.learning.changed()
        if champion is None:
            return None
        served = self.serving.path
        if served is not None and served.resolve() == champion.path.resolve():
            self.learning.following = True
            return None
        try:
            done = self.reload(str(champion.path), following=True)
        except StopServeError as exc:
            _log.error(
                "the model store's champion %s cannot be served (%s): keeping %s", champion.path, exc, served
            )
            return None
        self.metrics.champion_reloads.inc()
        return done

    def follow_candidate(self) -> None:
        """With exploration on, shadow the model store's last refused candidate (challenger ``candidate``)."""
        changed, path = self.learning.candidate_changed()
        if not changed:
            return
        if path is None:
            try:
                self.challengers.remove(STORE_CANDIDATE)
            except ModelNotFoundError:  # never shadowed, or removed by hand already
                return
            _log.info("challenger %s removed: a promotion replaced it", STORE_CANDIDATE)
            return
        try:
            self.add_challenger(str(path), STORE_CANDIDATE)
        except StopServeError as exc:  # a candidate half replaced, or broken: the next one is tried
            _log.warning("the model store's refused candidate %s cannot be shadowed: %s", path, exc)

    def reload(self, model_dir: str | None, *, following: bool = False) -> ReloadResponse:
        """Load a model and swap it in; on any failure the old one keeps serving.

        A reload by hand (``following`` False) stops following the model store's champion
        until the next promotion or rollback.
        """
        with self._reload_lock:
            old = self.serving
            path = Path(model_dir) if model_dir else (self.settings.resolved_model_dir() or old.path)
            if path is None:
                self.metrics.reloads.labels(result="refused").inc()
                raise ModelNotFoundError("no model directory configured: give 'model_dir'")
            try:
                new = self._load(path)
            except StopServeError:
                self.metrics.reloads.labels(result="refused").inc()
                raise
            self._serving = new
            self.learning.following = following
            with self._cache_lock:  # requests' configs were merged onto the old model's own
                self._safety_cache.clear()
            self.metrics.set_model(new.policy.model_version, new.policy.kind)
            self.metrics.reloads.labels(result="ok").inc()
            _log.info("reloaded model %s -> %s", old.policy.model_version, new.policy.model_version)
            return ReloadResponse(
                previous_version=old.policy.model_version,
                model_version=new.policy.model_version,
                kind=new.policy.kind,
                path=str(path),
            )

    # ------------------------------------------------------------------ decisions

    async def decide(self, run_id: str, req: DecideRequest) -> dict[str, Any]:
        """Fold the new events of ``run_id`` (creating it on the first call) and decide.

        The answer is a plain dict (DecideResponse fields). Only the wait for the decision
        log (and a shared store's read and write) is awaited, and the answer comes after
        it: every answered decision is in the log (durable under ``fsync="always"``). A call
        folding more than :data:`INLINE_EVENTS` events is folded in a worker thread, so one
        large request does not hold up the others.
        """
        start = time.perf_counter()
        self._check_request(req.events)
        for attempt in range(_ATTEMPTS):
            run = await self._aget_or_create(run_id, req)
            async with run.alock:
                if len(req.events) > INLINE_EVENTS:
                    answer, record, decided = await self.offload(self._decide_with_lock, run, run_id, req)
                else:
                    with run.lock:
                        answer, record, decided = self._decide_locked(run, run_id, req)
                if record is not None and not await self.store.asave(run, record):
                    await asyncio.sleep(_backoff_s(attempt))
                    continue  # a shared run changed since it was read: again, from the read
                line = record if record is not None else _replayed(run)
                if line is not None:
                    try:
                        await self._commit(line)
                    except LogUnavailableError:
                        await anyio.to_thread.run_sync(self._unanswered, run)
                        raise
            break
        else:
            raise _contended(run_id)
        if decided is not None:
            self._observe(decided.decision, start)
            self._count_shadow(decided)
        return answer

    async def decide_body(self, run_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`decide` for a request body given as data (the HTTP hooks' in-process decide);
        a body that is not a valid ``DecideRequest`` raises :class:`TraceValidationError`."""
        try:
            req = DecideRequest.model_validate(body)
        except ValidationError as exc:
            issues = pydantic_issues(exc.errors(include_url=False))
            raise TraceValidationError(f"run {run_id!r}: the hook's events were refused", issues) from None
        return await self.decide(run_id, req)

    def _decide_with_lock(
        self, run: Run, run_id: str, req: DecideRequest
    ) -> tuple[dict[str, Any], dict[str, Any] | None, _Decided | None]:
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

    def _decide_locked(
        self, run: Run, run_id: str, req: DecideRequest
    ) -> tuple[dict[str, Any], dict[str, Any] | None, _Decided | None]:
        """Under the run's lock: fold and decide; the answer, and the log record (None on a retry).

        All or nothing: every check (time order, safety config, byte caps) comes before
        the first event is folded.
        """
        if run.closed:
            raise RunClosedError(f"run {run_id!r} is closed: its outcome was posted")
        new, ignored = self._new_events(run, req.events)
        retry = req.events and not new and req.proposed_stop == run.last_proposed
        if retry and run.last_response is not None:
            # a retry of a call already answered: the same answer, nothing logged twice
            return dict(run.last_response, events_accepted=0, events_ignored=ignored), None, None
        safety = self._request_safety(req, run.safety)
        asked = _objective(req.lam, req.cost_share)
        nbytes = self._fold(run, new, reserve=_DECISION_RESERVE)
        if req.budget is not None:
            run.budget = req.budget
            run.state.set_budget(req.budget)
        if asked is not None:
            run.lam, run.cost_share = asked.lam, asked.cost_share
        if safety is not None:
            run.safety = safety
        policy = self.serving.policy
        objective = self._objective_of(run)
        theirs = self._challenged(run.state, objective, run.safety, req.proposed_stop)
        epsilon = self._epsilon(run.explored, theirs)
        decision = self._decide(policy, run.state, objective, run.safety, req.proposed_stop, epsilon)
        run.explored = run.explored or decision.explored
        shadow = self._shadow(run, decision, theirs, run.state)
        fields = to_wire(decision)
        answer = {"run_id": run_id, **fields, "events_accepted": len(new), "events_ignored": ignored}
        record = {
            "kind": "decision",
            "ts": time.time(),
            "run_id": run_id,
            "seq": run.n_decisions,
            "event_id": run.last_event_id,
            "n_events": run.n_events,
            **fields,
            "lambda": None if objective is None else objective.lam,
            "cost_share": None if objective is None else objective.cost_share,
            "proposed_stop": req.proposed_stop,
        }
        if shadow:
            record["challengers"] = Challengers.record(shadow)
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
        return answer, record, _Decided(decision, shadow)

    async def decide_stateless(self, req: StatelessDecideRequest) -> dict[str, Any]:
        """Decide on a whole trace prefix (a long one in a worker thread); nothing is stored but the log line.

        The answer is a plain dict (DecideResponse fields), given once the log line is written.
        """
        start = time.perf_counter()
        if len(req.events) > INLINE_EVENTS:
            answer, record, decided = await self.offload(self._stateless, req)
        else:
            answer, record, decided = self._stateless(req)
        await self._commit(record)
        self._observe(decided.decision, start)
        self._count_shadow(decided)
        return answer

    def _stateless(self, req: StatelessDecideRequest) -> tuple[dict[str, Any], dict[str, Any], _Decided]:
        self._check_request(req.events)
        ids: set[str] = set()
        for i, event in enumerate(req.events):
            if event.id in ids:
                raise TraceValidationError(
                    "duplicate event id", [Issue(f"duplicate event id {event.id!r}", path=f"events[{i}].id")]
                )
            ids.add(event.id)
        asked = _objective(req.lam, req.cost_share)
        state = self._new_state(req.topology, req)
        state.fold_many(req.events)
        safety = self._request_safety(req, None)
        objective = asked if asked is not None else self.settings.objective
        theirs = self._challenged(state, objective, safety, req.proposed_stop)
        decision = self._decide(
            self.serving.policy, state, objective, safety, req.proposed_stop, self._epsilon(False, theirs)
        )
        shadow = self._shadow(None, decision, theirs, state)
        fields = to_wire(decision)
        answer = {"run_id": req.run_id, **fields, "events_accepted": len(req.events), "events_ignored": 0}
        record = {
            "kind": "decision",
            "ts": time.time(),
            "run_id": req.run_id,
            "stateless": True,
            "event_id": req.events[-1].id,
            "n_events": state.n_events,
            **fields,
            "lambda": req.lam,
            "cost_share": req.cost_share,
            "proposed_stop": req.proposed_stop,
        }
        if shadow:
            record["challengers"] = Challengers.record(shadow)
        return answer, record, _Decided(decision, shadow)

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
        if len(req.runs) > self.settings.max_batch_runs:
            raise RunLimitError(
                f"too many runs in one batch: {len(req.runs)} > {self.settings.max_batch_runs}",
                [Issue(f"at most {self.settings.max_batch_runs} runs per batch", path="runs")],
            )
        total = sum(len(item.events) for item in req.runs)
        if total > self.settings.max_events_per_request:
            raise RunLimitError(
                f"too many events in one request: {total} > {self.settings.max_events_per_request}",
                [Issue(f"at most {self.settings.max_events_per_request} events per request", path="runs")],
            )

    def _objective_of(self, run: Run) -> Objective | None:
        """What cost is worth for ``run``: its own (the last a request gave), else the settings'."""
        own = _objective(run.lam, run.cost_share)
        return own if own is not None else self.settings.objective

    def _decide(  # noqa: PLR0917
        self,
        policy: Policy,
        state: RunState,
        objective: Objective | None,
        safety: SafetyConfig | None,
        proposed_stop: bool,
        epsilon: float = 0.0,
    ) -> StopDecision:
        with self._policy_lock:
            return policy.decide(
                state,
                objective=objective,
                safety=safety if safety is not None else self._default_safety,
                proposed_stop=proposed_stop,
                epsilon=epsilon,
                rng=self._rng,
            )

    def _epsilon(self, explored: bool, theirs: Sequence[tuple[Challenger, StopDecision]]) -> float:
        """The probability that the run's stop now is explored (``STOPSERVE_EXPLORE``).

        ε; where a challenger would go on, ``explore_disagree`` (what a retrain needs to judge
        it: runs that show what follows the champion's stop). Once the run was explored,
        1 − 1/explore_steps; where a challenger would go on, ``explore_follow`` (the run follows
        it to its own stop). It depends on the run's state alone, so the logged propensity is
        the true probability of the action taken.
        """
        plain, aimed = self.settings.exploration[1 if explored else 0]
        return aimed if any(d.action == "continue" for _, d in theirs) else plain

    def _challenged(
        self,
        state: RunState,
        objective: Objective | None,
        safety: SafetyConfig | None,
        proposed_stop: bool,
    ) -> list[tuple[Challenger, StopDecision]]:
        """Every challenger's answer on the run's state (no exploration), never acted on."""
        return [
            (c, self._decide(c.policy, state, objective, safety, proposed_stop)) for c in self.challengers
        ]

    def _shadow(
        self,
        run: Run | None,
        champion: StopDecision,
        theirs: Sequence[tuple[Challenger, StopDecision]],
        state: RunState,
    ) -> list[ShadowCall]:
        """The challengers' answers to count and log; the run remembers their stops."""
        calls: list[ShadowCall] = []
        compare = run is not None and champion.action == "stop" and not run.shadow_done
        for challenger, mine in theirs:
            first: int | None = None
            if run is not None:
                if mine.action == "stop":
                    run.shadow.setdefault(challenger.name, state.turn)
                first = run.shadow.get(challenger.name)
            calls.append(ShadowCall(challenger, mine, compare, first))
        if compare and run is not None:
            run.shadow_done = True
        return calls

    def _count_shadow(self, decided: _Decided) -> None:
        """Count a committed call's shadow decisions (a call started over is counted once)."""
        champion = decided.decision
        if champion.explored:
            self.metrics.explored.inc()
        m = self.metrics
        for call in decided.shadow:
            c = call.challenger
            c.count(call.decision, champion)
            m.challenger_decisions.labels(
                challenger=c.name, agree="true" if call.decision.action == champion.action else "false"
            ).inc()
            if call.compared:
                ahead = c.compare_stop(call.first_stop, call.decision, champion.turn)
                m.challenger_runs.labels(
                    challenger=c.name, stop="later" if ahead is None else "earlier" if ahead else "same"
                ).inc()
                if ahead is not None:
                    m.challenger_turns_earlier.labels(challenger=c.name).observe(ahead)

    def add_challenger(self, model_dir: str, name: str | None = None) -> ChallengerInfo:
        """Load a model directory as a shadow challenger (replacing one of the same name)."""
        path = Path(model_dir)
        if not path.exists():
            raise ModelNotFoundError(f"{path}: no such model directory")
        served = self._load(path)
        challenger = self.challengers.add(name or path.resolve().name, served.policy, path)
        _log.info("challenger %s: %s (%s)", challenger.name, served.policy.model_version, path)
        return challenger.info()

    def remove_challenger(self, name: str) -> None:
        """Stop a challenger deciding in the shadow."""
        self.challengers.remove(name)

    def _observe(self, decision: StopDecision, start: float) -> None:
        self.metrics.latency.observe(time.perf_counter() - start)
        self.metrics.count_decision(decision.action, decision.reason, decision.safety_net)

    async def _commit(self, record: dict[str, Any]) -> None:
        """Write a decision line from the event loop; returns once written (durable under "always")."""
        if self.log is None:
            return
        try:
            waiter = self.log.submit_decision(record)
            if waiter is not None:
                await waiter
            self.log_ok = True
        except OSError as exc:
            self._log_failed(exc)

    def _log_failed(self, exc: OSError) -> None:
        self.log_ok = False
        self.metrics.log_errors.inc()
        _log.error("decision log write failed: %s", exc)
        raise LogUnavailableError(f"the decision log cannot be written: {exc.strerror or exc}") from None

    # ------------------------------------------------------------------ runs

    def _check_request(self, events: Sequence[Event]) -> None:
        limit = self.settings.max_events_per_request
        if len(events) > limit:
            raise RunLimitError(
                f"too many events in one request: {len(events)} > {limit}",
                [Issue(f"at most {limit} events per request; send them in several calls", path="events")],
            )

    def _new_state(self, topology: str | None, req: DecideRequest | StatelessDecideRequest) -> RunState:
        if self.store.shared:
            # the engine skips seen events itself (all of a run's ids are in the store): the
            # featurizer's own id window then only serves the loop reports, and a small one
            # keeps the state each call reads and writes small; features are the same
            return RunState(topology=topology, budget=req.budget, seen_window=LOOP_ID_WINDOW)
        return RunState(topology=topology, budget=req.budget)

    def _get_or_create(self, run_id: str, req: DecideRequest) -> Run:
        """The live run; a new one only when the service never held it or the caller resends it whole.

        A run the store dropped (or one the caller says had events delivered before,
        ``prior_events > 0``, that the store does not hold) is refused with
        :class:`RunEvictedError`: starting it over would reset its turn count and its
        safety nets. ``prior_events: 0`` says the events sent are the whole run.
        A shared store's copy is new to this call; a new run there is stored by its first save.
        """
        ids = [e.id for e in req.events] if self.store.shared else ()
        found = self._resolved(run_id, req, self.store.get(run_id, ids))
        if found is not None:
            return found
        if self.store.shared:
            return self._create(run_id, req)
        with self._create_lock:
            found = self._resolved(run_id, req, self.store.get(run_id))
            return found if found is not None else self._create(run_id, req)

    async def _aget_or_create(self, run_id: str, req: DecideRequest) -> Run:
        """:meth:`_get_or_create` from the event loop (a shared store is read without blocking it)."""
        if not self.store.shared:
            return self._get_or_create(run_id, req)
        found = self._resolved(run_id, req, await self.store.aget(run_id, [e.id for e in req.events]))
        return found if found is not None else self._create(run_id, req)

    def _resolved(self, run_id: str, req: DecideRequest, found: Found) -> Run | None:
        """The run found, or None to create it; a closed or dropped run is refused."""
        if isinstance(found, Run):
            prior = req.prior_events
            if prior and found.n_events < prior and self.store.shared:
                raise _lost_error(run_id, found.n_events, prior)
            return found
        if isinstance(found, Closed):
            raise RunClosedError(f"run {run_id!r} is closed: its outcome was posted; use a new run id")
        if req.prior_events != 0 and (found is not None or req.prior_events is not None):
            raise _evicted_error(run_id, found, req.prior_events)
        return None

    def _create(self, run_id: str, req: DecideRequest) -> Run:
        safety = self._request_safety(req, None)
        now = self.store.now()
        run = Run(
            run_id=run_id,
            task_id=req.task_id or run_id,
            state=self._new_state(req.topology, req),
            created_at=now,
            last_seen_at=now,
            topology=req.topology,
            system=req.system,
            budget=req.budget,
            lam=req.lam,
            cost_share=req.cost_share,
            safety=safety,
        )
        self.store.add(run)
        self.update_gauges()
        return run

    def _new_events(self, run: Run, events: Sequence[Event]) -> tuple[list[tuple[int, Event]], int]:
        """The events not seen before, with their index in the request; time order checked."""
        new: list[tuple[int, Event]] = []
        batch_ids: set[str] = set()
        last_t = run.last_t if run.n_events else None
        for i, event in enumerate(events):
            if event.id in run.event_ids or event.id in batch_ids:
                continue
            if last_t is not None and event.t < last_t:
                raise TraceValidationError(
                    f"run {run.run_id!r}: events out of time order",
                    [Issue(f"time goes backwards: {event.t} after {last_t}", path=f"events[{i}].t")],
                )
            last_t = event.t
            batch_ids.add(event.id)
            new.append((i, event))
        return new, len(events) - len(new)

    def _fold(self, run: Run, new: list[tuple[int, Event]], *, reserve: int = 0) -> int:
        """Fold ``new`` into the run after checking every cap; the run's bytes after it.

        All or nothing: the counts and bytes are checked before the first event is folded.
        ``reserve`` keeps room in the byte cap for what the call adds next (its decision).
        """
        s = self.settings
        if run.n_events + len(new) > s.max_events_per_run:
            raise RunLimitError(
                f"run {run.run_id!r} would exceed {s.max_events_per_run} events",
                [
                    Issue(
                        f"at most {s.max_events_per_run} events per run (STOPSERVE_MAX_EVENTS_PER_RUN)",
                        path="events",
                    )
                ],
            )
        texts: list[str] = []
        nbytes = run.nbytes
        for i, event in new:
            # compact JSON text (a str: small); the service writes its own decisions
            text = event.model_dump_json(by_alias=True, exclude_none=True, exclude=_NO_DECISION)
            size = len(text.encode())
            if size > s.max_event_bytes:
                raise RunLimitError(
                    f"run {run.run_id!r}: an event of {size} bytes exceeds {s.max_event_bytes} bytes",
                    [
                        Issue(
                            f"at most {s.max_event_bytes} bytes per event (STOPSERVE_MAX_EVENT_BYTES)",
                            path=f"events[{i}]",
                        )
                    ],
                )
            texts.append(text)
            nbytes += event_bytes(text, event.id, event.agent, event.content_ref)
        if nbytes + reserve > s.max_run_bytes:
            raise RunLimitError(
                f"run {run.run_id!r} would hold {nbytes + reserve} bytes, above its {s.max_run_bytes} bytes; "
                "close it (outcome) and start a new run",
                [Issue(f"at most {s.max_run_bytes} bytes per run (STOPSERVE_MAX_RUN_BYTES)", path="events")],
            )
        run.state.fold_many(event for _, event in new)
        run.n_events += len(new)
        for (_, event), text in zip(new, texts, strict=True):
            run.events.append(text)
            run.event_ids.add(event.id)
            run.last_t = event.t
            run.last_event_id = event.id
        return nbytes

    def _lookup(self, run_id: str, *, whole: bool = False) -> Run:
        return _held(run_id, self.store.get(run_id, whole=whole))

    def outcome(self, run_id: str, req: OutcomeRequest) -> OutcomeResponse:
        """Close the run and append its whole trace (format v1) to the trace log.

        The run is closed first (a shared store: only if no call changed it since it was
        read; else the outcome starts over), then its trace is written; if that fails the
        run is reopened as it was and the call answers 503, so a retry can close it.
        """
        self._check_request(req.events)
        for attempt in range(_ATTEMPTS):
            run = self._lookup(run_id, whole=True)
            with run.lock:
                if run.closed:
                    raise RunClosedError(f"run {run_id!r} is closed: its outcome was posted")
                new, _ = self._new_events(run, req.events)
                self.store.charge(run, self._fold(run, new))
                trace = self._trace(run, req)
                if not self.store.close(run):
                    time.sleep(_backoff_s(attempt))
                    continue
                if self.log is not None:
                    try:
                        self.log.trace(trace)
                    except OSError as exc:
                        self.metrics.log_errors.inc()
                        self.log_ok = False
                        self.store.reopen(run)
                        raise LogUnavailableError(
                            f"the trace log cannot be written: {exc.strerror or exc}"
                        ) from None
            break
        else:
            raise _contended(run_id)
        self.update_gauges()
        self.metrics.outcomes.inc()
        self.learning.finished(self.serving.path)
        return OutcomeResponse(
            run_id=run_id,
            trace_id=run_id,
            n_events=run.n_events,
            n_decisions=len({at for at, _ in run.decisions}),
            trace_log=str(self.log.traces.path) if self.log is not None else None,
        )

    def _trace(self, run: Run, req: OutcomeRequest) -> dict[str, Any]:
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
        metrics.setdefault("service_started", round(time.time() - (self.store.now() - run.created_at), 3))
        # what cost was worth when it was decided: what `stopserve retrain` learns for by default
        objective = self._objective_of(run)
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

    def delete(self, run_id: str) -> None:
        """Drop a live run without logging a trace (or forget that the store dropped it)."""
        found = self.store.get(run_id)
        if isinstance(found, Evicted):
            self.store.forget(run_id)
            return
        run = _held(run_id, found)
        with run.lock:
            self.store.pop(run_id)
        self.update_gauges()

    def run_info(self, run_id: str) -> RunInfo:
        """State and current features of a live run."""
        run = self._lookup(run_id)
        with run.lock:
            state = run.state
            values = state.features()
            features = {
                name: (float(v) if math.isfinite(float(v)) else None)
                for name, v in zip(FEATURE_NAMES, values, strict=True)
            }
            return RunInfo(
                run_id=run.run_id,
                task_id=run.task_id,
                topology=run.topology,
                n_events=run.n_events,
                turn=state.turn,
                elapsed=state.elapsed,
                tokens=float(state.tokens),
                usd=float(state.usd),
                n_decisions=run.n_decisions,
                last_action=run.last_response["action"] if run.last_response else None,
                created_at=run.created_at,
                last_seen_at=run.last_seen_at,
                features=features,
            )

    def credit(
        self,
        run_id: str,
        *,
        method: str = "td",
        split: str = "tokens",
        window: str = "decision",
        baseline: str = "zero",
        lam: float | None = None,
        cost_share: float | None = None,
        types: Sequence[str] | None = None,
        last_k: int | None = None,
    ) -> dict[str, Any]:
        """Message-level credit of a live run's events so far, under the served model (docs/credit.md).

        ``lam`` / ``cost_share`` (one of them) default to the run's own, then the model's. An ablation
        reads the last :data:`CREDIT_ABLATION_LAST_K` decision points unless ``last_k`` says.
        """
        from stopserve.training.credit import aggregate, credit_trace  # offline code: loaded on first use

        run = self._lookup(run_id)
        with run.lock:
            texts = list(run.events)
            task_id, topology, budget = run.task_id, run.topology, run.budget
            asked = _objective(lam, cost_share)
            if asked is None:
                asked = _objective(run.lam, run.cost_share)
        if method == "ablation" and last_k is None:
            last_k = CREDIT_ABLATION_LAST_K
        trace = Trace.model_construct(
            trace_id=run_id,
            task_id=task_id,
            topology=cast(Topology | None, topology),  # checked when the run was created
            budget=budget,
            events=[Event.model_validate_json(text) for text in texts],
        )
        policy = self.serving.policy
        report = credit_trace(
            policy,
            trace,
            method=method,
            split=split,
            window=window,
            baseline=baseline,
            objective=asked,
            types=types,
            last_k=last_k,
        )
        data = report.to_dict()
        data["run_id"] = data.pop("trace_id")
        data["model_version"] = policy.model_version
        data["aggregates"] = {by: aggregate([report], by) for by in ("agent", "role", "type", "agent_type")}
        return data

    def _evicted(self, run: Run, cause: EvictionCause) -> None:
        self.metrics.evictions.labels(cause=cause).inc()

    # ------------------------------------------------------------------ model / health

    def model_info(self) -> ModelInfo:
        """Summary of the model served."""
        s = self.serving
        p = s.policy
        return ModelInfo(
            kind=p.kind,
            model_version=p.model_version,
            default_lambda=None if p.objective is None else p.objective.lam,
            default_cost_share=None if p.objective is None else p.objective.cost_share,
            rule=None if p.manifest.base_rule is None else p.manifest.base_rule.text,
            path=str(s.path) if s.path else None,
            safety_only=p.kind == "none",
            feature_names=list(FEATURE_NAMES),
            safety=(self._default_safety or p.safety).to_dict(),
            manifest=_manifest_info(p),
            model_card=s.model_card,
            loaded_at=s.loaded_at,
            challengers=self.challengers.infos(),
            champion=self.learning.info(),
        )

    def ready(self) -> ReadyResponse:
        """Readiness: a policy is loaded and the log writes."""
        s = self._serving
        store_ok = True
        if self.store.shared:
            try:
                self.store.ping()
            except StoreUnavailableError as exc:
                _log.error("%s", exc)
                store_ok = False
        return ReadyResponse(
            ready=s is not None and self.log_ok and store_ok,
            model_version=s.policy.model_version if s else None,
            kind=s.policy.kind if s else "none",
            safety_only=s is None or s.policy.kind == "none",
            live_runs=len(self.store),
            log_ok=self.log_ok,
        )

    # ------------------------------------------------------------------ safety configs

    def _request_safety(
        self, req: DecideRequest | StatelessDecideRequest, held: SafetyConfig | None
    ) -> SafetyConfig | None:
        """The config a request asks for (``safety``, ``quality_target``), or None: keep the one in force.

        ``quality_target`` sets ``quality_met`` of the request's config, else of the run's
        (``held``), else of the service's default, else of the model's own.
        """
        safety = self._safety(req.safety) if req.safety is not None else None
        if req.quality_target is None:
            return safety
        base = safety or held or self._default_safety or self.serving.policy.safety
        if base.quality_met == req.quality_target:
            return base
        return base.replace(quality_met=req.quality_target)

    def _safety(self, raw: dict[str, Any]) -> SafetyConfig:
        """A request's config: its keys over the config in force (the service's, else the model's)."""
        issues = _out_of_range(raw, "safety", 0)
        if issues:
            raise ConfigError("invalid safety config in 'safety'", issues)
        policy = self.serving.policy
        key = orjson.dumps(raw, option=orjson.OPT_SORT_KEYS)  # cleared when a reload swaps the model
        cached = self._safety_cache.get(key)
        if cached is not None:
            return cached
        base = self._default_safety or policy.safety
        cfg = self._parse_safety({**base.to_dict(), **raw}, "safety")
        assert cfg is not None
        with self._cache_lock:
            self._safety_cache[key] = cfg
            while len(self._safety_cache) > _SAFETY_CACHE:
                self._safety_cache.popitem(last=False)
        return cfg

    @staticmethod
    def _parse_safety(raw: dict[str, Any] | None, where: str) -> SafetyConfig | None:
        if raw is None:
            return None
        try:
            return SafetyConfig.from_dict(raw)
        except ConfigError as exc:
            issues = [Issue(i.message, path=f"{where}.{i.path}" if i.path else where) for i in exc.issues]
            raise ConfigError(f"invalid safety config in {where!r}", issues) from None


def load_artifact(path: Path) -> ModelArtifact:
    """The verified model directory (every listed file read once, sha256 checked, no link out of it)."""
    try:
        return load_model_dir(path)
    except OSError as exc:
        raise ModelNotFoundError(f"{path}: cannot read the model: {exc}") from None


def policy_from(artifact: ModelArtifact) -> Policy:
    """``Policy.from_artifact``, with every failure a model error (422 on reload), never a crash.

    A manifest value of the wrong type or form (a string for a number, a number for a
    map) breaks the policy's constructor with a plain Python error: that is the
    manifest's fault, reported as such.
    """
    path = artifact.path
    try:
        return Policy.from_artifact(artifact)
    except StopServeError:
        raise
    except (ImportError, OSError) as exc:
        raise ModelError(
            f"{path}: cannot load LightGBM to use this model ({exc}); "
            "on slim Linux images install the OpenMP runtime (libgomp1)"
        ) from None
    except (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError) as exc:
        raise ModelIntegrityError(
            f"{path}/manifest.json: a value has the wrong type or form ({type(exc).__name__}: {exc})"
        ) from None


def load_policy(path: Path) -> Policy:
    """Load and verify a model directory as a policy; every failure is a :class:`ModelError`."""
    return policy_from(load_artifact(path))


@functools.lru_cache(maxsize=256)
def _objective(lam: float | None, cost_share: float | None) -> Objective | None:
    """A request's (or a run's) ``lambda`` / ``cost_share`` as an :class:`Objective` (None: neither).

    Cached: a service sees a handful of distinct values, asked on every call.
    """
    return Objective.of(lam, cost_share)


def _manifest_info(policy: Policy) -> dict[str, Any]:
    """The served manifest as ``GET /v1/model`` shows it: its JSON, and how decisions are computed."""
    data = policy.manifest.to_dict()
    if policy.inference is not None:
        data["inference"] = policy.inference
    return data


def _held(run_id: str, found: Found) -> Run:
    """The run found, or the error that says why there is none."""
    if isinstance(found, Run):
        return found
    if isinstance(found, Closed):
        raise RunClosedError(f"run {run_id!r} is closed: its outcome was posted")
    if isinstance(found, Evicted):
        raise _evicted_error(run_id, found, None)
    raise RunNotFoundError(f"no live run {run_id!r}: never created, or deleted")


def _replayed(run: Run) -> dict[str, Any] | None:
    """A shared run's stored answer, answered again: its log line, written again.

    The replica that decided it may have died between saving it and logging it; a reader
    of the logs counts each (run_id, seq) once.
    """
    return {**run.last_record, "replayed": True} if run.last_record is not None else None


def _backoff_s(attempt: int) -> float:
    """Seconds to wait before trying a conflicted call again: none at first, then jittered."""
    return 0.0 if attempt == 0 else random.uniform(0, min(0.05, 0.001 * 2**attempt))


def _contended(run_id: str) -> StoreUnavailableError:
    return StoreUnavailableError(
        f"run {run_id!r}: {_ATTEMPTS} tries in a row conflicted with other calls on the same run; retry"
    )


def _lost_error(run_id: str, held: int, prior: int) -> RunEvictedError:
    return RunEvictedError(
        f"run {run_id!r}: the run store holds {held} of its events but {prior} were delivered: it lost "
        "the latest (restarted from an older snapshot, or failed over to a replica behind it); it is not "
        "continued from there: resend all of its events with prior_events: 0, or decide locally",
        [Issue(f"the store holds {held} events, prior_events says {prior}", path="prior_events")],
    )


def _evicted_error(run_id: str, found: Evicted | None, prior: int | None) -> RunEvictedError:
    if found is not None and found.why is not None:
        what = f"run {run_id!r} was dropped by the run store: {found.why}"
    elif found is not None:
        why = {
            "lru": "the least recently used (STOPSERVE_MAX_RUNS)",
            "bytes": "the least recently used over the store's byte cap (STOPSERVE_MAX_STORE_BYTES)",
            "ttl": "idle past its ttl (STOPSERVE_RUN_TTL_S)",
        }[found.cause]
        what = f"run {run_id!r} was dropped by the run store: {why}"
    else:
        what = (
            f"run {run_id!r} is not held here, though {prior} of its events were delivered before "
            "(evicted, or the service restarted)"
        )
    return RunEvictedError(
        f"{what}; it is not started over: resend all of its events with prior_events: 0, or decide locally",
        [Issue("the run's earlier events are gone from the service", path="prior_events")],
    )


def _out_of_range(value: Any, path: str, depth: int) -> list[Issue]:
    """Numbers, strings and nesting of a free-form JSON value beyond what the service takes."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        ok = -MAX_INT <= value <= MAX_INT
        return [] if ok else [Issue(f"integer out of range (at most {MAX_INT} in size)", path=path)]
    if isinstance(value, float):
        ok = math.isfinite(value) and abs(value) <= MAX_NUMBER
        return [] if ok else [Issue(f"number out of range (at most {MAX_NUMBER:g} in size)", path=path)]
    if isinstance(value, str):
        ok = len(value) <= MAX_ID_CHARS
        return [] if ok else [Issue(f"string longer than {MAX_ID_CHARS} characters", path=path)]
    if depth >= _SAFETY_DEPTH:
        return [Issue(f"nested deeper than {_SAFETY_DEPTH} levels", path=path)]
    if isinstance(value, dict | list) and len(value) > _SAFETY_ITEMS:
        return [Issue(f"more than {_SAFETY_ITEMS} entries", path=path)]
    issues: list[Issue] = []
    if isinstance(value, dict):
        for key, item in value.items():
            issues += _out_of_range(item, f"{path}.{key}", depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            issues += _out_of_range(item, f"{path}[{i}]", depth + 1)
    return issues


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
