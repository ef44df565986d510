"""Client latency: a live decide on loopback, and the fail-safe paths when the sidecar is away.

``python bench/bench_client.py [--n 300]`` starts a real ``stopserve serve --no-model`` on a
free loopback port and times ``StopClient.decide`` (one new tool_use/return pair per call):

- live: the service answers (HTTP round trip, server-side fold and safety nets);
- refused: nothing listens (connection refused), first call, breaker closed;
- breaker open: calls during the cooldown after a failure (no network at all);
- silent: a listener that accepts and never answers (each call waits for the timeout).

Prints a markdown table (milliseconds).
"""

from __future__ import annotations

import argparse
import logging
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from servers import LiveServer, free_port  # noqa: E402

from stopserve.client import EventRecorder, StopClient  # noqa: E402

logging.disable(logging.WARNING)  # the fail-safe cases warn on purpose


def timed(n: int, call: Callable[[int], object]) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        call(i)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def row(name: str, ms: list[float]) -> str:
    ms = sorted(ms)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    return f"| {name} | {len(ms)} | {statistics.median(ms):.2f} | {p99:.2f} | {ms[-1]:.2f} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=300, help="calls per case")
    args = ap.parse_args()
    wide = {"max_turns": 10**9}
    rows = []
    with tempfile.TemporaryDirectory() as tmp, LiveServer(log_dir=Path(tmp), no_model=True) as srv:
        rec = EventRecorder()

        def live(i: int) -> object:
            rec.tool_use("bash", content=f"cmd {i}", tokens=100)
            rec.returned("bash", content=f"out {i}")
            return client.decide("bench-live", rec.drain())

        with StopClient(srv.url, safety=wide, timeout=2.0) as client:
            timed(20, live)  # warm the connection and the server
            rows.append(row("live (loopback, no model)", timed(args.n, live)))

    rec = EventRecorder()
    refused_first = []
    for k in range(min(args.n, 50)):
        with StopClient(f"http://127.0.0.1:{free_port()}", safety=wide, retries=1) as client:
            rec.returned("bash", content=str(k))
            t0 = time.perf_counter()
            client.decide(f"bench-refused-{k}", rec.drain())
            refused_first.append((time.perf_counter() - t0) * 1000)
    rows.append(row("refused, 1st call (1 retry)", refused_first))

    with StopClient(f"http://127.0.0.1:{free_port()}", safety=wide, cooldown=3600) as client:

        def open_breaker(i: int) -> object:
            rec.returned("bash", content=str(i))
            return client.decide("bench-open", rec.drain())

        open_breaker(-1)
        rows.append(row("breaker open (local only)", timed(args.n, open_breaker)))

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        silent = []
        for k in range(10):
            with StopClient(url, safety=wide, timeout=0.2, retries=1) as client:
                rec.returned("bash", content=str(k))
                t0 = time.perf_counter()
                client.decide(f"bench-silent-{k}", rec.drain())
                silent.append((time.perf_counter() - t0) * 1000)
        rows.append(row("silent server, timeout 200 ms (no retry after a timeout)", silent))

    print("| case | calls | median ms | p99 ms | max ms |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
