"""The live run store's interface, and what every store holds: runs, bounded in runs and bytes.

:class:`RunStore` is the protocol the service needs (get, add, charge, pop, forget,
sweep, count, bytes); two backends implement it and import this module, never each
other: :class:`~stopserve.service.memory_store.MemoryRunStore` (in this process) and
:class:`~stopserve.service.redis_store.RedisRunStore` (on Redis, so several replicas
serve the same runs; ``shared``: a call works on a copy and saves it back, or starts over
on a conflict). :func:`stopserve.service.stores.open_store` picks one from the settings.

A run the store drops is not forgotten silently: :meth:`RunStore.get` answers
:class:`Evicted` for its id (LRU, byte cap or idle TTL), an explicit outcome the
service turns into 409 ``run_evicted``, so a run is never started over at turn 1
with its safety nets reset. The Redis store reports an expired or evicted run the same
way (a marker key that outlives the run).

Memory: each run is charged the bytes it retains (:func:`event_bytes`,
:func:`decision_bytes`, an upper bound checked against ``tracemalloc`` in the
tests); the store keeps the total under ``max_bytes`` by evicting the least
recently used runs.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

from stopserve.errors import StoreUnavailableError
from stopserve.features import RunState
from stopserve.trace import Budget

__all__ = [
    "KEEP_TTLS",
    "RUN_BASE_BYTES",
    "Closed",
    "Evicted",
    "EvictionCause",
    "Found",
    "Run",
    "RunStore",
    "StoreUnavailableError",
    "decision_bytes",
    "event_bytes",
]

EvictionCause = Literal["lru", "ttl", "bytes"]

#: An empty run: the Run record, its RunState (windows, deques, dicts) and its locks (measured: ~9 KiB).
RUN_BASE_BYTES: Final = 12 * 1024
#: Per event beyond its strings: list slot, set and dict entries, RunState window entries.
_EVENT_OVERHEAD: Final = 320
#: Per decision beyond its JSON text: the dict entry or list slot.
_DECISION_OVERHEAD: Final = 120


def event_bytes(text: str, event_id: str, agent: str, ref: str | None) -> int:
    """Bytes one folded event retains: its JSON text, its id (kept twice), what the featurizer keeps."""
    size = sys.getsizeof
    return size(text) + 2 * size(event_id) + size(agent) + (size(ref) if ref else 0) + _EVENT_OVERHEAD


def decision_bytes(text: str) -> int:
    """Bytes one decision kept for the trace retains."""
    return sys.getsizeof(text) + _DECISION_OVERHEAD


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
    # The journal: what the finished trace is written from. A run held in this process has all
    # of it; a copy loaded from a shared store has only what this call added (from n_events /
    # n_journal at load), unless it was loaded whole (``first_event == 0``).
    events: list[str] = field(default_factory=list)  # compact JSON of each event, from first_event on
    event_ids: set[str] = field(default_factory=set)  # ids folded (a shared copy: those of this request)
    decisions: list[tuple[int, str]] = field(default_factory=list)  # (event index, decision JSON), in order
    n_events: int = 0
    first_event: int = 0  # run index of events[0]
    first_decision: int = 0  # journal index of decisions[0]
    last_t: float = 0.0
    n_decisions: int = 0
    last_response: dict[str, Any] | None = None
    last_proposed: bool = False
    last_event_id: str | None = None
    nbytes: int = RUN_BASE_BYTES  # what the store charges this run
    closed: bool = False  # its outcome was posted (a call that waited on its lock finds it so)
    version: int = 0  # a shared store's version of the run when loaded; 0: not stored yet
    last_record: dict[str, Any] | None = None  # a shared copy: the last decision's log record
    explored: bool = False  # exploration made one of its stops a continue (later ones: explore_steps)
    shadow: dict[str, int] = field(default_factory=dict)  # each challenger's first stop turn in this run
    shadow_done: bool = False  # the champion stopped it: the challengers' stops were compared
    lock: threading.Lock = field(default_factory=threading.Lock)  # its state, against the thread pool
    alock: asyncio.Lock = field(default_factory=asyncio.Lock)  # its decide calls, across the log wait

    @property
    def n_journal(self) -> int:
        """Decisions in the run's journal (held here or not)."""
        return self.first_decision + len(self.decisions)


@dataclass(frozen=True, slots=True)
class Evicted:
    """What :meth:`RunStore.get` answers for a run the store dropped (not for a closed or deleted one)."""

    run_id: str
    cause: EvictionCause
    at: float  # the store's clock when it was dropped (a shared store: when it was last used)
    why: str | None = None  # what dropped it, when the cause alone does not say (a shared store)


@dataclass(frozen=True, slots=True)
class Closed:
    """What :meth:`RunStore.get` answers for a run whose outcome was posted."""

    run_id: str


Found = Run | Evicted | Closed | None


class RunStore(Protocol):
    """What the service needs from a run store.

    ``shared`` stores keep runs outside the process (Redis): :meth:`get` returns a copy
    that the caller changes and hands back to :meth:`save`, which fails (False) when
    another call saved the run in between; the caller then starts over from :meth:`get`.
    The in-process store returns the live run and always saves.
    """

    shared: bool

    def now(self) -> float:
        """The store's clock (seconds)."""

    def get(self, run_id: str, ids: Collection[str] = (), *, whole: bool = False) -> Found:
        """The run, marked as used now; :class:`Evicted` or :class:`Closed`; None if unknown.

        ``ids``: the event ids of the request (a shared copy's ``event_ids`` says which of
        them the run already folded); ``whole``: with every event and decision (the trace).
        """

    async def aget(self, run_id: str, ids: Collection[str] = (), *, whole: bool = False) -> Found:
        """:meth:`get` from the event loop."""

    def add(self, run: Run) -> None:
        """Add a new run (charged ``run.nbytes``), evicting the least recently used ones when full."""

    def charge(self, run: Run, nbytes: int) -> None:
        """Set what ``run`` retains; evict other runs, least recently used first, above the byte cap."""

    def save(self, run: Run, record: dict[str, Any] | None = None) -> bool:
        """Store what the caller changed (``record``: its decision's log line); False on a conflict."""

    async def asave(self, run: Run, record: dict[str, Any] | None = None) -> bool:
        """:meth:`save` from the event loop."""

    def close(self, run: Run) -> bool:
        """Mark the run closed and drop it; False on a conflict (it changed since :meth:`get`)."""

    def reopen(self, run: Run) -> None:
        """Undo :meth:`close` (its trace could not be written): the run as the caller holds it."""

    def pop(self, run_id: str) -> None:
        """Drop a run (deleted), and what the store remembers of it."""

    def forget(self, run_id: str) -> None:
        """Drop the eviction record of ``run_id`` (the caller starts it again, whole)."""

    def count_outcome(self) -> int:
        """Count one finished run; the runs finished so far (a shared store: every replica's)."""

    def sweep(self) -> int:
        """Periodic work (drop idle runs past their TTL); how many runs were dropped."""

    def ping(self) -> None:
        """Raise :class:`StoreUnavailableError` if the store cannot be reached."""

    def close_store(self) -> None:
        """Release connections."""

    async def aclose_store(self) -> None:
        """Release the event loop's connections."""

    @property
    def nbytes(self) -> int:
        """Bytes charged to the live runs."""

    def __len__(self) -> int:
        """Live runs."""


#: How long a shared store remembers an expired, evicted or closed run, in run TTLs.
KEEP_TTLS: Final = 10
