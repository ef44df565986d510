"""Is the port free? Checked before ``stopserve serve`` loads anything, and who holds it if not.

uvicorn reports a busy port only after the model has loaded and the start-up line was
printed; :func:`check_port` says it first, in one line, naming the process that listens
there when this user may see it (Linux ``/proc``; elsewhere the port alone).
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from stopserve.errors import ConfigError

__all__ = ["check_port", "holder_of"]

_LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp


def check_port(host: str, port: int) -> None:
    """Raise :class:`ConfigError` when ``host:port`` cannot be bound (in use, or not an address here)."""
    if port == 0:
        return  # the system picks a free one
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"host {host!r}: not an address of this machine ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                who = holder_of(port)
                held = f" by {who}" if who else ""
                raise ConfigError(
                    f"port {port} on {host} is already in use{held}: stop that process or pick another --port"
                ) from None
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def holder_of(port: int) -> str | None:
    """``"pid 123 (stopserve serve ...)"`` for the process listening on ``port``, if it can be seen."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    proc = Path("/proc")
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            fds = list((pid_dir / "fd").iterdir())
        except OSError:
            continue  # another user's process, or gone
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return f"pid {pid_dir.name} ({_command(pid_dir)})"
    return None


def _listening_inodes(port: int) -> set[str]:
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == _LISTEN and int(cols[1].rpartition(":")[2], 16) == port:
                found.add(cols[9])
    return found


def _command(pid_dir: Path) -> str:
    try:
        words = (pid_dir / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(w.decode(errors="replace") for w in words if w)
    return text if len(text) <= 120 else text[:117] + "..."
