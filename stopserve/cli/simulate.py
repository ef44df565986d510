"""``stopserve simulate``: write simulated traces to a file."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Final

from stopserve.cli._args import flag_words, no_progress, non_negative_float, positive_int
from stopserve.errors import ConfigError

__all__ = ["SIM_TOPOLOGIES", "add_parsers", "simulate_command"]

#: ``stopserve.training.simulate.topology.SIM_TOPOLOGIES`` (not imported: the CLI stays light; a test
#: keeps them equal)
SIM_TOPOLOGIES: Final = (
    "centralized",
    "planner_executor_critic",
    "debate",
    "swarm",
    "hierarchical",
    "harness",
)

#: The command validates the first trace and every this-many-th one (the tests validate all).
VALIDATE_EVERY: Final = 1000


def add_parsers(sub: Any) -> None:
    """Add ``simulate`` to ``sub``."""
    p = sub.add_parser("simulate", help="generate orchestration traces with a known optimal stop rule")
    p.add_argument("--n", type=positive_int, default=1000, help="number of traces")
    p.add_argument("--seed", type=int, default=0, help="same seed and options, byte-identical output")
    p.add_argument(
        "--topology", choices=(*SIM_TOPOLOGIES, "all"), default="all", help="one topology, or all six in turn"
    )
    p.add_argument("--lambda", dest="lam", type=non_negative_float, help="cost weight for --optimal")
    p.add_argument("--optimal", action="store_true", help="attach each trace's optimal value")
    p.add_argument("--run-to-cap", action="store_true", help="run every trace to the cap, grade every prefix")
    p.add_argument(
        "--noise", type=non_negative_float, help="verifier noise (standard deviation; default 0.05)"
    )
    p.add_argument("-o", "--output", required=True, metavar="OUT.jsonl", help="the trace file to write")
    no_progress(p)


def simulate_command(args: argparse.Namespace) -> int:
    """``stopserve simulate``: write ``--n`` traces to ``-o``; print a one-line summary."""
    if args.optimal and args.lam is None:
        raise ConfigError("--optimal needs --lambda X (cost weight per thousand tokens)")
    from stopserve.progress import progress
    from stopserve.trace import TraceWriter
    from stopserve.training.simulate.generate import DEFAULT_NOISE, simulate

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
    with flag_words(noise="--noise", topology="--topology"):
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
