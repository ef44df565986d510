"""``stopserve simulate``: write simulated traces to a file."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Final

from stopserve.errors import ConfigError
from stopserve.progress import progress
from stopserve.trace import TraceWriter
from stopserve.training.simulate.generate import DEFAULT_NOISE, simulate

__all__ = ["simulate_command"]

#: The command validates the first trace and every this-many-th one (the tests validate all).
VALIDATE_EVERY: Final = 1000


def simulate_command(args: argparse.Namespace) -> int:
    """``stopserve simulate``: write ``--n`` traces to ``-o``; print a one-line summary."""
    if args.optimal and args.lam is None:
        raise ConfigError("--optimal needs --lambda X (cost weight per thousand tokens)")
    # a lambda alone also attaches the optimum: the simulator has no other use for it
    noise = DEFAULT_NOISE if args.noise is None else args.noise
    out = Path(args.output)
    traces = simulate(
        args.n,
        seed=args.seed,
        topology=args.topology,
        optimal_lambda=args.lam,
        run_to_cap=args.run_to_cap,
        noise=noise,
    )
    first = next(traces)  # bad options raise here, before the output file is created
    start = time.perf_counter()
    with TraceWriter(out) as writer:
        writer.write(first)  # validated, like every VALIDATE_EVERY-th trace: a cheap guard
        rest = progress(
            traces, desc="simulate", unit=" traces", total=args.n - 1, enabled=not args.no_progress
        )
        for i, trace in enumerate(rest, start=1):
            writer.write(trace, validate=i % VALIDATE_EVERY == 0)
    elapsed = time.perf_counter() - start
    print(f"wrote {writer.count} traces to {out} in {elapsed:.1f}s", file=sys.stderr)
    return 0
