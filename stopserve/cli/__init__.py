"""The ``stopserve`` command.

Each sub-command's arguments are declared here; its body lives in the module
that owns the work and is imported only when that command runs, so
``stopserve validate`` never pays for LightGBM or FastAPI imports.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, NoReturn

from stopserve import __version__
from stopserve.errors import StopServeError

__all__ = ["build_parser", "main"]

# command -> "module:function"; the function takes the parsed namespace, returns the exit code
_RUNNERS: Final[dict[str, str]] = {
    "validate": "stopserve.cli.data:validate",
    "import": "stopserve.cli.data:import_traces",
    "features": "stopserve.training.commands:features_command",
    "train": "stopserve.training.fit:train_command",
    "evaluate": "stopserve.training.evaluate:evaluate_command",
    "retrain": "stopserve.training.retrain:retrain_command",
    "rollback": "stopserve.training.retrain:rollback_command",
    "simulate": "stopserve.cli.simulate:simulate_command",
    "credit": "stopserve.training.credit:credit_command",
    "serve": "stopserve.service.app:serve_command",
    "report": "stopserve.report.commands:report_command",
    "hook claude-code": "stopserve.hooks.run:hook_command",
    "hook codex": "stopserve.hooks.run:hook_command",
    "hook install": "stopserve.hooks.install:install_command",
    "hook uninstall": "stopserve.hooks.install:uninstall_command",
    "hook report": "stopserve.hooks.report:report_command",
    "hook doctor": "stopserve.hooks.doctor:doctor_command",
    "label": "stopserve.hooks.report:label_command",
}
#: command -> (extra, modules it brings that the command needs): a missing one is a one-line error
_EXTRAS: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    "train": ("train", ("tqdm",)),
    "features": ("train", ("tqdm",)),
    "evaluate": ("train", ("tqdm",)),
    "retrain": ("train", ("tqdm",)),
}
HARNESSES: Final = ("claude-code", "codex")

IMPORT_FORMATS: Final = (
    "survey",
    "mini-swe-agent",
    "openai-chat",
    "otel",
    "mint",
    "intercode",
    "claude-code",
    "codex",
)
#: ``stopserve.training.labels.GROUP_BY`` (not imported: the CLI stays light; a test keeps them equal)
GROUP_BY: Final = ("task", "repo", "system", "dataset")
#: ``stopserve.training.simulate.topology.SIM_TOPOLOGIES`` (the same; a test keeps them equal)
SIM_TOPOLOGIES: Final = (
    "centralized",
    "planner_executor_critic",
    "debate",
    "swarm",
    "hierarchical",
    "harness",
)
_TRACES_HELP: Final = "format-v1 trace files (.json, .jsonl, .jsonl.gz)"


def _int_at_least(low: int) -> Callable[[str], int]:
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


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a number above 0, got 0")
    return value


def _json_object(text: str) -> dict[str, object]:
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


class _HelpFormatter(argparse.HelpFormatter):
    """Says each option's default after its help, unless the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        unsaid = "default" not in text.lower()
        default = action.default
        if default is None or default is False or default is argparse.SUPPRESS or action.required:
            return text
        return f"{text} (default: %(default)s)" if unsaid and action.option_strings else text


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help says every default (its sub-parsers are ``_Parser`` too), and
    that remembers the last usage error (the hook fails open on one: :func:`main`)."""

    last_error: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        _Parser.last_error = message
        super().error(message)


def _hook_options(p: argparse.ArgumentParser, *, mode: bool = True) -> None:
    import os

    from stopserve.hooks import DEFAULT_URL

    p.add_argument(
        "--url", default=os.environ.get("STOPSERVE_URL", DEFAULT_URL), help="the service (STOPSERVE_URL)"
    )
    if mode:
        p.add_argument(
            "--mode",
            choices=("enforce", "shadow"),
            default=os.environ.get("STOPSERVE_HOOK_MODE", "enforce"),
            help="enforce: block premature stops, end loops; shadow: decide and log, never block or end "
            "(STOPSERVE_HOOK_MODE)",
        )
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        help="offsets, logs, labels (default: user cache dir; STOPSERVE_HOOK_STATE)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (also used by the docs and the tests)."""
    parser = _Parser(
        prog="stopserve",
        description="Learned continue-or-stop decisions for multi-agent LLM orchestrators.",
    )
    parser.add_argument("--version", action="version", version=f"stopserve {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("validate", help="check trace files against format v1; list every error")
    p.add_argument("files", nargs="+", metavar="FILE", help=_TRACES_HELP)
    p.add_argument("--strict", action="store_true", help="reject unknown top-level fields")
    p.add_argument(
        "--max-errors", type=_positive_int, default=1000, help="stop listing problems after this many"
    )
    _no_progress(p)

    p = sub.add_parser(
        "import",
        help="convert a foreign trace format to format v1 JSON Lines",
        description="Convert a foreign trace format to format v1 JSON Lines (docs/trace-format.md). "
        "A run that cannot be converted is skipped and listed on stderr with its file and field; "
        "the summary line counts the skips by reason.",
        epilog="Exit status: 0 when traces were written, skips or not; 1 with --strict when any run "
        "was skipped (the others are still written); 2 when nothing could be imported.",
    )
    p.add_argument("format", choices=IMPORT_FORMATS, help="the source format")
    p.add_argument("sources", nargs="+", metavar="SRC", help="files or folders to read")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="output .jsonl or .jsonl.gz")
    p.add_argument("--results", metavar="FILE", help="mini-swe-agent: results summary with resolved flags")
    p.add_argument("--reports", metavar="DIR", help="mini-swe-agent: folder of <id>.report.json files")
    p.add_argument("--reward", type=float, help="openai-chat: reward for runs that carry none")
    p.add_argument(
        "--labels", metavar="FILE", help="claude-code, codex: session rewards (the hook's labels.jsonl)"
    )
    p.add_argument(
        "--strict", action="store_true", help="exit 1 when any run was skipped (the rest is still written)"
    )
    p.add_argument(
        "--no-sketch",
        action="store_true",
        help="leave out the similarity sketches of the texts (content hashes only; docs/trace-format.md)",
    )
    _no_progress(p)

    p = sub.add_parser(
        "features", help="write the features and labels of every decision point as CSV or Parquet"
    )
    p.add_argument("traces", nargs="+", metavar="TRACES", help=_TRACES_HELP)
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("-o", "--output", metavar="CSV", help="one CSV file")
    out.add_argument(
        "--parquet",
        metavar="DIR",
        help="a new folder of Parquet files, one per input file, the same columns as the CSV "
        "(needs the dask extra)",
    )
    _dask_options(p, "featurize on a Dask cluster, one task per input file")
    _label_options(p)
    _no_progress(p)

    p = sub.add_parser(
        "train",
        help="learn a stop policy from traces and write a model directory",
        description="Learn a stop policy; it ships only when it beats the best tuned heuristic with "
        "error bars (docs/training.md). Every default is shown below.",
    )
    p.add_argument("traces", nargs="+", metavar="TRACES", help=_TRACES_HELP + " to learn from")
    p.add_argument("-o", "--output", required=True, metavar="MODEL_DIR", help="the model directory to write")
    _fit_options(p)
    p.add_argument("--seed", type=int, default=0, help="Default: 0")
    _no_progress(p)
    _dask_options(
        p, "featurize (one task per input file), fit the boosters and replay the policies on a Dask cluster"
    )
    _label_options(p)

    p = sub.add_parser(
        "retrain",
        help="learn a model from the service's logs; promote it only if it beats the champion on new runs",
        description="Fit a candidate on the service's logged runs (and --corpus), judge it, the champion and "
        "the tuned heuristics off-policy on the most recent runs it did not train on, and promote the "
        "candidate or a heuristic only when the lower end of the 90% interval of (it - champion) is "
        "above 0; the candidate refused last time is judged again on the runs logged since. Every "
        "promotion and refusal goes to the promotions log with its evidence (docs/retraining.md).",
    )
    p.add_argument(
        "--log-dir",
        metavar="DIR",
        default=None,
        help="the service's log directory (its traces.jsonl; STOPSERVE_LOG_DIR, default stopserve-logs)",
    )
    p.add_argument(
        "--model-store",
        metavar="DIR",
        help="where champions are kept (STOPSERVE_MODEL_STORE; default <log-dir>/models)",
    )
    p.add_argument(
        "--corpus", nargs="+", metavar="TRACES", help="earlier traces to learn from too (never judged on)"
    )
    p.add_argument(
        "--champion",
        metavar="DIR",
        help="the model served now (default: the store's champion, else STOPSERVE_MODEL_DIR, else the "
        "shipped default)",
    )
    p.add_argument(
        "--candidate",
        metavar="DIR",
        help="judge this model directory (one you trained) instead of fitting a candidate; only it may "
        "be promoted",
    )
    p.add_argument(
        "--holdout",
        type=_fraction,
        default=0.3,
        help="share of the logged runs, the most recent, held out to judge on",
    )
    p.add_argument("--n-boot", type=_positive_int, default=1000, help="bootstrap draws of the intervals")
    p.add_argument("--dry-run", action="store_true", help="judge the candidate, promote nothing, log nothing")
    p.add_argument("--json", action="store_true", help="print the evidence as one JSON object")
    p.add_argument(
        "--nice",
        type=_non_negative_int,
        default=0,
        help="lower this process's priority by N; on Linux it then also runs as SCHED_IDLE, on CPU "
        "time nothing else wants (the service's background retrain uses 10)",
    )
    _fit_options(p)
    p.add_argument("--seed", type=int, default=0, help="Default: 0")
    _no_progress(p)
    _label_options(p)

    p = sub.add_parser("rollback", help="make the champion before the current one the champion again")
    p.add_argument("--log-dir", metavar="DIR", help="the service's log directory (default stopserve-logs)")
    p.add_argument(
        "--model-store",
        metavar="DIR",
        help="the model store (STOPSERVE_MODEL_STORE; default <log-dir>/models)",
    )

    p = sub.add_parser("evaluate", help="replay policies on held-out traces and compare them")
    p.add_argument("traces", nargs="+", metavar="TRACES", help=_TRACES_HELP + " to judge on")
    p.add_argument("--model", required=True, metavar="DIR", help="the model directory (stopserve train -o)")
    p.add_argument("--tune-on", nargs="+", metavar="TRACES", help="traces to tune the heuristics on")
    _cost_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="draw the success/cost Pareto chart")
    p.add_argument(
        "--logged",
        action="store_true",
        help="the traces are the service's logs, decided by another policy: estimate off-policy (IS and "
        "doubly robust, from the logged propensities) and say how many runs support each figure",
    )
    _group_option(p, "bootstrap resampling unit and cross-fitting groups")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap and the cross-fitting folds")
    _dask_options(p, "featurize and replay on a Dask cluster, one task per input file")
    _label_options(p)
    _no_progress(p)

    p = sub.add_parser("simulate", help="generate orchestration traces with a known optimal stop rule")
    p.add_argument("--n", type=_positive_int, default=1000, help="number of traces")
    p.add_argument("--seed", type=int, default=0, help="same seed and options, byte-identical output")
    p.add_argument(
        "--topology", choices=(*SIM_TOPOLOGIES, "all"), default="all", help="one topology, or all six in turn"
    )
    p.add_argument("--lambda", dest="lam", type=_non_negative_float, help="cost weight for --optimal")
    p.add_argument("--optimal", action="store_true", help="attach each trace's optimal value")
    p.add_argument("--run-to-cap", action="store_true", help="run every trace to the cap, grade every prefix")
    p.add_argument(
        "--noise", type=_non_negative_float, help="verifier noise (standard deviation; default 0.05)"
    )
    p.add_argument("-o", "--output", required=True, metavar="OUT.jsonl", help="the trace file to write")
    _no_progress(p)

    p = sub.add_parser(
        "credit",
        help="credit each event of a run with how much it moved the learned value (docs/credit.md)",
        description="Message-level credit from a trained model's value V = max(S, Q - lambda K): "
        "TD (the change of V between decision points, net of cost, split over the events between "
        "them) or ablation (the change of V when one event is removed and the run refolded).",
    )
    p.add_argument("traces", nargs="+", metavar="TRACES", help=_TRACES_HELP)
    p.add_argument("--model", metavar="DIR", help="model directory (default: the shipped models/default)")
    p.add_argument(
        "--method",
        choices=("td", "ablation"),
        default="td",
        help="td: the change of V between decision points; ablation: V without each event. Default: td",
    )
    p.add_argument(
        "--split",
        choices=("tokens", "equal"),
        default="tokens",
        help="td: how an interval's value change is shared by its events. Default: tokens",
    )
    p.add_argument(
        "--window",
        choices=("decision", "reward"),
        default="decision",
        help="td: read V at every decision point, or only at rewards (where the run is scored) and "
        "the last decision point. Default: decision",
    )
    p.add_argument(
        "--baseline",
        choices=("zero", "model"),
        default="zero",
        help="V before the first event: 0 (nothing held or spent) or the model's value of the empty "
        "run. Default: zero",
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument("--lambda", dest="lam", type=_non_negative_float, help="absolute cost weight")
    group.add_argument("--cost-share", type=_share, help="cost share (default: the model's)")
    p.add_argument(
        "--by",
        metavar="LIST",
        help="comma list of event, agent, role, type, agent-type. Default: event,agent for one "
        "trace, else agent,type",
    )
    p.add_argument("--trace", action="append", metavar="ID", help="only this trace id (repeatable)")
    p.add_argument(
        "--types", metavar="LIST", help="ablation: event types to remove (default: all but reward)"
    )
    p.add_argument(
        "--last-k", type=_positive_int, metavar="K", help="ablation: only the last K decision points"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--csv", metavar="FILE.csv", help="write one row per event")
    p.add_argument("--plot", metavar="FILE.png", help="timeline of V and per-event credit (first trace)")
    p.add_argument("--limit", type=_positive_int, default=30, help="rows per table (default 30)")
    p.add_argument("--limit-traces", type=_positive_int, default=3, help="event tables shown (default 3)")
    _no_progress(p)

    p = sub.add_parser("serve", help="serve continue-or-stop decisions over HTTP")
    p.add_argument("--model", metavar="DIR", help="model directory (default: the shipped models/default)")
    p.add_argument("--host", help="bind address (default 127.0.0.1; STOPSERVE_HOST)")
    p.add_argument("--port", type=int, help="port (default 8080; STOPSERVE_PORT)")
    p.add_argument("--log-dir", metavar="DIR", help="decision and trace log folder (STOPSERVE_LOG_DIR)")
    p.add_argument(
        "--workers",
        type=_positive_int,
        help="worker processes (default 1; STOPSERVE_WORKERS); more than 1 needs the shared run store "
        "STOPSERVE_STORE=redis://... (docs/service.md)",
    )
    p.add_argument("--no-model", action="store_true", help="run on safety nets alone")

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

    p = sub.add_parser("hook", help="stopserve as the Stop and tool hook of Claude Code and Codex CLI")
    actions = p.add_subparsers(dest="hook_action", metavar="ACTION")
    actions.required = True
    for harness in HARNESSES:
        h = actions.add_parser(harness, help=f"the {harness} hook itself: hook input JSON on stdin")
        _hook_options(h)
        _hook_decision_options(h, install=False)
        h.set_defaults(harness=harness)
    i = actions.add_parser(
        "install", help="add stopserve's hook entries to a harness's settings (with a backup)"
    )
    i.add_argument("harness", choices=HARNESSES, help="the harness whose settings get the hooks")
    i.add_argument("--project", metavar="DIR", help="the project's settings file instead of the user's")
    _hook_options(i)
    _hook_decision_options(i, install=True)
    i.add_argument(
        "--http",
        action="store_true",
        help="claude-code: HTTP hooks posting to the service's /v1/hooks/claude-code (no process per call)",
    )
    i.add_argument(
        "--trust",
        action="store_true",
        help="codex: trust the installed hooks in $CODEX_HOME/config.toml (else Codex skips them)",
    )
    u = actions.add_parser("uninstall", help="remove stopserve's hook entries (only those)")
    u.add_argument("harness", choices=HARNESSES, help="the harness whose settings lose the hooks")
    u.add_argument("--project", metavar="DIR", help="the project's settings file instead of the user's")
    r = actions.add_parser("report", help="block rate, and how often blocked sessions failed (labels)")
    r.add_argument("--state-dir", metavar="DIR", help="the hook's state directory")
    r.add_argument("--fail-below", type=float, default=0.5, help="a reward below this is a failure (0.5)")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.add_argument(
        "--html",
        metavar="OUT.html",
        help="write the hook's decisions as one self-contained HTML page (stopserve report's views)",
    )
    r.add_argument(
        "--log-dir", metavar="DIR", help="with --html: also read the service's logs (costs, outcomes, models)"
    )
    d = actions.add_parser(
        "doctor", help="are the hooks installed, trusted (Codex), allowed (HTTP), reaching the service, run?"
    )
    d.add_argument("harness", nargs="?", choices=HARNESSES, help="one harness (default: both)")
    d.add_argument("--project", metavar="DIR", help="the project's settings file instead of the user's")
    d.add_argument("--state-dir", metavar="DIR", help="the hook's state directory")

    p = sub.add_parser("label", help="give a session's outcome: post it to the service, record it locally")
    p.add_argument(
        "session_id",
        metavar="SESSION_ID",
        help="the session (in the decision log, and the transcript's name)",
    )
    p.add_argument("--reward", type=float, required=True, help="the session's outcome in [0, 1]")
    _hook_options(p, mode=False)
    return parser


def _hook_parser(harness: str) -> argparse.ArgumentParser:
    """The parser of ``stopserve hook <harness>`` alone (what :func:`build_parser` has for it)."""
    p = _Parser(
        prog=f"stopserve hook {harness}", description=f"the {harness} hook itself: hook input JSON on stdin"
    )
    _hook_options(p)
    _hook_decision_options(p, install=False)
    p.set_defaults(command="hook", hook_action=harness, harness=harness)
    return p


def _hook_decision_options(p: argparse.ArgumentParser, *, install: bool) -> None:
    """How the hook decides: options of the hook itself and of ``hook install`` (no defaults there:
    what is not given is not written into the installed command)."""
    from stopserve.hooks import DEFAULT_MAX_BLOCKS, DEFAULT_TIMEOUT

    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=None if install else DEFAULT_TIMEOUT,
        help=f"seconds per call before letting the agent stop (default {DEFAULT_TIMEOUT})",
    )
    p.add_argument(
        "--max-blocks",
        type=_non_negative_int,
        default=None if install else DEFAULT_MAX_BLOCKS,
        help=f"stops blocked in a row within a turn, at most (default {DEFAULT_MAX_BLOCKS})",
    )
    p.add_argument("--lambda", dest="lam", type=_non_negative_float, help="cost weight sent to the service")
    p.add_argument("--safety", type=_json_object, metavar="JSON|@FILE", help="safety-net config for this run")
    p.add_argument(
        "--end-on-model-stop",
        action="store_true",
        help="tool hooks also end the run on a model stop (default: safety nets only)",
    )
    p.add_argument(
        "--no-sketch",
        action="store_true",
        help="send hashes of the transcript's texts only, no similarity sketches (docs/hooks.md)",
    )


def _no_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (shown on stderr, on a terminal only)"
    )


def _evidence(text: str) -> Any:
    from stopserve.evidence import Evidence

    parts = text.split(",")
    try:
        numbers = [int(x) for x in parts]
    except ValueError:
        numbers = []
    if len(numbers) != 3 or min(numbers) < 0:
        raise argparse.ArgumentTypeError(f"expected three whole numbers >= 0 like 2,3,4, got {text!r}")
    return Evidence(*numbers)


def _auto_or_int(text: str) -> str | int:
    return "auto" if text == "auto" else _positive_int(text)


def _share(text: str) -> float:
    value = _non_negative_float(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"a cost share is a fraction of a success's value, got {value}")
    return value


def _fraction(text: str) -> float:
    value = _positive_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"expected a share between 0 and 1, got {value}")
    return value


def _fit_options(p: argparse.ArgumentParser) -> None:
    """The trainer's options (``train`` and ``retrain``)."""
    _cost_options(p)
    p.add_argument(
        "--cost-scale",
        choices=("fixed", "per-run"),
        default="fixed",
        help="fixed: lambda from these traces' mean cost (a model for this system); per-run: costs "
        "normalised per data set and, served, each run's own expected cost (a model for systems it has "
        "not seen, e.g. the shipped default). Default: fixed",
    )
    p.add_argument(
        "--method",
        choices=("auto", "behavior", "optimal"),
        default="auto",
        help="value of continuing: behavior (to the logged end), optimal (fitted backward induction) "
        "or auto (chosen in cross-validation). Default: auto",
    )
    p.add_argument(
        "--min-turns",
        default="auto",
        type=_auto_or_int,
        help="no model stop before this decision point; auto tunes 1, 2 or 3 in cross-validation. "
        "Default: auto",
    )
    p.add_argument(
        "--features",
        default="all",
        help="all, scale-free (no absolute sizes or topology: transfers across systems) or a comma "
        "list of names (docs/features.md). Default: all",
    )
    p.add_argument(
        "--folds", type=_positive_int, default=5, help="grouped cross-validation folds. Default: 5"
    )
    _group_option(p, "what cross-validation folds never split")
    p.add_argument(
        "--min-groups",
        type=_positive_int,
        default=10,
        help="fewer groups and the tuned heuristic ships (a guard cannot tell a model from luck). "
        "Default: 10",
    )
    p.add_argument(
        "--rules",
        choices=("tuned", "fixed"),
        default="tuned",
        help="tuned: the heuristics may switch the loop detector and quality_met off and the model may "
        "overrule them where going on pays; fixed: they always stop a run (the shipped default). "
        "Default: tuned",
    )
    p.add_argument(
        "--stop-on",
        choices=("value", "evidence"),
        default="value",
        help="value: the model stops a run where its value of going on is below the stop margin; "
        "evidence: only where the run also shows a stall (a repeat, nothing new, no better reward: "
        "docs/training.md; the shipped default). Default: value",
    )
    p.add_argument(
        "--evidence",
        type=_evidence,
        metavar="REPEAT,QUIET,REWARD",
        help="with --stop-on evidence: what counts as a stall: a loop pattern REPEAT times in a row, "
        "QUIET steps with nothing new, REWARD steps with no better reward (0 turns one off). Default: 2,3,4",
    )
    p.add_argument(
        "--max-value-loss",
        type=_non_negative_float,
        metavar="X",
        help="tune margins and choose the heuristic family so that, in every data set (--group-by "
        "dataset: every system), the cross-validated mean value falls at most X below the logged "
        "runs', and ship a learned model only if it does too (0: off). Default: off",
    )
    p.add_argument(
        "--max-success-loss",
        type=_non_negative_float,
        metavar="X",
        help="likewise for the mean quality handed back: no policy, learned or heuristic, that loses "
        "more than X of success in cross-validation ships (0.01: one point; 0: off). Default: 0.01",
    )
    p.add_argument(
        "--inner-cv",
        action="store_true",
        help="tune each fold's margins on all its training groups by nested cross-fitting, not on a "
        "held-out quarter of them (slower; for few groups, e.g. a model across systems)",
    )
    p.add_argument(
        "--censored",
        choices=("auto", "horizon", "unknown"),
        default="auto",
        help="runs that ended at a cap: horizon (the cap is your system's own end) or unknown (what "
        "going on would have gained is unknown: they do not train the gain of going on); auto is "
        "unknown with --cost-scale per-run, else horizon. Default: auto",
    )


def _cost_options(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--lambda",
        dest="lam",
        type=_non_negative_float,
        help="absolute cost weight: quality units per cost unit (e.g. per thousand tokens)",
    )
    group.add_argument(
        "--cost-share",
        type=_share,
        help="what cost is worth as a share: 0.3 = a whole behavior run costs 30%% of a success "
        "(resolved to lambda from the traces' mean cost). Default when neither is given: 0.3",
    )


def _dask_address(text: str) -> str:
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


def _dask_options(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--dask",
        type=_dask_address,
        metavar="ADDRESS|local:N",
        help=f"{what}: a scheduler address (tcp://host:8786) or local:N to start N local workers "
        "(needs the dask extra; docs/distributed.md)",
    )
    p.add_argument(
        "--dask-timeout",
        type=_positive_float,
        default=10.0,
        metavar="SECONDS",
        help="give up reaching the scheduler after this long. Default: 10",
    )


def _group_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--group-by",
        choices=GROUP_BY,
        default="task",
        help=f"{what}: task id, repository (SWE-bench ids), system (e.g. one model) or data set. "
        "Default: task",
    )


def _label_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--labels-from-rewards", action="store_true", help="treat run-time reward values as quality grades"
    )
    p.add_argument(
        "--cost-unit", choices=("usd", "ktokens", "seconds"), help="default: usd if every event has it"
    )


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


def _hook_call(argv: Sequence[str]) -> str | None:
    """The harness, when ``argv`` runs the hook itself (``hook claude-code|codex ...``)."""
    words = [w for w in argv if not w.startswith("-")][:2]
    return words[1] if len(words) == 2 and words[0] == "hook" and words[1] in HARNESSES else None


def _hook_bad_arguments(argv: Sequence[str], harness: str) -> int:
    """A hook run with bad arguments: say so, log it, exit 0 -- a harness reads exit 2 as "block"."""
    message = _Parser.last_error or "bad arguments"
    print(
        f"stopserve hook {harness}: {message}; the hook did nothing and lets the agent go on "
        "(fix the installed command: stopserve hook install ... / stopserve hook doctor)",
        file=sys.stderr,
    )
    try:
        from stopserve.hooks.state import StateDir

        words = list(argv)
        where = next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "--state-dir"), None)
        state = StateDir(where)
        state.log(f"{harness} ? run=?: bad arguments ({message}); failed open")
        state.append(
            "decisions.jsonl",
            {
                "ts": time.time(),
                "harness": harness,
                "error": f"bad arguments: {message}",
                "outcome": "failed open",
            },
        )
    except Exception:  # logging is best effort: the hook must still exit 0
        pass
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stopserve`` console script."""
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        if words[:1] == ["hook"] and words[1:2] and words[1] in HARNESSES:
            # the hook itself runs once per tool call: its own parser, not all of them (~10 ms)
            args = _hook_parser(words[1]).parse_args(words[2:])
        else:
            args = build_parser().parse_args(words)
    except SystemExit as exc:
        harness = _hook_call(words)
        if exc.code == 2 and harness is not None:
            return _hook_bad_arguments(words, harness)
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


if __name__ == "__main__":
    raise SystemExit(main())
