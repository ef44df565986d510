"""The hook's state directory: one small JSON file per run, and append-only logs.

Layout (default ``<user cache dir>/stopserve/hooks``, or ``--state-dir`` /
``STOPSERVE_HOOK_STATE``)::

    runs/<run id>.json     transcript offset, the mapper's state, unsent events,
                           consecutive blocks -- written atomically (temp file + rename)
    runs/<run id>.lock     held while a call updates its run (parallel tool calls)
    hook.log               one line per call: what was decided and why, errors
    decisions.jsonl        one record per decision (shadow mode: what would have been blocked)
    labels.jsonl           outcomes given with ``stopserve label``

Logs rotate to ``<name>.1`` past a size bound; run files untouched for
:data:`RUN_TTL_DAYS` days are removed when a new run starts.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import orjson

__all__ = ["LOG_MAX_BYTES", "RUN_TTL_DAYS", "StateDir", "default_state_dir", "replace_file"]

LOG_MAX_BYTES: Final = 32 * 1024 * 1024
RUN_TTL_DAYS: Final = 30
_ENV: Final = "STOPSERVE_HOOK_STATE"


def default_state_dir() -> Path:
    """``$STOPSERVE_HOOK_STATE``, else ``hooks`` in the user's cache directory (platformdirs)."""
    env = os.environ.get(_ENV)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("stopserve", appauthor=False)) / "hooks"


class StateDir:
    """The state directory (created on first write)."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_state_dir()
        self.runs = self.root / "runs"

    def _file(self, run_id: str, suffix: str) -> Path:
        return self.runs / f"{run_id.replace(':', '+')}{suffix}"  # ':' is not allowed on Windows

    @contextlib.contextmanager
    def lock(self, run_id: str, deadline: float) -> Iterator[None]:
        """Hold the run's lock (waits until ``deadline``, a ``time.monotonic()`` value).

        Raises ``TimeoutError`` when another call holds it past the deadline. POSIX
        ``flock``; elsewhere no lock is taken (calls of one run are then not serialised).
        """
        self.runs.mkdir(parents=True, exist_ok=True)
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            yield
            return
        fd = os.open(self._file(run_id, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"run {run_id} is locked by another hook call") from None
                    time.sleep(0.005)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def load(self, run_id: str) -> dict[str, Any] | None:
        """The run's state, or ``None`` when there is none (or it cannot be read: logged)."""
        path = self._file(run_id, ".json")
        try:
            data = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError) as exc:
            self.log(f"state of run {run_id} unreadable ({exc}); starting it afresh")
            return None
        return data if isinstance(data, dict) else None

    def save(self, run_id: str, data: Mapping[str, Any]) -> None:
        """Write the run's state atomically: a reader sees the old state or the new one."""
        self.runs.mkdir(parents=True, exist_ok=True)
        path = self._file(run_id, ".json")
        # a name of this process's own (tempfile costs the hook process its import)
        tmp = str(self.runs / f".tmp-{os.getpid()}-{time.monotonic_ns()}.json")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(orjson.dumps(data))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def sweep(self, days: float = RUN_TTL_DAYS) -> int:
        """Remove run files untouched for ``days``; how many were removed."""
        cutoff = time.time() - days * 86400
        removed = 0
        try:
            entries = list(os.scandir(self.runs))
        except OSError:
            return 0
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.is_file() and entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
        return removed

    def append(self, name: str, record: Mapping[str, Any]) -> None:
        """Append one JSON line to ``<root>/<name>`` (rotated past :data:`LOG_MAX_BYTES`)."""
        self._write(name, orjson.dumps(record) + b"\n")

    def log(self, message: str) -> None:
        """Append one line to ``hook.log``, with a UTC time stamp."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._write("hook.log", f"{stamp} {message}\n".encode("utf-8", "replace"))

    def _write(self, name: str, line: bytes) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / name
        with contextlib.suppress(OSError):
            if path.stat().st_size > LOG_MAX_BYTES:
                os.replace(path, path.with_name(name + ".1"))
        # one write on an O_APPEND descriptor: lines of concurrent calls do not interleave
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def records(self, name: str) -> Iterator[dict[str, Any]]:
        """The JSON lines of a log (its rotated part first); lines that are not JSON objects are skipped."""
        for path in (self.root / f"{name}.1", self.root / name):
            try:
                lines = path.read_bytes().splitlines()
            except FileNotFoundError:
                continue
            for line in lines:
                try:
                    obj = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(obj, dict):
                    yield obj


def replace_file(path: Path, data: bytes) -> Path | None:
    """Write ``data`` to ``path`` atomically, after copying the old file to a backup (returned).

    The backup is ``<file>.<UTC time>.stopserve.bak`` beside it, with the old file's mode
    kept on the new one; a settings file a harness reads is never seen half-written.
    """
    import shutil
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    backup = None
    if path.exists():
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        backup = path.with_name(f"{path.name}.{stamp}.stopserve.bak")
        n = 1
        while backup.exists():
            n += 1
            backup = path.with_name(f"{path.name}.{stamp}-{n}.stopserve.bak")
        shutil.copy2(path, backup)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        if backup is not None:
            shutil.copymode(backup, tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return backup
