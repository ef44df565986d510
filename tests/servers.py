"""Start a REAL ``stopserve serve`` (uvicorn) in a subprocess on a free loopback port.

>>> with LiveServer(log_dir=tmp_path, no_model=True) as server:   # doctest: +SKIP
...     httpx.get(server.url + "/healthz")

Reused by the service and client tests. The server's output goes to
``<log_dir>/server.out``; a server that dies or never answers fails the test with
that output.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import httpx

__all__ = ["LiveServer", "free_port"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LiveServer:
    """A ``stopserve serve`` subprocess; ``url`` is its base URL once started."""

    def __init__(
        self,
        *,
        log_dir: Path,
        model: Path | None = None,
        no_model: bool = False,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        python: str | os.PathLike[str] = sys.executable,
        command: Sequence[str] | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.output = self.log_dir / "server.out"
        base = list(command) if command is not None else [str(python), "-m", "stopserve.cli"]
        self.argv = [
            *base,
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-dir",
            str(log_dir),
        ]
        if model is not None:
            self.argv += ["--model", str(model)]
        if no_model:
            self.argv.append("--no-model")
        self.argv += list(args)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("STOPSERVE_")}
        self.env.update(env or {})
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LiveServer:
        """Start and wait until ``/healthz`` answers."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        out = self.output.open("ab")
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.read_output()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not answer within {self.startup_timeout}s:\n{self.read_output()}")

    def read_output(self) -> str:
        """What the server printed so far."""
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def kill(self) -> None:
        """``kill -9``: no shutdown, no flush."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """Graceful stop (SIGTERM), then SIGKILL after 15 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
