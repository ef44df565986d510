"""``stopserve report LOGDIR``: what the service stopped, why, and what that saved."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parsers", "report_command"]


def add_parsers(sub: Any) -> None:
    """Add ``report`` to ``sub``."""
    p = sub.add_parser(
        "report",
        help="what the service stopped, why, and what that saved: text, JSON or one HTML page",
        description="Read a log directory (the service's decisions.jsonl, traces.jsonl, rotated files, "
        "models/promotions.jsonl; or a hook's state directory) and summarise it: runs over time, stops by "
        "reason, rule and net, loops caught, cost spent and saved (estimated), success, each run's decision "
        "timeline, champion and promotions. Unreadable lines are skipped and named; the rest is shown.",
    )
    p.add_argument("logdir", metavar="LOGDIR", help="the service's log directory (STOPSERVE_LOG_DIR)")
    p.add_argument(
        "--html",
        metavar="OUT.html",
        help="write one self-contained HTML page (no network needed to view it; the [report] extra)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument(
        "--model-store", metavar="DIR", help="the model store (default <LOGDIR>/models, as the service's)"
    )
    p.add_argument(
        "--cost-unit",
        choices=("ktokens", "usd", "seconds"),
        help="cost unit shown (default: the unit of the models that decided, else ktokens)",
    )
    p.add_argument(
        "--success-at", type=float, default=0.5, help="a run with rewards.team at least this is a success"
    )


def report_command(args: argparse.Namespace) -> int:
    """``stopserve report LOGDIR [--html OUT] [--json] [--model-store DIR] [--cost-unit U]``."""
    from stopserve.report.commands import report, service_logs

    return report(
        [service_logs(args.logdir)],
        html=args.html,
        as_json=args.json,
        model_store=args.model_store,
        cost_unit=args.cost_unit,
        success_at=args.success_at,
        title="stopserve report",
    )
