"""Start a REAL ``redis-server`` on a free loopback port, for the shared run store's tests.

>>> with RedisServer(tmp_path) as redis:   # doctest: +SKIP
...     Settings(store=redis.url)

Tests that need it skip with a clear message when ``redis-server`` is not installed
(``.ci/run`` installs it from the distribution's packages, so CI runs them).
``persist=True`` turns on the append-only file (fsync every write), so a restart finds
the runs again; ``restart()`` stops it (SIGTERM, or SIGKILL with ``hard=True``) and
starts it again on the same port and data directory.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import pytest
from servers import free_port

__all__ = ["RedisServer", "need_redis"]


def need_redis() -> str:
    """The redis-server binary, or skip the test saying how to get it."""
    path = shutil.which("redis-server")
    if path is None:
        pytest.skip("redis-server not installed (apt-get install -y redis-server; CI installs it)")
    return path


class RedisServer:
    """A ``redis-server`` subprocess on 127.0.0.1; ``url`` once started."""

    def __init__(self, data_dir: Path, *, persist: bool = False, maxmemory: str | None = None) -> None:
        self.binary = need_redis()
        self.dir = Path(data_dir)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.persist = persist
        self.maxmemory = maxmemory
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
        ]
        if self.persist:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        if self.maxmemory is not None:
            args += ["--maxmemory", self.maxmemory, "--maxmemory-policy", "volatile-ttl"]
        return args

    def start(self) -> RedisServer:
        self.dir.mkdir(parents=True, exist_ok=True)
        out = (self.dir / "redis.out").open("ab")
        self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT)
        out.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited:\n{(self.dir / 'redis.out').read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not answer within 20 s")

    def stop(self, *, hard: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGKILL if hard else signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def restart(self, *, hard: bool = False) -> None:
        self.stop(hard=hard)
        self.start()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(hard=True)
