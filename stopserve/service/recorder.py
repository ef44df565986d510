"""The decision and trace logs as the engine writes them, and whether they write.

:class:`Recorder` wraps :class:`~stopserve.service.log.DecisionLog` (None: the logs
are off): a decision line is committed from the event loop and awaited, so an answer
is given only once its line is written (durable under ``fsync="always"``); a failed
write turns ``ok`` false (``/readyz`` says so), counts in ``stopserve_log_write_errors``
and raises :class:`~stopserve.errors.LogUnavailableError` (503) to the caller.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, NoReturn

from stopserve.errors import LogUnavailableError
from stopserve.service.log import DecisionLog
from stopserve.service.metrics import Metrics
from stopserve.settings import Settings

__all__ = ["Recorder"]

_log = logging.getLogger("stopserve.service")


class Recorder:
    """The service's logs (``decisions.jsonl``, ``traces.jsonl``), opened by :meth:`open`."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.log: DecisionLog | None = None
        self.ok = True

    def open(self) -> None:
        """Open the logs in ``STOPSERVE_LOG_DIR`` (none when it is unset or empty)."""
        s = self.settings
        if s.log_dir is not None and str(s.log_dir):
            self.log = DecisionLog(
                s.log_dir,
                fsync=s.fsync,
                fsync_interval_s=s.fsync_interval_s,
                max_bytes=s.log_max_bytes,
                retain_bytes=s.log_retain_bytes,
            )

    async def commit(self, record: Mapping[str, Any]) -> None:
        """Write a decision line from the event loop; returns once written (durable under "always")."""
        if self.log is None:
            return
        try:
            waiter = self.log.submit_decision(record)
            if waiter is not None:
                await waiter
            self.ok = True
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> NoReturn:
        self.ok = False
        self.metrics.log_errors.inc()
        _log.error("decision log write failed: %s", exc)
        raise LogUnavailableError(f"the decision log cannot be written: {exc.strerror or exc}") from None

    def trace(self, trace: Mapping[str, Any]) -> None:
        """Append a finished run's trace; a failed write raises :class:`LogUnavailableError`."""
        if self.log is None:
            return
        try:
            self.log.trace(trace)
        except OSError as exc:
            self.metrics.log_errors.inc()
            self.ok = False
            raise LogUnavailableError(f"the trace log cannot be written: {exc.strerror or exc}") from None

    def sync(self) -> None:
        """fsync the logs (the interval policy's tick); a failure turns ``ok`` false."""
        if self.log is None:
            return
        try:
            self.log.sync()
        except OSError as exc:
            self.ok = False
            _log.error("log sync failed: %s", exc)

    def close(self) -> None:
        """Flush and close the logs."""
        if self.log is not None:
            self.log.close()
            self.log = None
