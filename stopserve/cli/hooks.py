"""``stopserve hook ...`` and ``stopserve label``: the hook itself, its install, report, doctor.

The hook runs once per tool call: :func:`hook_parser` builds its parser alone, and this
module imports nothing heavy (the hook's own imports are its cost).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from stopserve.cli._args import (
    Parser,
    flag_words,
    json_object,
    non_negative_float,
    non_negative_int,
    positive_float,
)
from stopserve.errors import ConfigError

__all__ = [
    "HARNESSES",
    "add_parsers",
    "doctor_command",
    "hook_bad_arguments",
    "hook_call",
    "hook_command",
    "hook_parser",
    "install_command",
    "label_command",
    "report_command",
    "uninstall_command",
]

HARNESSES: Final = ("claude-code", "codex")


def hook_options(p: argparse.ArgumentParser, *, mode: bool = True) -> None:
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


def add_parsers(sub: Any) -> None:
    """Add ``hook`` (its actions) and ``label`` to ``sub``."""
    p = sub.add_parser("hook", help="stopserve as the Stop and tool hook of Claude Code and Codex CLI")
    actions = p.add_subparsers(dest="hook_action", metavar="ACTION")
    actions.required = True
    for harness in HARNESSES:
        h = actions.add_parser(harness, help=f"the {harness} hook itself: hook input JSON on stdin")
        hook_options(h)
        _hook_decision_options(h, install=False)
        h.set_defaults(harness=harness)
    i = actions.add_parser(
        "install", help="add stopserve's hook entries to a harness's settings (with a backup)"
    )
    i.add_argument("harness", choices=HARNESSES, help="the harness whose settings get the hooks")
    i.add_argument("--project", metavar="DIR", help="the project's settings file instead of the user's")
    hook_options(i)
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
    hook_options(p, mode=False)


def hook_parser(harness: str) -> argparse.ArgumentParser:
    """The parser of ``stopserve hook <harness>`` alone (what :func:`build_parser` has for it)."""
    p = Parser(
        prog=f"stopserve hook {harness}", description=f"the {harness} hook itself: hook input JSON on stdin"
    )
    hook_options(p)
    _hook_decision_options(p, install=False)
    p.set_defaults(command="hook", hook_action=harness, harness=harness)
    return p


def _hook_decision_options(p: argparse.ArgumentParser, *, install: bool) -> None:
    """How the hook decides: options of the hook itself and of ``hook install`` (no defaults there:
    what is not given is not written into the installed command)."""
    from stopserve.hooks import DEFAULT_MAX_BLOCKS, DEFAULT_TIMEOUT

    p.add_argument(
        "--timeout",
        type=positive_float,
        default=None if install else DEFAULT_TIMEOUT,
        help=f"seconds per call before letting the agent stop (default {DEFAULT_TIMEOUT})",
    )
    p.add_argument(
        "--max-blocks",
        type=non_negative_int,
        default=None if install else DEFAULT_MAX_BLOCKS,
        help=f"stops blocked in a row within a turn, at most (default {DEFAULT_MAX_BLOCKS})",
    )
    p.add_argument("--lambda", dest="lam", type=non_negative_float, help="cost weight sent to the service")
    p.add_argument("--safety", type=json_object, metavar="JSON|@FILE", help="safety-net config for this run")
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


def hook_call(argv: Sequence[str]) -> str | None:
    """The harness, when ``argv`` runs the hook itself (``hook claude-code|codex ...``)."""
    words = [w for w in argv if not w.startswith("-")][:2]
    return words[1] if len(words) == 2 and words[0] == "hook" and words[1] in HARNESSES else None


def hook_bad_arguments(argv: Sequence[str], harness: str) -> int:
    """A hook run with bad arguments: say so, log it, exit 0 -- a harness reads exit 2 as "block"."""
    message = Parser.last_error or "bad arguments"
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


def hook_command(args: argparse.Namespace) -> int:
    """The ``stopserve hook claude-code|codex`` command: always exits 0 (fails open)."""
    from stopserve.hooks.run import HookOptions, hook_main

    opts = HookOptions(
        harness=args.harness,
        mode=args.mode,
        max_blocks=args.max_blocks,
        lam=args.lam,
        safety=args.safety,
        end_on_model_stop=args.end_on_model_stop,
        sketch=not args.no_sketch,
    )
    return hook_main(opts, url=args.url, timeout=args.timeout, state_dir=args.state_dir)


def report_command(args: argparse.Namespace) -> int:
    """``stopserve hook report`` (``--html OUT``: the page ``stopserve report`` draws, of the hook's logs)."""
    if args.html:
        from stopserve.hooks.state import StateDir
        from stopserve.report.commands import report, service_logs

        roots = [StateDir(args.state_dir).root]
        if args.log_dir:
            roots.append(service_logs(args.log_dir))
        return report(roots, html=args.html, success_at=args.fail_below, title="stopserve hook report")
    from stopserve.hooks.report import show_report

    return show_report(state_dir=args.state_dir, fail_below=args.fail_below, as_json=args.json)


def label_command(args: argparse.Namespace) -> int:
    """``stopserve label SESSION_ID --reward X``: post the outcome, record it locally."""
    from stopserve.hooks.report import label

    with flag_words(reward="--reward"):
        return label(args.session_id, args.reward, url=args.url, state_dir=args.state_dir)


def install_command(args: argparse.Namespace) -> int:
    """``stopserve hook install claude-code|codex``."""
    from stopserve.hooks.install import HANDLER_TIMEOUT, check_url, hook_command_line, http_hook_url, install

    with flag_words(url="--url"):
        check_url(args.url)  # a typo here would leave a hook that lets every stop through, silently
    if args.http and args.harness != "claude-code":
        raise ConfigError("--http: only Claude Code runs HTTP hooks; Codex needs the command hook")
    if args.trust and args.harness != "codex":
        raise ConfigError(
            "--trust: only Codex asks to trust hooks; Claude Code runs installed hooks as they are"
        )
    options = _checked_options(args)
    # the harness's own limit stays above the hook's, so the hook's fail-open answer arrives
    handler_timeout = max(HANDLER_TIMEOUT, math.ceil(args.timeout or 0) + 2)
    if args.http:
        options.pop("state-dir", None)  # the service keeps its own (STOPSERVE_HOOK_STATE_DIR)
        query = {k.replace("-", "_"): v for k, v in options.items()}
        target = http_hook_url(args.url, query)
        result = install(args.harness, project=args.project, url=target, timeout=handler_timeout)
        shown = f"hook URL (POST): {target}"
    else:
        extra = [w for k, v in options.items() for w in ((f"--{k}",) if v == "" else (f"--{k}", v))]
        command = hook_command_line(args.harness, url=args.url, extra=extra)
        result = install(args.harness, command, project=args.project, timeout=handler_timeout)
        shown = f"hook command: {command}"
    if not result.changed:
        print(f"{result.path}: stopserve's hooks are already installed; nothing changed")
    else:
        what = [
            f"added {', '.join(result.added)}" if result.added else "",
            f"updated {', '.join(result.updated)}" if result.updated else "",
        ]
        print(f"{result.path}: {'; '.join(w for w in what if w)}")
        if result.backup:
            print(f"backup of the previous file: {result.backup}")
    print(shown)
    if args.harness == "codex":
        _codex_trust(args, result.path)
    print(
        f"the service must be running at {args.url} (stopserve serve); "
        "until it is, the hook lets every stop through. Check with: stopserve hook doctor"
    )
    return 0


def _checked_options(args: argparse.Namespace) -> dict[str, str]:
    """The hook's options to install (name -> value; ``""`` for a flag), each checked now:
    a typo must not wait for the first hook call to be found."""
    out: dict[str, str] = {}
    if args.mode != "enforce":
        out["mode"] = args.mode
    if args.state_dir:
        out["state-dir"] = str(Path(args.state_dir).expanduser().resolve())
    if args.max_blocks is not None:
        out["max-blocks"] = str(args.max_blocks)
    if args.timeout is not None:
        out["timeout"] = f"{args.timeout:g}"
    if args.lam is not None:
        out["lambda"] = f"{args.lam:g}"
    if args.safety is not None:
        import orjson

        from stopserve.safety import SafetyConfig

        SafetyConfig.from_dict(args.safety, source="--safety")  # a bad key or value: a clear error now
        out["safety"] = orjson.dumps(args.safety).decode()
    if args.end_on_model_stop:
        out["end-on-model-stop"] = ""
    if args.no_sketch:
        out["no-sketch"] = ""
    return out


def _codex_trust(args: argparse.Namespace, path: Path) -> None:
    from stopserve.hooks.install import codex_handlers
    from stopserve.hooks.trust import codex_config_path, trust, trust_status

    config = codex_config_path()
    entries = trust_status(path, codex_handlers(path), config)
    if args.trust:
        written, backup = trust(entries, config)
        if written:
            print(
                f"{config}: trusted {len(written)} stopserve hook(s)"
                + (f" (backup: {backup})" if backup else "")
            )
        else:
            print(f"{config}: stopserve's hooks were already trusted")
        return
    pending = [e for e in entries if e.status in ("untrusted", "modified")]
    if not pending:
        print(f"Codex trusts these hooks ({config}).")
        return
    changed = any(e.status == "modified" for e in pending)
    print(
        f"NOTE: Codex will not run {len(pending)} of these hooks until they are trusted"
        + (" again (the command changed, so the earlier trust no longer holds)" if changed else "")
        + ". `codex exec` runs no untrusted hook and says nothing. Either:\n"
        "  - open `codex` and trust the stopserve entries in /hooks, or\n"
        f"  - install again with --trust (stopserve writes their trusted_hash to {config}), or\n"
        "  - for automation, run `codex exec --dangerously-bypass-hook-trust`."
    )


def uninstall_command(args: argparse.Namespace) -> int:
    """``stopserve hook uninstall claude-code|codex``."""
    from stopserve.hooks.install import uninstall

    result = uninstall(args.harness, project=args.project)
    if not result.changed:
        print(f"{result.path}: no stopserve hooks found; nothing changed")
        return 0
    print(f"{result.path}: removed stopserve from {', '.join(dict.fromkeys(result.removed))}")
    if result.backup:
        print(f"backup of the previous file: {result.backup}")
    return 0


def doctor_command(args: argparse.Namespace) -> int:
    """``stopserve hook doctor [claude-code|codex]``."""
    from stopserve.hooks.doctor import check

    bad = False
    marks = {"ok": "ok     ", "note": "note   ", "problem": "PROBLEM"}
    for harness in [args.harness] if args.harness else list(HARNESSES):
        print(f"{harness}:")
        for f in check(harness, project=args.project, state_dir=args.state_dir):
            bad = bad or f.level == "problem"
            print(f"  {marks[f.level]} {f.text}")
    return 1 if bad else 0
