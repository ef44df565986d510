"""The live run store: bounded, in memory, behind one small interface.

:class:`RunStore` is the interface the service needs (get, create, pop, sweep,
count); :class:`MemoryRunStore` keeps runs in an ``OrderedDict`` in least-recently
used order, so LRU eviction and idle-TTL expiry are O(1) per call (expired runs
sit at the front). A shared store (Redis) can implement the same interface to
serve several replicas.

Memory per run is its :class:`~stopserve.features.RunState` (bounded) plus the
events kept for the trace log (compact JSON text, bounded by
``max_events_per_run``); ``docs/service.md`` has measured numbers.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from stopserve.features import RunState
from stopserve.trace import Budget

__all__ = ["EvictionCause", "MemoryRunStore", "Run", "RunStore"]

EvictionCause = Literal["lru", "ttl"]


@dataclass(eq=False, slots=True)
class Run:
    """One live run: its featurizer state, the events and decisions to log at the end."""

    run_id: str
    task_id: str
    state: RunState
    created_at: float
    last_seen_at: float
    topology: str | None = None
    system: str | None = None
    budget: Budget | None = None
    lam: float | None = None
    cost_share: float | None = None
    safety: Any = None  # SafetyConfig for this run, if the caller gave one
    events: list[str] = field(default_factory=list)  # compact JSON of each event
    event_ids: set[str] = field(default_factory=set)
    decisions: dict[int, str] = field(default_factory=dict)  # event index -> its decision (JSON)
    last_t: float = 0.0
    n_decisions: int = 0
    last_response: dict[str, Any] | None = None
    last_proposed: bool = False
    last_event_id: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)  # its state, against the thread pool
    alock: asyncio.Lock = field(default_factory=asyncio.Lock)  # its decide calls, across the log wait


class RunStore(Protocol):
    """What the service needs from a run store."""

    def get(self, run_id: str) -> Run | None:
        """The live run, marked as used now; None if unknown or expired."""

    def add(self, run: Run) -> None:
        """Add a new run, evicting the least recently used one when full."""

    def pop(self, run_id: str) -> Run | None:
        """Remove and return a run (closed or deleted)."""

    def sweep(self) -> int:
        """Drop idle runs past their TTL; return how many."""

    def __len__(self) -> int:
        """Live runs."""


class MemoryRunStore:
    """In-process :class:`RunStore`: ``max_runs`` live runs, LRU eviction, idle TTL.

    ``on_evict(run, cause)`` is called for every run dropped by the store itself.
    Thread-safe: the service decides in a thread pool.
    """

    def __init__(
        self,
        *,
        max_runs: int,
        ttl_s: float,
        on_evict: Callable[[Run, EvictionCause], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_runs = max_runs
        self.ttl_s = ttl_s
        self._on_evict = on_evict
        self._clock = clock
        self._runs: OrderedDict[str, Run] = OrderedDict()
        self._lock = threading.Lock()

    def now(self) -> float:
        """The store's clock (monotonic seconds)."""
        return self._clock()

    def get(self, run_id: str) -> Run | None:
        now = self._clock()
        evicted: list[Run] = []
        with self._lock:
            run = self._runs.get(run_id)
            if run is not None:
                if now - run.last_seen_at > self.ttl_s:
                    del self._runs[run_id]
                    evicted.append(run)
                    run = None
                else:
                    run.last_seen_at = now
                    self._runs.move_to_end(run_id)
        self._notify(evicted, "ttl")
        return run

    def add(self, run: Run) -> None:
        evicted: list[Run] = []
        with self._lock:
            run.last_seen_at = self._clock()
            self._runs[run.run_id] = run
            self._runs.move_to_end(run.run_id)
            while len(self._runs) > self.max_runs:
                _, old = self._runs.popitem(last=False)
                evicted.append(old)
        self._notify(evicted, "lru")

    def pop(self, run_id: str) -> Run | None:
        with self._lock:
            return self._runs.pop(run_id, None)

    def sweep(self) -> int:
        now = self._clock()
        evicted: list[Run] = []
        with self._lock:
            # least recently used first: stop at the first run still fresh
            while self._runs:
                run = next(iter(self._runs.values()))
                if now - run.last_seen_at <= self.ttl_s:
                    break
                self._runs.popitem(last=False)
                evicted.append(run)
        self._notify(evicted, "ttl")
        return len(evicted)

    def __len__(self) -> int:
        return len(self._runs)

    def _notify(self, runs: list[Run], cause: EvictionCause) -> None:
        if self._on_evict is not None:
            for run in runs:
                self._on_evict(run, cause)
