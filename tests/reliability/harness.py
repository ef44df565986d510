"""The attacks of issue 13 as reusable pieces: load, kill -9, full disk, hostile bodies, memory.

Used by the reliability tests (tests/reliability/) and by ``bench/bench_reliability.py``,
which runs them longer and records the figures in ``bench/RESULTS.md``. Everything
runs against a real ``stopserve serve`` on loopback (:class:`servers.LiveServer`).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

__all__ = [
    "Disk",
    "Load",
    "fill_hostile_run",
    "hostile_bodies",
    "logged_decisions",
    "rss_kib",
    "turn",
]


def turn(i: int, prefix: str = "") -> list[dict[str, Any]]:
    """One orchestrator turn: a tool call and its result (a decision point)."""
    return [
        {"id": f"{prefix}c{i}", "t": 2.0 * i, "type": "tool_use", "agent": "a", "tokens": 10},
        {"id": f"{prefix}r{i}", "t": 2.0 * i + 1, "type": "return", "agent": "b"},
    ]


@dataclass
class Load:
    """Client threads deciding turn after turn on runs of their own; what each answer was."""

    url: str
    workers: int = 4
    turns_per_run: int = 20
    received: list[tuple[str, int]] = field(default_factory=list)  # (run id, seq of its answer) of 200s
    statuses: dict[int, int] = field(default_factory=dict)
    sent: int = 0
    latencies: list[float] = field(default_factory=list)
    tag: str = "w"
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Load:
        for k in range(self.workers):
            t = threading.Thread(target=self._work, args=(k,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def wait_for(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.received) < n and time.monotonic() < deadline:
            time.sleep(0.02)

    @property
    def server_errors(self) -> int:
        """Answers 500 and above other than 503 (503: the log cannot be written, said plainly)."""
        return sum(n for status, n in self.statuses.items() if status >= 500 and status != 503)

    def _work(self, k: int) -> None:
        with httpx.Client(base_url=self.url, timeout=10.0) as http:
            run = 0
            while not self._stop.is_set():
                rid = f"{self.tag}{k}-{run}-{os.getpid()}"
                for i in range(self.turns_per_run):
                    start = time.perf_counter()
                    try:
                        r = http.post(f"/v1/runs/{rid}/decide", json={"events": turn(i)})
                    except httpx.TransportError:
                        if self._stop.is_set():
                            return
                        time.sleep(0.05)  # the server is down (kill -9) or restarting
                        break
                    elapsed = time.perf_counter() - start
                    with self._lock:
                        self.sent += 1
                        self.statuses[r.status_code] = self.statuses.get(r.status_code, 0) + 1
                        if r.status_code == 200:
                            self.received.append((rid, i))
                            self.latencies.append(elapsed)
                    if self._stop.is_set():
                        return
                run += 1


def logged_decisions(log_dir: Path) -> set[tuple[str, int]]:
    """(run id, turn index) of every decision line in the log, rotated files included.

    Raises if any line of any file does not parse: a log must always parse whole.
    """
    out: set[tuple[str, int]] = set()
    for path in sorted(log_dir.glob("decisions*.jsonl")):
        raw = path.read_bytes()
        for line in raw.splitlines():
            row = json.loads(line)
            event = str(row.get("event_id") or "")
            if event.startswith("r") and event[1:].isdigit():
                out.add((row["run_id"], int(event[1:])))
    return out


def rss_kib(pid: int) -> tuple[int, int]:
    """(resident now, peak resident) of a process in KiB, from /proc."""
    now = peak = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            now = int(line.split()[1])
        elif line.startswith("VmHWM:"):
            peak = int(line.split()[1])
    return now, peak


def fill_hostile_run(http: httpx.Client, calls: int, run_id: str = "hostile") -> None:
    """Grow one run with fat events (8 x 12 kB a call) until the service refuses it (413) or ``calls`` end."""
    for k in range(calls):
        fat = [
            {"id": f"f{k}-{j}", "t": k, "type": "return", "agent": "a", "n": "x" * 12_000} for j in range(8)
        ]
        if http.post(f"/v1/runs/{run_id}/decide", json={"events": fat}).status_code == 413:
            return


def hostile_bodies(max_body: int) -> dict[str, bytes]:
    """Maximum-size bodies: 100k tiny events (over the count limit), and 2,000 padded events (under it)."""
    many = orjson.dumps(
        {"events": [{"id": f"h{i}", "t": i, "type": "return", "agent": "x"} for i in range(100_000)]}
    )
    pad = max(0, (max_body - 2_000 * 120) // 2_000)
    padded = orjson.dumps(
        {
            "events": [
                {"id": f"p{i}", "t": i, "type": "return", "agent": "x", "note": "n" * pad}
                for i in range(2_000)
            ]
        }
    )
    return {"100k events": many[:max_body], "2,000 padded events": padded[:max_body]}


class Disk:
    """A small disk for the log: a tmpfs when mounting is permitted, else a file-size limit.

    ``fill()`` makes the next log writes fail the way a full disk does (ENOSPC on the
    tmpfs; EFBIG from ``RLIMIT_FSIZE`` set on the server with ``prlimit`` otherwise),
    part way through a line; ``free()`` gives the space back.
    """

    def __init__(self, root: Path, size: str = "4m") -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.kind = "rlimit"
        if os.environ.get("RELIABILITY_DISK", "tmpfs") == "tmpfs":  # RELIABILITY_DISK=rlimit: the other way
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(root)],
                capture_output=True,
                text=True,
                check=False,
            )
            self.kind = "tmpfs" if done.returncode == 0 else "rlimit"
        self.pid: int | None = None
        self._filler = root / "filler"

    def fill(self) -> None:
        if self.kind == "tmpfs":
            with self._filler.open("ab", buffering=0) as fh, contextlib.suppress(OSError):
                while True:
                    fh.write(b"\0" * 65536)
        else:
            assert self.pid is not None, "set Disk.pid to the server's pid"
            biggest = max((p.stat().st_size for p in self.root.rglob("*.jsonl")), default=0)
            _, hard = resource.prlimit(self.pid, resource.RLIMIT_FSIZE)
            resource.prlimit(self.pid, resource.RLIMIT_FSIZE, (biggest + 100, hard))  # soft limit only

    def free(self) -> None:
        if self.kind == "tmpfs":
            self._filler.unlink(missing_ok=True)
        else:
            assert self.pid is not None
            _, hard = resource.prlimit(self.pid, resource.RLIMIT_FSIZE)
            resource.prlimit(self.pid, resource.RLIMIT_FSIZE, (hard, hard))

    def close(self) -> None:
        if self.kind == "tmpfs":
            subprocess.run(["umount", "-l", str(self.root)], check=False, capture_output=True)

    def __enter__(self) -> Disk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def hostile_senders(url: str, body: bytes, clients: int) -> Iterator[dict[str, int]]:
    """Threads posting ``body`` to a decide route as fast as the server lets them; counts by status."""
    counts: dict[str, int] = {}
    stop = threading.Event()
    lock = threading.Lock()

    def send(k: int) -> None:
        n = 0
        with httpx.Client(base_url=url, timeout=30.0) as http:
            while not stop.is_set():
                n += 1
                try:
                    r = http.post(
                        f"/v1/runs/hostile-{k}-{n}/decide",
                        content=body,
                        headers={"content-type": "application/json"},
                    )
                    key = str(r.status_code)
                except httpx.TransportError as exc:  # the server closed the connection after its 413
                    key = type(exc).__name__
                with lock:
                    counts[key] = counts.get(key, 0) + 1

    threads = [threading.Thread(target=send, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    try:
        yield counts
    finally:
        stop.set()
        for t in threads:
            t.join(60)
