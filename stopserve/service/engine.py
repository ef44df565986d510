"""The service core the routes call: one object that wires the parts and answers for them.

Routes only parse and serialise; everything here is plain Python (no FastAPI), so it is
tested and reasoned about without HTTP. :class:`Engine` is a façade: each concern lives
in its own module, and each method here is a line or two into one of them.

============================================  ===================================================
concern                                       module
============================================  ===================================================
the model served, reloads, the model store's  :mod:`~stopserve.service.serving` (``Models``,
champion and candidate, challengers, ready    ``readiness``)
the three decide calls (a run's, stateless,   :mod:`~stopserve.service.decide` (``DecideCalls``)
a batch)
one decision: policy, exploration, shadows    :mod:`~stopserve.service.decider` (``Decider``)
a decision's answer, log line, trace record   :mod:`~stopserve.service.records`
live runs: create, fold under the caps,       :mod:`~stopserve.service.runs` (``Runs``)
look up, delete; store retries
outcome: close the run, assemble its trace    :mod:`~stopserve.service.outcome`
requests' safety-net configs                  :mod:`~stopserve.service.safety_configs`
the decision and trace logs as written        :mod:`~stopserve.service.recorder` (``Recorder``)
message-level credit of a live run            :mod:`~stopserve.service.credit`
============================================  ===================================================

The run store (:mod:`~stopserve.service.store`), the log files
(:mod:`~stopserve.service.log`), the metrics, the challengers' registry
(:mod:`~stopserve.service.shadow`) and the background retrain
(:mod:`~stopserve.service.learning`) are the parts these use. The decision itself is
:meth:`stopserve.policy.Policy.decide` over a :class:`stopserve.features.RunState`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from pydantic import ValidationError

from stopserve.api import (
    BatchDecideRequest,
    ChallengerInfo,
    DecideRequest,
    ModelInfo,
    OutcomeRequest,
    OutcomeResponse,
    ReadyResponse,
    ReloadResponse,
    RunInfo,
    StatelessDecideRequest,
)
from stopserve.errors import TraceValidationError, pydantic_issues
from stopserve.safety import SafetyConfig
from stopserve.service.credit import CREDIT_ABLATION_LAST_K, live_credit
from stopserve.service.decide import INLINE_EVENTS, DecideCalls
from stopserve.service.decider import Decider
from stopserve.service.learning import LearningLoop
from stopserve.service.log import DecisionLog
from stopserve.service.metrics import Metrics
from stopserve.service.outcome import close_run
from stopserve.service.recorder import Recorder
from stopserve.service.runs import Runs
from stopserve.service.safety_configs import RequestSafety
from stopserve.service.serving import STORE_CANDIDATE, Models, Serving, load_policy, readiness
from stopserve.service.shadow import Challengers
from stopserve.service.store import EvictionCause, Run, RunStore, StoreUnavailableError
from stopserve.service.stores import open_store
from stopserve.settings import Settings

__all__ = ["CREDIT_ABLATION_LAST_K", "INLINE_EVENTS", "STORE_CANDIDATE", "Engine", "Serving", "load_policy"]

_log = logging.getLogger("stopserve.service")

_T = TypeVar("_T")


class Engine:
    """Runs, decisions and logs of one service process."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.safety = RequestSafety(settings, lambda: self.models.serving.policy)
        self.store: RunStore = open_store(settings, on_evict=self._evicted, load_safety=self._load_safety)
        # large requests are validated and folded in a worker thread, one at a time: the GIL
        # is shared anyway, and the event loop keeps the rest for the small requests
        self.heavy = anyio.CapacityLimiter(1)
        self.recorder = Recorder(settings, metrics)
        self.learning = LearningLoop(settings, metrics, self.store)
        self.models = Models(settings, metrics, self.learning, self.safety)
        self.runs = Runs(settings, self.store, self.safety.for_request, self.update_gauges)
        self.decider = Decider(settings, metrics, self.models.challengers, self.safety.default)
        self.calls = DecideCalls(
            settings,
            runs=self.runs,
            models=self.models,
            safety=self.safety,
            decider=self.decider,
            recorder=self.recorder,
            offload=self.offload,
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Reach the run store, open the logs and load the model (refuses to start on a bad model)."""
        self.store.ping()
        self.recorder.open()
        self.models.start()

    def tick(self) -> None:
        """Periodic work: expire idle runs, fsync the logs on the interval, follow the champion."""
        self.models.follow_champion()
        self.models.follow_candidate()
        try:
            self.store.sweep()
        except StoreUnavailableError as exc:  # the next call says so to its client; the logs go on
            _log.warning("run store sweep: %s", exc)
        self.update_gauges()
        self.recorder.sync()

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
        self.recorder.close()
        self.store.close_store()

    async def aclose(self) -> None:
        """Release what the event loop holds (a shared store's connections)."""
        await self.store.aclose_store()

    @property
    def log(self) -> DecisionLog | None:
        """The decision and trace logs (None: logging is off)."""
        return self.recorder.log

    @property
    def log_ok(self) -> bool:
        """Whether the last write to the logs succeeded."""
        return self.recorder.ok

    @property
    def serving(self) -> Serving:
        """The model being served."""
        return self.models.serving

    @property
    def challengers(self) -> Challengers:
        """The shadow challengers."""
        return self.models.challengers

    def _evicted(self, run: Run, cause: EvictionCause) -> None:
        self.metrics.evictions.labels(cause=cause).inc()

    def _load_safety(self, raw: dict[str, Any]) -> SafetyConfig:
        return self.safety.merged(raw)

    # ------------------------------------------------------------------ model

    def reload(self, model_dir: str | None, *, following: bool = False) -> ReloadResponse:
        """Load a model and swap it in; on any failure the old one keeps serving (see ``Models.reload``)."""
        return self.models.reload(model_dir, following=following)

    def follow_champion(self) -> ReloadResponse | None:
        """Serve the model store's champion if a promotion or a rollback changed it since last seen."""
        return self.models.follow_champion()

    def follow_candidate(self) -> None:
        """With exploration on, shadow the model store's last refused candidate."""
        self.models.follow_candidate()

    def add_challenger(self, model_dir: str, name: str | None = None) -> ChallengerInfo:
        """Load a model directory as a shadow challenger (replacing one of the same name)."""
        return self.models.add_challenger(model_dir, name)

    def remove_challenger(self, name: str) -> None:
        """Stop a challenger deciding in the shadow."""
        self.models.remove_challenger(name)

    def model_info(self) -> ModelInfo:
        """Summary of the model served."""
        return self.models.info()

    def ready(self) -> ReadyResponse:
        """Readiness: a policy is loaded and the log writes."""
        return readiness(self.models.started, self.store, self.recorder.ok)

    # ------------------------------------------------------------------ decisions

    async def decide(self, run_id: str, req: DecideRequest) -> dict[str, Any]:
        """Fold the new events of ``run_id`` (creating it on the first call) and decide.

        The answer is a plain dict (DecideResponse fields), given once its log line is
        written. A call folding more than :data:`INLINE_EVENTS` events folds in a worker thread.
        """
        return await self.calls.decide(run_id, req)

    async def decide_body(self, run_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`decide` for a request body given as data (the HTTP hooks' in-process decide);
        a body that is not a valid ``DecideRequest`` raises :class:`TraceValidationError`."""
        try:
            req = DecideRequest.model_validate(body)
        except ValidationError as exc:
            issues = pydantic_issues(exc.errors(include_url=False))
            raise TraceValidationError(f"run {run_id!r}: the hook's events were refused", issues) from None
        return await self.calls.decide(run_id, req)

    async def decide_stateless(self, req: StatelessDecideRequest) -> dict[str, Any]:
        """Decide on a whole trace prefix; nothing is stored but the log line."""
        return await self.calls.decide_stateless(req)

    async def decide_batch(self, req: BatchDecideRequest) -> dict[str, Any]:
        """Decide for many runs; one run's error does not fail the others."""
        return await self.calls.decide_batch(req)

    # ------------------------------------------------------------------ runs

    def outcome(self, run_id: str, req: OutcomeRequest) -> OutcomeResponse:
        """Close the run and append its whole trace (format v1) to the trace log."""
        done = close_run(self.runs, self.recorder, run_id, req)
        self.update_gauges()
        self.metrics.outcomes.inc()
        self.learning.finished(self.models.serving.path)
        return done

    def delete(self, run_id: str) -> None:
        """Drop a live run without logging a trace (or forget that the store dropped it)."""
        self.runs.delete(run_id)

    def run_info(self, run_id: str) -> RunInfo:
        """State and current features of a live run."""
        return self.runs.info(run_id)

    def credit(self, run_id: str, **options: Any) -> dict[str, Any]:
        """Message-level credit of a live run's events so far (options: :func:`.credit.live_credit`)."""
        return live_credit(self.runs, self.models.serving.policy, run_id, **options)
