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

An exclusive ``flock`` around each write lets several processes share one file.
Above ``max_bytes`` the file is renamed to ``<name>.<UTC time>.jsonl`` and a new one
starts; rotated files beyond ``retain_bytes`` (all files of the log together) are
deleted, oldest first.

A write that fails (a full disk: ``ENOSPC`` after part of the line went out) is
undone: the file is cut back to its last whole line before the error is raised, so
the next line never lands on a fragment. On open, every line of the current file is
checked: a line that does not parse is repaired when a whole record ends it (a
fragment followed by a later record) and the rest is moved to ``<name>.quarantine``,
so the log always parses and no record that was answered is lost.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

import orjson

__all__ = ["DecisionLog", "JsonlLog", "log_files", "rotated_files"]

_log = logging.getLogger("stopserve.service")

FsyncPolicy = Literal["always", "interval"]

# a waiter for one line under group commit: an asyncio future (request on the event
# loop) or a concurrent future (a caller in a thread)
_Waiter = asyncio.Future[None] | concurrent.futures.Future[None]
#: The system call that writes (``os.write``): tests hand in one that runs out of space.
Writer = Callable[[int, bytes | memoryview], int]
#: Attempts to find the record that ends a torn line (each parses the rest of the line).
_SALVAGE_TRIES: Final = 256


class JsonlLog:
    """One append-only JSON Lines file with size-based rotation."""

    def __init__(
        self,
        path: Path,
        *,
        fsync: FsyncPolicy = "interval",
        fsync_interval_s: float = 1.0,
        max_bytes: int = 256 * 1024 * 1024,
        retain_bytes: int | None = None,
        write: Writer = os.write,
    ) -> None:
        self.path = path
        self._where = os.fspath(path)  # a str: os.stat of a Path converts it on every line
        self._ino = -1
        self.fsync = fsync
        self.fsync_interval_s = fsync_interval_s
        self.max_bytes = max_bytes
        self.retain_bytes = retain_bytes
        self._write = write
        self._torn_at: int | None = None  # a failed write could not be undone: cut here first
        self.lines = 0
        self.commits = 0  # fsyncs of group commit batches (concurrent lines share one)
        self._lock = threading.Lock()  # guards the descriptor, rotation and the counters
        self._dirty = False
        self._closed = False
        self._cond = threading.Condition(threading.Lock())  # guards the queue below
        self._queue: list[tuple[bytes, _Waiter]] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = self._open()
        self._repair()
        target = self._group_commit if fsync == "always" else self._interval_sync
        self._thread = threading.Thread(target=target, name=f"stopserve-log-{path.name}", daemon=True)
        self._thread.start()

    def _open(self) -> int:
        """Open the file for appending; remembers its inode (to see another process rotate it)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._ino = os.fstat(fd).st_ino
        return fd

    @property
    def quarantine(self) -> Path:
        """Where unreadable lines found on open are moved (``<name>.quarantine``)."""
        return self.path.with_suffix(".quarantine")

    def _repair(self) -> None:
        """Make every line of the file parse: repair torn lines, quarantine what cannot be read.

        One streaming pass checks every line (a clean file is left as it is); only when a
        line is bad is the file rewritten, beside it, and swapped in atomically.
        """
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            if os.fstat(self._fd).st_size == 0 or self._clean():
                return
            bad = 0
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            try:
                with (
                    self.path.open("rb") as src,
                    os.fdopen(fd, "wb") as out,
                    self.quarantine.open("ab") as quarantine,
                ):
                    for raw in src:
                        line = raw.rstrip(b"\n")
                        if not line.strip():
                            continue
                        if _is_record(line):
                            out.write(line + b"\n")
                            continue
                        bad += 1
                        cut = _salvage(line)
                        quarantine.write((line if cut is None else line[:cut]) + b"\n")
                        if cut is not None:
                            out.write(line[cut:] + b"\n")
                    for fh in (out, quarantine):
                        fh.flush()
                        os.fsync(fh.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            old, self._fd = self._fd, self._open()
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            fcntl.flock(old, fcntl.LOCK_UN)
            os.close(old)
            _log.warning(
                "%s: %d unreadable line(s) repaired or moved to %s (torn by a crash or a full disk)",
                self.path,
                bad,
                self.quarantine.name,
            )
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _clean(self) -> bool:
        """Every line ends with a newline and parses as a JSON object."""
        with self.path.open("rb") as fh:
            for raw in fh:
                if not raw.endswith(b"\n") or not _is_record(raw):
                    return False
        return True

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
        """Write whole lines under the file lock, rotating between lines when over ``max_bytes``.

        All or nothing per file: if a write fails part way, the file is cut back to its
        size before the write and the ``OSError`` is raised.
        """
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            self._follow_rotation()
            if self._torn_at is not None:
                os.ftruncate(self._fd, self._torn_at)  # still failing: raise, nothing is written
                self._torn_at = None
            size = os.fstat(self._fd).st_size  # under the file lock: no other writer moves it
            chunk: list[bytes] = []
            chunk_len = 0
            for data in lines:
                if size + chunk_len and size + chunk_len + len(data) > self.max_bytes:
                    self._write_all(b"".join(chunk), size)
                    chunk, chunk_len = [], 0
                    self._rotate()
                    size = 0
                chunk.append(data)
                chunk_len += len(data)
            self._write_all(chunk[0] if len(chunk) == 1 else b"".join(chunk), size)
            self.lines += len(lines)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _write_all(self, data: bytes, start: int) -> None:
        """Write ``data`` at the end of the file, ``start`` bytes long; cut back to it if that fails."""
        view = memoryview(data)
        try:
            while view:
                n = self._write(self._fd, view)
                view = view[n:]
        except OSError:
            self._undo(start)
            raise

    def _undo(self, size: int) -> None:
        """Cut the file back to ``size`` bytes (its last whole line before a failed write)."""
        try:
            os.ftruncate(self._fd, size)
        except OSError as exc:
            self._torn_at = size  # the next write cuts first; a restart repairs the line anyway
            _log.error("%s: cannot cut a failed write back to %d bytes: %s", self.path, size, exc)

    def _follow_rotation(self) -> None:
        # another worker process may have rotated the file: write to the new one
        try:
            current = os.stat(self._where).st_ino
        except FileNotFoundError:
            current = -1
        if current != self._ino:
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
        if self.retain_bytes is not None:
            self._prune(self.retain_bytes - self.max_bytes)

    def rotated(self) -> list[Path]:
        """The rotated files of this log, oldest first."""
        return rotated_files(self.path)

    def _prune(self, budget: int) -> None:
        """Delete the oldest rotated files until the rest hold at most ``budget`` bytes."""
        files = [(p, p.stat().st_size) for p in self.rotated()]
        total = sum(size for _, size in files)
        for path, size in files:
            if total <= budget:
                break
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                _log.warning("%s: deleted %s (%d bytes): log retention limit", self.path, path.name, size)
            total -= size

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
                    before = os.fstat(self._fd)
                    self._write_locked([data for data, _ in batch])
                    try:
                        os.fsync(self._fd)
                    except OSError:
                        # not durable: nobody is answered, so the batch's lines go (those in
                        # this file: a rotation part way left the first ones in the rotated file)
                        same = os.fstat(self._fd).st_ino == before.st_ino
                        self._undo(before.st_size if same else 0)
                        raise
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


def rotated_files(path: Path) -> list[Path]:
    """The rotated files of the log at ``path`` (``<name>.<UTC time>.jsonl``), oldest first."""
    stem, suffix = path.stem, path.suffix
    found = [
        p for p in path.parent.glob(f"{stem}.*{suffix}") if p.name[len(stem) + 1 : len(stem) + 2].isdigit()
    ]
    return sorted(found, key=lambda p: p.name)


def log_files(path: Path) -> list[Path]:
    """Every file of the log at ``path``, oldest first: the rotated ones, then the current one."""
    return [*rotated_files(path), *([path] if path.exists() else [])]


def _is_record(line: bytes) -> bool:
    try:
        return isinstance(orjson.loads(line), dict)
    except orjson.JSONDecodeError:
        return False


def _salvage(line: bytes) -> int | None:
    """Where the whole record that ends a torn line starts (a fragment, then a later line), if any."""
    pos = line.find(b"{", 1)
    tries = 0
    while pos > 0 and tries < _SALVAGE_TRIES:
        if _is_record(line[pos:]):
            return pos
        pos = line.find(b"{", pos + 1)
        tries += 1
    return None


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
        retain_bytes: int | None = None,
    ) -> None:
        self.log_dir = log_dir
        options: dict[str, Any] = {
            "fsync": fsync,
            "fsync_interval_s": fsync_interval_s,
            "max_bytes": max_bytes,
            "retain_bytes": retain_bytes,
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
