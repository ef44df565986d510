"""Open the run store the settings name: the one place that knows both backends.

The arrows run one way: :mod:`stopserve.service.store` (the protocol and the records) is
imported by both backends, :mod:`~stopserve.service.memory_store` and
:mod:`~stopserve.service.redis_store`, and by this module, which imports the backend asked
for (Redis only when ``STOPSERVE_STORE`` names it, with the ``[redis]`` extra installed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stopserve.service.store import KEEP_TTLS, EvictionCause, Run, RunStore

__all__ = ["open_store"]


def open_store(
    settings: Any,
    *,
    on_evict: Callable[[Run, EvictionCause], None] | None = None,
    load_safety: Callable[[dict[str, Any]], Any],
) -> RunStore:
    """The run store ``settings.store`` names: in memory (default) or Redis (``redis://...``)."""
    url = settings.store
    if url is None:
        from stopserve.service.memory_store import MemoryRunStore

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
