"""Helpers shared by the framework integrations."""

from __future__ import annotations

import time
import uuid
from datetime import datetime
from typing import Final

from stopserve.trace import Stop

__all__ = ["EXTRA_HINT", "RunClock", "missing_extra", "new_run_id", "stop_of"]

EXTRA_HINT: Final = "pip install 'stopserve[integrations]'"


def missing_extra(module: str, package: str, exc: ImportError) -> ImportError:
    """The ImportError to raise when a framework is not installed."""
    err = ImportError(f"{module} needs {package}, which is not installed: {EXTRA_HINT} ({exc})")
    err.name = exc.name
    return err


def new_run_id(prefix: str) -> str:
    """A fresh run id (unique across processes)."""
    return f"{prefix}{uuid.uuid4().hex}"


class RunClock:
    """Seconds since a run started, never going backwards (format v1 wants ordered ``t``)."""

    __slots__ = ("_last", "_start_mono", "_start_wall")

    def __init__(self) -> None:
        self._start_mono = time.monotonic()
        self._start_wall: float | None = None
        self._last = 0.0

    def now(self) -> float:
        """Time of an event happening now."""
        return self._clamp(time.monotonic() - self._start_mono)

    def at(self, when: datetime | None) -> float:
        """Time of an event stamped ``when`` (wall clock); the first stamp is t=0."""
        if when is None:
            return self.now()
        stamp = when.timestamp()
        if self._start_wall is None:
            self._start_wall = stamp
        return self._clamp(stamp - self._start_wall)

    def _clamp(self, t: float) -> float:
        t = max(self._last, round(max(t, 0.0), 6))
        self._last = t
        return t


def stop_of(reason: str | None, safety_net: str | None, limit: str | None) -> Stop | None:
    """The trace's ``stop`` record for a decision that said stop."""
    if reason is None:
        return None
    return Stop.model_validate(
        {"reason": reason, "by": "safety_net" if safety_net else "service", "limit": limit}
    )
