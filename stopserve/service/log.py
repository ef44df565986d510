"""Append-only JSON Lines logs: one line per decision, one line per finished trace.

Every line reaches the kernel before the decision's response is sent, so a crash
of the process (even ``kill -9``) never loses a line a client has seen.

- ``fsync="interval"``: the caller's thread writes the line (one ``write`` on an
  ``O_APPEND`` descriptor, microseconds, never an fsync); a background thread
  fsyncs every ``fsync_interval_s``, which bounds what a power cut can lose.
- ``fsync="always"``: group commit. Callers hand their line to one writer thread
  and wait; the writer writes every line queued since its last round in one
  ``write`` and fsyncs once, then wakes all of them. Each answer still waits for
  its own line to be durable, but concurrent requests share an fsync, and an
  asyncio caller waits without blocking the event loop (:meth:`JsonlLog.submit`).

An exclusive ``flock`` around each write lets several worker processes share one
file. Above ``max_bytes`` the file is renamed to ``<name>.<UTC time>.jsonl`` and a
new one starts; a restart appends to the current file, first cutting any torn last
line left by a crash so the log always parses.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import orjson

__all__ = ["DecisionLog", "JsonlLog"]

_log = logging.getLogger("stopserve.service")

FsyncPolicy = Literal["always", "interval"]

# a waiter for one line under group commit: an asyncio future (request on the event
# loop) or a concurrent future (a caller in a thread)
_Waiter = asyncio.Future[None] | concurrent.futures.Future[None]


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
        self.commits = 0  # fsyncs of group commit batches (concurrent lines share one)
        self._lock = threading.Lock()  # guards the descriptor, rotation and the counters
        self._dirty = False
        self._closed = False
        self._cond = threading.Condition(threading.Lock())  # guards the queue below
        self._queue: list[tuple[bytes, _Waiter]] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = self._open()
        self._repair_tail()
        target = self._group_commit if fsync == "always" else self._interval_sync
        self._thread = threading.Thread(target=target, name=f"stopserve-log-{path.name}", daemon=True)
        self._thread.start()

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

    # ------------------------------------------------------------------ writing

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one line (durable before returning under ``fsync="always"``); ``OSError`` if it cannot."""
        data = _line(record)
        if self.fsync != "always":
            self._write_now(data)
            return
        waiter: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._enqueue(data, waiter)
        waiter.result()

    def submit(self, record: Mapping[str, Any]) -> asyncio.Future[None] | None:
        """From the event loop: write one line; the future to await for durability, or None.

        Under ``"interval"`` the line is in the OS file when this returns (None);
        under ``"always"`` it is queued for the next group commit and the returned
        future completes once it is fsynced (or fails with the ``OSError``).
        """
        data = _line(record)
        if self.fsync != "always":
            self._write_now(data)
            return None
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._enqueue(data, waiter)
        return waiter

    def _write_now(self, data: bytes) -> None:
        with self._lock:
            if self._closed:
                raise OSError(f"{self.path}: log closed")
            self._write_locked([data])
            self._dirty = True

    def _enqueue(self, data: bytes, waiter: _Waiter) -> None:
        with self._cond:
            if self._closed:
                raise OSError(f"{self.path}: log closed")
            self._queue.append((data, waiter))
            if len(self._queue) == 1:
                self._cond.notify()

    def _write_locked(self, lines: list[bytes]) -> None:
        """Write whole lines under the file lock, rotating between lines when over ``max_bytes``."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            self._follow_rotation()
            size = os.fstat(self._fd).st_size
            chunk: list[bytes] = []
            chunk_len = 0
            for data in lines:
                if size + chunk_len and size + chunk_len + len(data) > self.max_bytes:
                    self._write_all(b"".join(chunk))
                    chunk, chunk_len = [], 0
                    self._rotate()
                    size = 0
                chunk.append(data)
                chunk_len += len(data)
            self._write_all(b"".join(chunk))
            self.lines += len(lines)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

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

    # ------------------------------------------------------------------ background threads

    def _group_commit(self) -> None:
        """Writer thread under ``"always"``: write and fsync each batch, then wake its waiters."""
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return  # closed and drained
                batch, self._queue = self._queue, []
            error: OSError | None = None
            try:
                with self._lock:
                    self._write_locked([data for data, _ in batch])
                    os.fsync(self._fd)
                    self.commits += 1
            except OSError as exc:
                error = exc
            _wake([w for _, w in batch], error)

    def _interval_sync(self) -> None:
        """Syncer thread under ``"interval"``: fsync pending lines every ``fsync_interval_s``."""
        while True:
            with self._cond:
                if self._closed:
                    return
                self._cond.wait(self.fsync_interval_s)
                if self._closed:
                    return
            try:
                self.sync()
            except OSError as exc:
                _log.error("%s: fsync failed: %s", self.path, exc)

    def sync(self) -> None:
        """fsync pending lines (called on the interval and at shutdown); never blocks writers."""
        with self._lock:
            if not self._dirty or self._fd < 0:
                return
            fd = os.dup(self._fd)  # fsync a duplicate outside the lock: writers go on meanwhile
            self._dirty = False
        try:
            os.fsync(fd)
        except OSError:
            self._dirty = True
            raise
        finally:
            os.close(fd)

    def close(self) -> None:
        """Write what is queued, sync and close."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()
        self.sync()
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _line(record: Mapping[str, Any]) -> bytes:
    return orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE)


def _wake(waiters: list[_Waiter], error: OSError | None) -> None:
    """Complete every waiter of a batch; asyncio ones with one call per event loop."""
    loops: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for w in waiters:
        if isinstance(w, asyncio.Future):
            loops.setdefault(w.get_loop(), []).append(w)
        elif error is None:
            w.set_result(None)
        else:
            w.set_exception(error)
    for loop, futures in loops.items():
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
            loop.call_soon_threadsafe(_resolve, futures, error)


def _resolve(futures: list[asyncio.Future[None]], error: OSError | None) -> None:
    for f in futures:
        if f.done():  # the request was cancelled (client gone); its line is written anyway
            continue
        if error is None:
            f.set_result(None)
        else:
            f.set_exception(error)


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
        """Append one decision line (from a thread; blocks until written, or durable under "always")."""
        self.decisions.append(record)

    def submit_decision(self, record: Mapping[str, Any]) -> asyncio.Future[None] | None:
        """Append one decision line from the event loop; await the result if not None."""
        return self.decisions.submit(record)

    def trace(self, trace: Mapping[str, Any]) -> None:
        """Append one finished trace (format v1)."""
        self.traces.append(trace)

    def sync(self) -> None:
        """fsync both files."""
        self.decisions.sync()
        self.traces.sync()

    def close(self) -> None:
        """Write what is queued, sync and close both files."""
        self.decisions.close()
        self.traces.close()
