"""Live runs: found or created, events checked and folded under the caps, looked up, deleted.

:class:`Runs` is the run lifecycle over the run store (:mod:`stopserve.service.store`):
a run is created by its first decide call and never started over (a run the store
dropped, or one whose earlier events the store does not hold, is refused with
``run_evicted``: restarting it would reset its turn count and safety nets); its events
are folded all or nothing, after every cap is checked. A shared store's run is a copy
the call saves back; a conflict starts the call over (:data:`ATTEMPTS` tries,
:func:`backoff_s` between them).
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable, Sequence
from typing import Final

from stopserve.api import DecideRequest, RunInfo, StatelessDecideRequest
from stopserve.errors import (
    Issue,
    RunClosedError,
    RunEvictedError,
    RunLimitError,
    RunNotFoundError,
    TraceValidationError,
)
from stopserve.features import FEATURE_NAMES, LOOP_ID_WINDOW, RunState
from stopserve.safety import SafetyConfig
from stopserve.service.store import Closed, Evicted, Found, Run, RunStore, StoreUnavailableError, event_bytes
from stopserve.settings import Settings
from stopserve.trace import Event

__all__ = ["ATTEMPTS", "Runs", "backoff_s", "contended"]

#: Tries of a call whose shared run another call changed between its read and its write.
ATTEMPTS: Final = 16
_NO_DECISION: Final = {"decision"}


class Runs:
    """The live runs of one service process, in its run store."""

    def __init__(
        self,
        settings: Settings,
        store: RunStore,
        safety: Callable[[DecideRequest, SafetyConfig | None], SafetyConfig | None],
        on_change: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.store = store
        self._safety = safety  # the config a new run's first request asks for
        self._changed = on_change  # a run was added or removed (the gauges)
        self._create_lock = threading.Lock()

    # ------------------------------------------------------------------ limits

    def check_request(self, events: Sequence[Event]) -> None:
        """Refuse a request with more events than ``STOPSERVE_MAX_EVENTS_PER_REQUEST``."""
        limit = self.settings.max_events_per_request
        if len(events) > limit:
            raise RunLimitError(
                f"too many events in one request: {len(events)} > {limit}",
                [Issue(f"at most {limit} events per request; send them in several calls", path="events")],
            )

    # ------------------------------------------------------------------ found or created

    def new_state(self, topology: str | None, req: DecideRequest | StatelessDecideRequest) -> RunState:
        """A fresh featurizer state for a run (or a stateless prefix)."""
        if self.store.shared:
            # the engine skips seen events itself (all of a run's ids are in the store): the
            # featurizer's own id window then only serves the loop reports, and a small one
            # keeps the state each call reads and writes small; features are the same
            return RunState(topology=topology, budget=req.budget, seen_window=LOOP_ID_WINDOW)
        return RunState(topology=topology, budget=req.budget)

    def get_or_create(self, run_id: str, req: DecideRequest) -> Run:
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

    async def aget_or_create(self, run_id: str, req: DecideRequest) -> Run:
        """:meth:`get_or_create` from the event loop (a shared store is read without blocking it)."""
        if not self.store.shared:
            return self.get_or_create(run_id, req)
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
        safety = self._safety(req, None)
        now = self.store.now()
        run = Run(
            run_id=run_id,
            task_id=req.task_id or run_id,
            state=self.new_state(req.topology, req),
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
        self._changed()
        return run

    def lookup(self, run_id: str, *, whole: bool = False) -> Run:
        """The live run ``run_id`` (``whole``: a shared store's copy with all its journal), or why not."""
        return held(run_id, self.store.get(run_id, whole=whole))

    # ------------------------------------------------------------------ events

    def new_events(self, run: Run, events: Sequence[Event]) -> tuple[list[tuple[int, Event]], int]:
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

    def fold(self, run: Run, new: list[tuple[int, Event]], *, reserve: int = 0) -> int:
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

    # ------------------------------------------------------------------ info, deletion

    def delete(self, run_id: str) -> None:
        """Drop a live run without logging a trace (or forget that the store dropped it)."""
        found = self.store.get(run_id)
        if isinstance(found, Evicted):
            self.store.forget(run_id)
            return
        run = held(run_id, found)
        with run.lock:
            self.store.pop(run_id)
        self._changed()

    def info(self, run_id: str) -> RunInfo:
        """State and current features of a live run."""
        run = self.lookup(run_id)
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


def held(run_id: str, found: Found) -> Run:
    """The run found, or the error that says why there is none."""
    if isinstance(found, Run):
        return found
    if isinstance(found, Closed):
        raise RunClosedError(f"run {run_id!r} is closed: its outcome was posted")
    if isinstance(found, Evicted):
        raise _evicted_error(run_id, found, None)
    raise RunNotFoundError(f"no live run {run_id!r}: never created, or deleted")


# ---------------------------------------------------------------------- store retries


def backoff_s(attempt: int) -> float:
    """Seconds to wait before trying a conflicted call again: none at first, then jittered."""
    return 0.0 if attempt == 0 else random.uniform(0, min(0.05, 0.001 * 2**attempt))


def contended(run_id: str) -> StoreUnavailableError:
    """The error of a call that conflicted :data:`ATTEMPTS` times in a row."""
    return StoreUnavailableError(
        f"run {run_id!r}: {ATTEMPTS} tries in a row conflicted with other calls on the same run; retry"
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
