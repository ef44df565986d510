"""The in-process run store: live runs in least-recently used order, bounded in runs and bytes.

:class:`MemoryRunStore` implements :class:`~stopserve.service.store.RunStore` with an
``OrderedDict`` in least-recently used order, so LRU eviction and idle-TTL expiry are O(1)
per call (expired runs sit at the front). What it drops it remembers (:class:`Evicted`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import Any

from stopserve.service.store import Closed, Evicted, EvictionCause, Found, Run

__all__ = ["MemoryRunStore"]


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
        self._outcomes = 0
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

    def count_outcome(self) -> int:
        """Count one finished run; the runs finished in this process so far."""
        with self._lock:
            self._outcomes += 1
            return self._outcomes

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
