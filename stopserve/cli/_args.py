"""What the command groups share: argparse types, the parser class, common options.

Every option's words live in :mod:`stopserve.cli`: the library takes typed arguments and
never sees a namespace (a test keeps argparse out of every other module).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final, NoReturn

from stopserve.errors import StopServeError
from stopserve.training.parameters import GROUP_BY, AutoOr, Constraint, Interval, OneOf, Parameter, parameter

TRACES_HELP: Final = "format-v1 trace files (.json, .jsonl, .jsonl.gz)"


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(
                f"expected a number above 0, got {value}"
                if low == 1
                else f"expected a number >= {low}, got {value}"
            )
        return value

    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a number above 0, got 0")
    return value


def json_object(text: str) -> dict[str, object]:
    """``'{"max_turns": 40}'`` or ``@file.json``: a JSON object."""
    import orjson

    source = "--safety"
    if text.startswith("@"):
        source = text[1:]
        try:
            with open(source, "rb") as fh:
                text = fh.read().decode("utf-8", "replace")
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"{source}: cannot read: {exc.strerror or exc}") from None
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{source}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError(f"{source}: expected a JSON object, got {type(data).__name__}")
    return data


class HelpFormatter(argparse.HelpFormatter):
    """Says each option's default after its help, unless the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        unsaid = "default" not in text.lower()
        default = action.default
        if default is None or default is False or default is argparse.SUPPRESS or action.required:
            return text
        return f"{text} (default: %(default)s)" if unsaid and action.option_strings else text


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help says every default (its sub-parsers are ``Parser`` too), and
    that remembers the last usage error (the hook fails open on one: :func:`main`)."""

    last_error: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        Parser.last_error = message
        super().error(message)


def no_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (shown on stderr, on a terminal only)"
    )


def evidence(text: str) -> Any:
    from stopserve.evidence import Evidence

    parts = text.split(",")
    try:
        numbers = [int(x) for x in parts]
    except ValueError:
        numbers = []
    if len(numbers) != 3 or min(numbers) < 0:
        raise argparse.ArgumentTypeError(f"expected three whole numbers >= 0 like 2,3,4, got {text!r}")
    return Evidence(*numbers)


def auto_or_int(text: str) -> str | int:
    return "auto" if text == "auto" else positive_int(text)


def share(text: str) -> float:
    value = non_negative_float(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"a cost share is a fraction of a success's value, got {value}")
    return value


def fraction(text: str) -> float:
    value = positive_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"expected a share between 0 and 1, got {value}")
    return value


def cost_options(p: argparse.ArgumentParser) -> None:
    """``--lambda`` or ``--cost-share`` (the trainer's table declares both)."""
    add_parameters(p, [parameter("lam"), parameter("cost_share")])


_TYPES: Final[dict[Constraint, Callable[[str], Any]]] = {
    Interval(int, 1): positive_int,
    Interval(int, 0): non_negative_int,
    Interval(float, 0): non_negative_float,
    Interval(float, 0, 100): share,
    AutoOr(Interval(int, 1)): auto_or_int,
}


def add_parameters(p: argparse.ArgumentParser, params: Sequence[Parameter]) -> None:
    """One option per table entry (``training/parameters.py``): its flag, type, default, help;
    entries with the same ``exclusive`` tag in one mutually exclusive group."""
    groups: dict[str, Any] = {}
    for param in params:
        target: Any = p
        if param.exclusive is not None:
            if param.exclusive not in groups:
                groups[param.exclusive] = p.add_mutually_exclusive_group()
            target = groups[param.exclusive]
        kwargs: dict[str, Any] = {"dest": param.name, "help": param.help.replace("%", "%%")}
        if param.type is bool:
            kwargs["action"] = "store_true"
        else:
            kwargs["default"] = param.default
            if isinstance(param.constraint, OneOf):
                kwargs["choices"] = param.constraint.options
            elif param.constraint is not None:
                kwargs["type"] = _TYPES[param.constraint]
            elif param.type == "evidence":
                kwargs["type"] = evidence
            elif param.type is int:
                kwargs["type"] = int
        if param.metavar is not None:
            kwargs["metavar"] = param.metavar
        target.add_argument(param.flag, **kwargs)


def dask_address(text: str) -> str:
    """``local:N`` (N workers started here) or a scheduler address such as ``tcp://host:8786``."""
    if text == "local" or text.startswith("local:"):
        n = text.partition(":")[2]
        if n and not (n.isdigit() and int(n) > 0):
            raise argparse.ArgumentTypeError(f"expected local:N with N a whole number above 0, got {text!r}")
        return text
    if not text.strip() or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(
            f"expected a scheduler address (tcp://host:port) or local:N, got {text!r}"
        )
    return text


def dask_options(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--dask",
        type=dask_address,
        metavar="ADDRESS|local:N",
        help=f"{what}: a scheduler address (tcp://host:8786) or local:N to start N local workers "
        "(needs the dask extra; docs/distributed.md)",
    )
    p.add_argument(
        "--dask-timeout",
        type=positive_float,
        default=10.0,
        metavar="SECONDS",
        help="give up reaching the scheduler after this long. Default: 10",
    )


def group_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--group-by",
        choices=GROUP_BY,
        default=parameter("group_by").default,
        help=f"{what}: task id, repository (SWE-bench ids), system (e.g. one model) or data set. "
        "Default: task",
    )


def label_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--labels-from-rewards", action="store_true", help="treat run-time reward values as quality grades"
    )
    p.add_argument(
        "--cost-unit", choices=("usd", "ktokens", "seconds"), help="default: usd if every event has it"
    )


@contextmanager
def flag_words(**flags: str) -> Iterator[None]:
    """Say a library error in the command's words: a message that starts with a parameter's
    name (``noise: expected ...``) starts with its flag instead (``--noise: expected ...``)."""
    try:
        yield
    except StopServeError as exc:
        for name, flag in flags.items():
            if exc.message.startswith(name) and exc.message[len(name) : len(name) + 1] in (" ", ":"):
                exc.message = flag + exc.message[len(name) :]
                exc.args = (exc.message,)
                break
        raise
