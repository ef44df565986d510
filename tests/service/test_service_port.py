"""``stopserve serve`` on a busy port says so at once, naming the process that holds it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from servers import LiveServer

from stopserve.service.port import check_port, holder_of


def test_serve_on_a_busy_port_is_one_line_before_the_model_loads(tmp_path: Path) -> None:
    with LiveServer(log_dir=tmp_path / "first", no_model=True) as first:
        assert first.proc is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("STOPSERVE_")}
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "stopserve.cli", "serve", "--port", str(first.port)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        took = time.monotonic() - start
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2, out
    assert out.count("\n") == 0 and "Traceback" not in out, out
    assert "serving" not in out, "refused before the start-up line, not after the model loaded"
    assert f"port {first.port} on 127.0.0.1 is already in use by pid {first.proc.pid}" in out
    assert "stopserve.cli serve" in out and "another --port" in out
    assert took < 30, f"{took:.1f} s: the shipped model was loaded first"


def test_a_free_port_passes_and_a_held_one_names_its_holder() -> None:
    import socket

    import pytest

    from stopserve.errors import ConfigError

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        assert holder_of(port) is None  # bound, not listening
        sock.listen(1)
        who = holder_of(port)
        assert who is not None and who.startswith(f"pid {os.getpid()} (")
        with pytest.raises(ConfigError, match=f"port {port} on 127.0.0.1 is already in use by pid"):
            check_port("127.0.0.1", port)
    check_port("127.0.0.1", port)  # free again
