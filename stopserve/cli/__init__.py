"""The ``stopserve`` command: the only place that knows argparse.

Each command group declares its options and holds its ``*_command(args)`` glue in its
own module (:mod:`~stopserve.cli.data`, :mod:`~stopserve.cli.train`,
:mod:`~stopserve.cli.simulate`, :mod:`~stopserve.cli.serve`, :mod:`~stopserve.cli.report`,
:mod:`~stopserve.cli.hooks`); the glue turns the parsed namespace into typed arguments of
the library, which is imported only when that command runs, so ``stopserve validate``
never pays for LightGBM or FastAPI imports.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Final

from stopserve import __version__
from stopserve.cli._args import Parser
from stopserve.cli.data import IMPORT_FORMATS
from stopserve.cli.hooks import HARNESSES, hook_bad_arguments, hook_call, hook_parser
from stopserve.cli.simulate import SIM_TOPOLOGIES
from stopserve.errors import StopServeError
from stopserve.training.parameters import GROUP_BY

__all__ = ["GROUP_BY", "HARNESSES", "IMPORT_FORMATS", "SIM_TOPOLOGIES", "build_parser", "main"]

# command -> "module:function"; the function takes the parsed namespace, returns the exit code
_RUNNERS: Final[dict[str, str]] = {
    "validate": "stopserve.cli.data:validate",
    "import": "stopserve.cli.data:import_traces",
    "features": "stopserve.cli.data:features_command",
    "train": "stopserve.cli.train:train_command",
    "evaluate": "stopserve.cli.train:evaluate_command",
    "retrain": "stopserve.cli.train:retrain_command",
    "rollback": "stopserve.cli.train:rollback_command",
    "simulate": "stopserve.cli.simulate:simulate_command",
    "credit": "stopserve.cli.train:credit_command",
    "serve": "stopserve.cli.serve:serve_command",
    "report": "stopserve.cli.report:report_command",
    "hook claude-code": "stopserve.cli.hooks:hook_command",
    "hook codex": "stopserve.cli.hooks:hook_command",
    "hook install": "stopserve.cli.hooks:install_command",
    "hook uninstall": "stopserve.cli.hooks:uninstall_command",
    "hook report": "stopserve.cli.hooks:report_command",
    "hook doctor": "stopserve.cli.hooks:doctor_command",
    "label": "stopserve.cli.hooks:label_command",
}
#: command -> (extra, modules it brings that the command needs): a missing one is a one-line error
_EXTRAS: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    "train": ("train", ("tqdm",)),
    "features": ("train", ("tqdm",)),
    "evaluate": ("train", ("tqdm",)),
    "retrain": ("train", ("tqdm",)),
}


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (also used by the docs and the tests)."""
    parser = Parser(
        prog="stopserve",
        description="Learned continue-or-stop decisions for multi-agent LLM orchestrators.",
    )
    parser.add_argument("--version", action="version", version=f"stopserve {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    from stopserve.cli import data, hooks, report, serve, simulate, train

    # in the order ``stopserve --help`` lists them
    data.add_parsers(sub)
    train.add_train_parsers(sub)
    simulate.add_parsers(sub)
    train.add_credit_parser(sub)
    serve.add_parsers(sub)
    report.add_parsers(sub)
    hooks.add_parsers(sub)
    return parser


def _key(args: argparse.Namespace) -> str:
    return f"hook {args.hook_action}" if args.command == "hook" else str(args.command)


def _runner(command: str) -> Callable[[argparse.Namespace], int]:
    if command in _EXTRAS:
        from stopserve.extras import require

        extra, needs = _EXTRAS[command]
        require(extra, *needs, what="this command")
    module_name, func = _RUNNERS[command].split(":")
    module = importlib.import_module(module_name)
    run: Callable[[argparse.Namespace], int] = getattr(module, func)
    return run


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stopserve`` console script."""
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        if words[:1] == ["hook"] and words[1:2] and words[1] in HARNESSES:
            # the hook itself runs once per tool call: its own parser, not all of them (~10 ms)
            args = hook_parser(words[1]).parse_args(words[2:])
        else:
            args = build_parser().parse_args(words)
    except SystemExit as exc:
        harness = hook_call(words)
        if exc.code == 2 and harness is not None:
            return hook_bad_arguments(words, harness)
        raise
    try:
        return _runner(_key(args))(args)
    except StopServeError as exc:
        print(f"stopserve {_key(args)}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 141
