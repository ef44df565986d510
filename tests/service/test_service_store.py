"""The bounded run store: LRU eviction, idle TTL, eviction callbacks."""

from __future__ import annotations

from stopserve.features import RunState
from stopserve.service.memory_store import MemoryRunStore
from stopserve.service.store import Evicted, Run


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(rid: str) -> Run:
    return Run(run_id=rid, task_id=rid, state=RunState(), created_at=0.0, last_seen_at=0.0)


def test_lru_evicts_least_recently_used() -> None:
    gone: list[tuple[str, str]] = []
    store = MemoryRunStore(max_runs=2, ttl_s=100, on_evict=lambda r, c: gone.append((r.run_id, c)))
    store.add(run("a"))
    store.add(run("b"))
    assert store.get("a") is not None  # a is now the most recent
    store.add(run("c"))
    assert gone == [("b", "lru")]
    assert isinstance(store.get("b"), Evicted) and isinstance(store.get("a"), Run) and len(store) == 2


def test_idle_ttl_on_get_and_sweep() -> None:
    clock = Clock()
    gone: list[tuple[str, str]] = []
    store = MemoryRunStore(
        max_runs=10, ttl_s=5, clock=clock, on_evict=lambda r, c: gone.append((r.run_id, c))
    )
    for rid in ("a", "b", "c"):
        store.add(run(rid))
        clock.now += 2
    # now = 6: a idle 6 s, b 4 s, c 2 s
    assert isinstance(store.get("a"), Evicted)
    assert store.sweep() == 0
    clock.now = 9.5  # b idle 7.5, c idle 5.5
    assert store.sweep() == 2
    assert gone == [("a", "ttl"), ("b", "ttl"), ("c", "ttl")] and len(store) == 0


def test_get_refreshes_idle_time() -> None:
    clock = Clock()
    store = MemoryRunStore(max_runs=10, ttl_s=5, clock=clock)
    store.add(run("a"))
    for _ in range(5):
        clock.now += 4
        assert isinstance(store.get("a"), Run)
    store.pop("a")
    assert store.get("a") is None and len(store) == 0
