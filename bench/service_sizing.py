"""Run-store bytes per run and the decision log's fsync cost, measured in process.

    python bench/service_sizing.py [--log-dir DIR]

Bytes per run: tracemalloc over many live runs of T turns (2 events a turn, a decision a turn),
divided by the run count; includes the featurizer state, the events kept for the trace log,
the decisions and the store's bookkeeping. fsync cost: the mean time of one decide call
(fold, policy, log line) with ``fsync=always`` and ``fsync=interval``, no HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

from stopserve.api import ApiEvent, DecideRequest
from stopserve.service.engine import Engine
from stopserve.service.metrics import Metrics
from stopserve.settings import Settings


def turn(i: int) -> list[ApiEvent]:
    return [
        ApiEvent(
            id=f"c{i}",
            t=2.0 * i,
            type="tool_use",
            agent="coder",
            tool="bash",
            tokens=1500,
            usd=0.002,
            content_ref=f"{i:016x}",
        ),
        ApiEvent(id=f"r{i}", t=2.0 * i + 1, type="return", agent="bash", content_ref=f"{i * 7:016x}"),
    ]


def bytes_per_run(n_runs: int, turns: int) -> float:
    engine = Engine(Settings(no_model=True, log_dir=None, max_runs=n_runs + 1), Metrics())
    engine.start()
    requests = [DecideRequest(events=turn(i)) for i in range(turns)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]

    async def feed() -> None:
        for r in range(n_runs):
            for req in requests:
                await engine.decide(f"run-{r}", req)

    asyncio.run(feed())
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / n_runs


def decide_cost(log_dir: Path, fsync: str, n: int) -> float:
    engine = Engine(Settings(no_model=True, log_dir=log_dir, fsync=fsync), Metrics())  # type: ignore[arg-type]
    engine.start()
    requests = [DecideRequest(events=turn(i)) for i in range(n)]
    times = []

    async def feed() -> None:  # one event loop, as in the service: each decide waits for its log line
        for i, req in enumerate(requests):
            start = time.perf_counter()
            await engine.decide(f"run-{i // 100}", req)
            times.append(time.perf_counter() - start)

    asyncio.run(feed())
    engine.close()
    return statistics.mean(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", type=Path, help="where to write the log (default: a temp dir)")
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    for turns in (10, 50, 200):
        b = bytes_per_run(300, turns)
        print(
            f"run store: {turns:4d} turns/run: {b / 1024:8.1f} KiB per run "
            f"({b / (2 * turns):.0f} B per event)"
        )
    base = args.log_dir or Path(tempfile.mkdtemp())
    for fsync in ("interval", "always"):
        d = base / f"fsync-{fsync}"
        mean = decide_cost(d, fsync, args.n)
        print(f"decide + log line, fsync={fsync:8s}: {mean * 1e6:8.0f} us mean over {args.n} calls ({d})")


if __name__ == "__main__":
    main()
