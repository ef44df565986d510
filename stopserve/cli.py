"""The ``stopserve`` command.

Each sub-command's arguments are declared here; its body lives in the module
that owns the work and is imported only when that command runs, so
``stopserve validate`` never pays for LightGBM or FastAPI imports.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Final

from stopserve import __version__
from stopserve.errors import StopServeError

__all__ = ["build_parser", "main"]

# command -> "module:function"; the function takes the parsed namespace, returns the exit code
_RUNNERS: Final[dict[str, str]] = {
    "validate": "stopserve.commands:validate",
    "import": "stopserve.commands:import_traces",
    "features": "stopserve.training.labels:features_command",
    "train": "stopserve.training.fit:train_command",
    "evaluate": "stopserve.training.evaluate:evaluate_command",
    "simulate": "stopserve.training.simulate:simulate_command",
    "serve": "stopserve.service.app:serve_command",
}

IMPORT_FORMATS: Final = ("survey", "mini-swe-agent", "openai-chat", "otel")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (also used by the docs and the tests)."""
    parser = argparse.ArgumentParser(
        prog="stopserve",
        description="Learned continue-or-stop decisions for multi-agent LLM orchestrators.",
    )
    parser.add_argument("--version", action="version", version=f"stopserve {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("validate", help="check trace files against format v1; list every error")
    p.add_argument("files", nargs="+", metavar="FILE", help=".json, .jsonl or .jsonl.gz trace files")
    p.add_argument("--strict", action="store_true", help="reject unknown top-level fields")
    p.add_argument("--max-errors", type=_positive_int, default=1000, help="stop listing after this many")

    p = sub.add_parser("import", help="convert a foreign trace format to format v1 JSON Lines")
    p.add_argument("format", choices=IMPORT_FORMATS, help="the source format")
    p.add_argument("sources", nargs="+", metavar="SRC", help="files or folders to read")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="output .jsonl or .jsonl.gz")
    p.add_argument("--results", metavar="FILE", help="mini-swe-agent: results summary with resolved flags")
    p.add_argument("--reports", metavar="DIR", help="mini-swe-agent: folder of <id>.report.json files")
    p.add_argument("--reward", type=float, help="openai-chat: reward for runs that carry none")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser("features", help="write the features and labels of every decision point as CSV")
    p.add_argument("traces", nargs="+", metavar="TRACES")
    p.add_argument("-o", "--output", required=True, metavar="CSV")
    _label_options(p)

    p = sub.add_parser("train", help="learn a stop policy from traces and write a model directory")
    p.add_argument("traces", nargs="+", metavar="TRACES")
    p.add_argument("-o", "--output", required=True, metavar="MODEL_DIR")
    p.add_argument(
        "--lambda", dest="lam", type=_non_negative_float, help="cost weight (cost units per reward)"
    )
    p.add_argument("--method", choices=("behavior", "optimal"), default="behavior")
    p.add_argument("--folds", type=_positive_int, default=5, help="grouped cross-validation folds")
    p.add_argument("--group-by", choices=("task", "repo"), default="task", help="what CV folds never split")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-turns", type=_positive_int, default=2, help="no model stop before this turn")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    _label_options(p)

    p = sub.add_parser("evaluate", help="replay policies on held-out traces and compare them")
    p.add_argument("traces", nargs="+", metavar="TRACES")
    p.add_argument("--model", required=True, metavar="DIR")
    p.add_argument("--tune-on", nargs="+", metavar="TRACES", help="traces to tune the heuristics on")
    p.add_argument("--lambda", dest="lam", type=_non_negative_float)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="draw the success/cost Pareto chart")
    p.add_argument("--group-by", choices=("task", "repo"), default="task", help="bootstrap resampling unit")
    p.add_argument("--seed", type=int, default=0)
    _label_options(p)

    p = sub.add_parser("simulate", help="generate orchestration traces with a known optimal stop rule")
    p.add_argument("--n", type=_positive_int, default=1000, help="number of traces")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--topology", default="all", help="one topology or 'all'")
    p.add_argument("--lambda", dest="lam", type=_non_negative_float, help="cost weight for --optimal")
    p.add_argument("--optimal", action="store_true", help="attach each trace's optimal value")
    p.add_argument("--run-to-cap", action="store_true", help="run every trace to the cap, grade every prefix")
    p.add_argument("--noise", type=_non_negative_float, help="verifier noise (standard deviation)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.jsonl")

    p = sub.add_parser("serve", help="serve continue-or-stop decisions over HTTP")
    p.add_argument("--model", metavar="DIR", help="model directory (default: the shipped models/default)")
    p.add_argument("--host", help="bind address (default 127.0.0.1; STOPSERVE_HOST)")
    p.add_argument("--port", type=int, help="port (default 8080; STOPSERVE_PORT)")
    p.add_argument("--log-dir", metavar="DIR", help="decision and trace log folder (STOPSERVE_LOG_DIR)")
    p.add_argument(
        "--workers", type=_positive_int, help="worker processes: only 1 for now (STOPSERVE_WORKERS)"
    )
    p.add_argument("--no-model", action="store_true", help="run on safety nets alone")
    return parser


def _label_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--labels-from-rewards", action="store_true", help="treat run-time reward values as quality grades"
    )
    p.add_argument(
        "--cost-unit", choices=("usd", "ktokens", "seconds"), help="default: usd if every event has it"
    )


def _runner(command: str) -> Callable[[argparse.Namespace], int]:
    module_name, func = _RUNNERS[command].split(":")
    module = importlib.import_module(module_name)
    run: Callable[[argparse.Namespace], int] = getattr(module, func)
    return run


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stopserve`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return _runner(args.command)(args)
    except StopServeError as exc:
        print(f"stopserve {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 141


if __name__ == "__main__":
    raise SystemExit(main())
