"""The live run store: bounded in runs and in bytes, in memory, behind one small interface.

:class:`RunStore` is the interface the service needs (get, add, charge, pop, forget,
sweep, count, bytes); :class:`MemoryRunStore` keeps runs in an ``OrderedDict`` in
least-recently used order, so LRU eviction and idle-TTL expiry are O(1) per call
(expired runs sit at the front). :class:`~stopserve.service.redis_store.RedisRunStore`
implements the same interface on Redis, so several replicas serve the same runs
(``shared``: a call works on a copy and saves it back, or starts over on a conflict).

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
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
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
    "MemoryRunStore",
    "Run",
    "RunStore",
    "StoreUnavailableError",
    "decision_bytes",
    "event_bytes",
    "open_store",
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


class MemoryRunStore:
    """In-process :class:`RunStore`: ``max_runs`` live runs, ``max_bytes`` in all, LRU eviction, idle TTL.

    The last ``max_evicted`` runs dropped (default ten times ``max_runs``) are remembered
    by a 64-bit hash of their id, about 150 bytes each (:class:`Evicted`); past that, only
    a caller that says a run had events before (``prior_events``) is protected.
    ``on_evict(run, cause)`` is called for every run dropped by the store itself.
    Thread-safe: the service also works on runs from a thread pool.
    """

    def __init__(
        self,
        *,
        max_runs: int,
        ttl_s: float,
        max_bytes: int | None = None,
        max_evicted: int | None = None,
        on_evict: Callable[[Run, EvictionCause], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_runs = max_runs
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self.max_evicted = max_evicted if max_evicted is not None else 10 * max_runs
        self._on_evict = on_evict
        self._clock = clock
        self._runs: OrderedDict[str, Run] = OrderedDict()
        self._closed: OrderedDict[str, None] = OrderedDict()  # the latest max_runs closed run ids
        # hash(run id) -> (cause, when): ids are not kept, so a tombstone costs the same for any id
        self._evicted: OrderedDict[int, tuple[EvictionCause, float]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    shared = False

    def now(self) -> float:
        """The store's clock (monotonic seconds)."""
        return self._clock()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def get(self, run_id: str, ids: Collection[str] = (), *, whole: bool = False) -> Found:
        now = self._clock()
        evicted: list[Run] = []
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                if run_id in self._closed:
                    return Closed(run_id)
                return self._tombstone(run_id)
            if now - run.last_seen_at > self.ttl_s:
                self._drop(run, "ttl", now)
                evicted.append(run)
            else:
                run.last_seen_at = now
                self._runs.move_to_end(run_id)
                return run
        self._notify(evicted, "ttl")
        with self._lock:
            return self._tombstone(run_id)

    def add(self, run: Run) -> None:
        now = self._clock()
        with self._lock:
            run.last_seen_at = now
            self._evicted.pop(hash(run.run_id), None)
            self._runs[run.run_id] = run
            self._runs.move_to_end(run.run_id)
            self._bytes += run.nbytes
            lru = self._shrink(run, now, by_count=True)
            over = self._shrink(run, now, by_count=False)
        self._notify(lru, "lru")
        self._notify(over, "bytes")

    def charge(self, run: Run, nbytes: int) -> None:
        now = self._clock()
        with self._lock:
            if self._runs.get(run.run_id) is run:
                self._bytes += nbytes - run.nbytes
            run.nbytes = nbytes
            over = self._shrink(run, now, by_count=False)
        self._notify(over, "bytes")

    async def aget(self, run_id: str, ids: Collection[str] = (), *, whole: bool = False) -> Found:
        return self.get(run_id)

    def save(self, run: Run, record: dict[str, Any] | None = None) -> bool:
        return True  # the run is the live one: changed in place

    async def asave(self, run: Run, record: dict[str, Any] | None = None) -> bool:
        return True

    def close(self, run: Run) -> bool:
        with self._lock:
            if self._runs.pop(run.run_id, None) is not None:
                self._bytes -= run.nbytes
            self._closed[run.run_id] = None
            while len(self._closed) > self.max_runs:
                self._closed.popitem(last=False)
        run.closed = True
        return True

    def reopen(self, run: Run) -> None:
        with self._lock:
            self._closed.pop(run.run_id, None)
        run.closed = False
        self.add(run)

    def pop(self, run_id: str) -> None:
        with self._lock:
            run = self._runs.pop(run_id, None)
            if run is not None:
                self._bytes -= run.nbytes

    def ping(self) -> None:
        return None

    def close_store(self) -> None:
        return None

    async def aclose_store(self) -> None:
        return None

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._evicted.pop(hash(run_id), None)

    def sweep(self) -> int:
        now = self._clock()
        evicted: list[Run] = []
        with self._lock:
            # least recently used first: stop at the first run still fresh
            while self._runs:
                run = next(iter(self._runs.values()))
                if now - run.last_seen_at <= self.ttl_s:
                    break
                self._drop(run, "ttl", now)
                evicted.append(run)
        self._notify(evicted, "ttl")
        return len(evicted)

    def __len__(self) -> int:
        return len(self._runs)

    def _shrink(self, keep: Run, now: float, *, by_count: bool) -> list[Run]:
        """Under the lock: drop least recently used runs (never ``keep``) while over a cap."""
        dropped: list[Run] = []
        while len(self._runs) > 1:
            if by_count:
                if len(self._runs) <= self.max_runs:
                    break
            elif self.max_bytes is None or self._bytes <= self.max_bytes:
                break
            old = next(iter(self._runs.values()))
            if old is keep:
                break  # the run being charged is the only one left to drop: its own cap bounds it
            self._drop(old, "bytes" if not by_count else "lru", now)
            dropped.append(old)
        return dropped

    def _drop(self, run: Run, cause: EvictionCause, now: float) -> None:
        del self._runs[run.run_id]
        self._bytes -= run.nbytes
        key = hash(run.run_id)
        self._evicted[key] = (cause, now)
        self._evicted.move_to_end(key)
        while len(self._evicted) > self.max_evicted:
            self._evicted.popitem(last=False)

    def _tombstone(self, run_id: str) -> Evicted | None:
        found = self._evicted.get(hash(run_id))
        return Evicted(run_id, *found) if found is not None else None

    def _notify(self, runs: list[Run], cause: EvictionCause) -> None:
        if self._on_evict is not None:
            for run in runs:
                self._on_evict(run, cause)


#: How long a shared store remembers an expired, evicted or closed run, in run TTLs.
KEEP_TTLS: Final = 10


def open_store(
    settings: Any,
    *,
    on_evict: Callable[[Run, EvictionCause], None] | None = None,
    load_safety: Callable[[dict[str, Any]], Any],
) -> RunStore:
    """The run store ``settings.store`` names: in memory (default) or Redis (``redis://...``)."""
    url = settings.store
    if url is None:
        return MemoryRunStore(
            max_runs=settings.max_runs,
            ttl_s=settings.run_ttl_s,
            max_bytes=settings.max_store_bytes,
            on_evict=on_evict,
        )
    from stopserve.extras import require

    require("redis", "redis", "msgpack", what="STOPSERVE_STORE=redis://...")
    from stopserve.service.redis_store import RedisRunStore

    return RedisRunStore(
        url, ttl_s=settings.run_ttl_s, keep_s=KEEP_TTLS * settings.run_ttl_s, load_safety=load_safety
    )
