"""Append-only JSON Lines logs: one line per decision, one line per finished trace.

Each line goes to the kernel with a single ``write`` on an ``O_APPEND`` file
descriptor before the decision's response is sent, so a crash of the process
(even ``kill -9``) never loses a line a client has seen; ``fsync="always"``
also survives a power cut, ``"interval"`` bounds the loss to that many seconds.
An exclusive ``flock`` around each line lets several worker processes share one
file. Above ``max_bytes`` the file is renamed to ``<name>.<UTC time>.jsonl`` and
a new one starts; a restart appends to the current file, first cutting any torn
last line left by a crash so the log always parses.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import orjson

__all__ = ["DecisionLog", "JsonlLog"]

_log = logging.getLogger("stopserve.service")

FsyncPolicy = Literal["always", "interval"]


class JsonlLog:
    """One append-only JSON Lines file with size-based rotation."""

    def __init__(
        self,
        path: Path,
        *,
        fsync: FsyncPolicy = "interval",
        fsync_interval_s: float = 1.0,
        max_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        self.path = path
        self.fsync = fsync
        self.fsync_interval_s = fsync_interval_s
        self.max_bytes = max_bytes
        self.lines = 0
        self._lock = threading.Lock()
        self._dirty = False
        self._last_sync = time.monotonic()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = self._open()
        self._repair_tail()

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _repair_tail(self) -> None:
        """Cut a torn last line (a crash mid-write) so every line parses."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            size = os.fstat(self._fd).st_size
            if size == 0:
                return
            with self.path.open("rb") as fh:
                fh.seek(size - 1)
                if fh.read(1) == b"\n":
                    return
                keep = 0
                pos = size
                while pos > 0:
                    step = min(pos, 1 << 16)
                    pos -= step
                    fh.seek(pos)
                    chunk = fh.read(step)
                    cut = chunk.rfind(b"\n")
                    if cut >= 0:
                        keep = pos + cut + 1
                        break
            os.truncate(self.path, keep)
            _log.warning("%s: cut a torn last line (%d bytes) left by a crash", self.path, size - keep)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one line; raises ``OSError`` when it cannot be written."""
        data = orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._follow_rotation()
                size = os.fstat(self._fd).st_size
                if size and size + len(data) > self.max_bytes:
                    self._rotate()
                view = memoryview(data)
                while view:
                    n = os.write(self._fd, view)
                    view = view[n:]
                self.lines += 1
                if self.fsync == "always":
                    os.fsync(self._fd)
                else:
                    self._dirty = True
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        if self.fsync == "interval" and time.monotonic() - self._last_sync >= self.fsync_interval_s:
            self.sync()

    def _follow_rotation(self) -> None:
        # another worker process may have rotated the file: write to the new one
        try:
            current = os.stat(self.path).st_ino
        except FileNotFoundError:
            current = -1
        if current != os.fstat(self._fd).st_ino:
            old = self._fd
            self._fd = self._open()
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            fcntl.flock(old, fcntl.LOCK_UN)
            os.close(old)

    def _rotate(self) -> None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%f")
        target = self.path.with_name(f"{self.path.stem}.{stamp}{self.path.suffix}")
        os.fsync(self._fd)
        os.rename(self.path, target)
        self._follow_rotation()
        _log.info("rotated %s to %s", self.path, target.name)

    def sync(self) -> None:
        """fsync pending lines (called on the interval and at shutdown)."""
        with self._lock:
            if self._dirty:
                os.fsync(self._fd)
                self._dirty = False
            self._last_sync = time.monotonic()

    def close(self) -> None:
        """Sync and close."""
        self.sync()
        with self._lock:
            os.close(self._fd)
            self._fd = -1


class DecisionLog:
    """The service's two logs in ``log_dir``: ``decisions.jsonl`` and ``traces.jsonl``.

    ``traces.jsonl`` holds finished runs in trace format v1, what ``stopserve train`` reads.
    """

    def __init__(
        self,
        log_dir: Path,
        *,
        fsync: FsyncPolicy = "interval",
        fsync_interval_s: float = 1.0,
        max_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        self.log_dir = log_dir
        options: dict[str, Any] = {
            "fsync": fsync,
            "fsync_interval_s": fsync_interval_s,
            "max_bytes": max_bytes,
        }
        self.decisions = JsonlLog(log_dir / "decisions.jsonl", **options)
        self.traces = JsonlLog(log_dir / "traces.jsonl", **options)

    def decision(self, record: Mapping[str, Any]) -> None:
        """Append one decision line."""
        self.decisions.append(record)

    def trace(self, trace: Mapping[str, Any]) -> None:
        """Append one finished trace (format v1)."""
        self.traces.append(trace)

    def sync(self) -> None:
        """fsync both files."""
        self.decisions.sync()
        self.traces.sync()

    def close(self) -> None:
        """Sync and close both files."""
        self.decisions.close()
        self.traces.close()
