"""``python -m stopserve.cli.gap_report``: the per-topology gap report of
:mod:`stopserve.training.gap_report` on the command line (``bench/bench_quality.py`` runs it)."""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["main"]


def gap_doc() -> str | None:
    """The library module's docstring, the command's description."""
    from stopserve.training import gap_report

    return gap_report.__doc__


def main(argv: list[str] | None = None) -> int:
    """``python -m stopserve.cli.gap_report MODEL_DIR TRACES... --lambda X [--json]``."""
    from stopserve.errors import StopServeError
    from stopserve.policy import Policy
    from stopserve.trace import read_traces
    from stopserve.training.gap_report import FAILURE_MODES, gap_report
    from stopserve.training.replay import REPLAY_ENGINE

    ap = argparse.ArgumentParser(prog="python -m stopserve.cli.gap_report", description=gap_doc())
    ap.add_argument("model")
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--lambda", dest="lam", type=float, required=True)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        policy = Policy.load(args.model, engine=REPLAY_ENGINE)
        report = gap_report(policy, read_traces(args.traces), args.lam)
    except StopServeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"lambda": args.lam, "kind": policy.kind, "per_topology": report}))
        return 0
    print(f"lambda {args.lam:g} per ktoken; policy kind {policy.kind} ({policy.model_version})")
    print("| topology | behavior | learned | optimal | gap closed | premature b/l | delayed b/l | loop b/l |")
    print("|---|---|---|---|---|---|---|---|")
    for key, r in report.items():
        modes = " | ".join(f"{r['behavior_' + m]:.1%} / {r['learned_' + m]:.1%}" for m in FAILURE_MODES)
        print(
            f"| {key} | {r['behavior']:.4f} | {r['learned']:.4f} | {r['optimal']:.4f} | "
            f"{r['gap_closed']:.1%} | {modes} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
