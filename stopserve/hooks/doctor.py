"""``stopserve hook doctor``: will the installed hooks run, reach the service, and have they run?

For each harness it checks what fails silently otherwise:

* the settings file: our handlers on every event this stopserve installs (an older
  install lacks ``PreToolUse``, so a failing loop in Claude Code is never ended);
* a command handler: its Python exists and its options parse (a typo there makes
  every call fail open); an HTTP handler (Claude Code): ``allowedHttpHookUrls`` lets
  it through;
* Codex: whether Codex trusts each handler (:mod:`stopserve.hooks.trust`) -- an
  untrusted or modified one never runs under ``codex exec``;
* the service answers ``/healthz`` at the URL the hooks use;
* the hook's log: how many calls each harness made, the last one, the last error.

Exit code 1 when something needs fixing, else 0.
"""

from __future__ import annotations

import contextlib
import fnmatch
import http.client
import io
import os
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import parse_qs, urlsplit

from stopserve.errors import ConfigError
from stopserve.hooks.install import EVENTS, HTTP_ROUTE, codex_handlers, is_ours, load_settings, settings_path
from stopserve.hooks.state import StateDir

__all__ = ["Finding", "check", "summary"]

HARNESSES: Final = ("claude-code", "codex")


@dataclass(frozen=True)
class Finding:
    """One thing the doctor found: ``ok``, ``note`` (fine, worth knowing) or ``problem``."""

    level: Literal["ok", "note", "problem"]
    text: str


@dataclass
class _Installed:
    path: Path
    handlers: list[tuple[str, dict[str, Any]]]  # (event, handler) of ours
    data: dict[str, Any]


def _installed(harness: str, project: str | None) -> _Installed | None:
    path = settings_path(harness, project)
    data = load_settings(path)
    ours = [
        (event, handler)
        for event, groups in (data.get("hooks") or {}).items()
        for group in groups
        if isinstance(group, dict)
        for handler in (group.get("hooks") or [])
        if is_ours(handler)
    ]
    return _Installed(path, ours, data) if ours else None


def _hook_args(command: str) -> tuple[list[str] | None, str | None]:
    """The hook's own arguments in an installed command, and the parse error if any."""
    from stopserve.cli import build_parser

    try:
        words = shlex.split(command)
    except ValueError as exc:
        return None, f"the command does not parse as a shell line: {exc}"
    try:
        at = words.index("hook")
    except ValueError:
        return None, "the command does not run `stopserve hook`"
    args = words[at:]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            build_parser().parse_args(args)
        except SystemExit:
            lines = [line for line in err.getvalue().splitlines() if line.strip()]
            return args, lines[-1] if lines else "bad arguments"
    return args, None


def _option(args: list[str], name: str) -> str | None:
    for i, word in enumerate(args[:-1]):
        if word == name:
            return args[i + 1]
    return None


def _healthz(url: str) -> str | None:
    """None when the service answers ``GET /healthz``, else why not."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"not an http(s) URL: {url!r}"
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(parts.hostname, parts.port, timeout=1.0)
    try:
        conn.request("GET", "/healthz")
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        return f"unreachable ({exc})"
    finally:
        conn.close()
    return None if status == 200 else f"/healthz answered HTTP {status}"


def _calls(state: StateDir, harness: str) -> tuple[int, float | None, str | None]:
    """Calls logged for ``harness``: how many, the last one's time, the last error."""
    n, last, error = 0, None, None
    for rec in state.records("decisions.jsonl"):
        if rec.get("harness") != harness:
            continue
        n += 1
        ts = rec.get("ts")
        last = float(ts) if isinstance(ts, int | float) else last
        if rec.get("error"):
            error = str(rec["error"])
    return n, last, error


def _ago(ts: float) -> str:
    seconds = max(0.0, time.time() - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def check(harness: str, *, project: str | None = None, state_dir: str | None = None) -> Iterator[Finding]:
    """What the doctor finds for one harness."""
    try:
        found = _installed(harness, project)
    except ConfigError as exc:
        yield Finding("problem", str(exc))
        return
    path = settings_path(harness, project)
    if found is None:
        yield Finding("note", f"not installed ({path} has no stopserve hooks)")
        return
    events = sorted({e for e, _ in found.handlers})
    missing = [e for e in EVENTS[harness] if e not in events]
    yield Finding("ok", f"installed in {path} on {', '.join(events)}")
    if missing:
        why = (
            " (Claude Code ends a failing loop only from PreToolUse)"
            if harness == "claude-code"
            else " (Codex ends a looping turn only by refusing calls from PreToolUse)"
        )
        yield Finding(
            "problem",
            f"missing on {', '.join(missing)}{why if 'PreToolUse' in missing else ''}: "
            f"install again (stopserve hook install {harness})",
        )
    urls: set[str] = set()
    states: set[str | None] = set()
    for _, handler in found.handlers:
        if handler.get("type") == "http":
            url = str(handler.get("url"))
            urls.add(url.split(HTTP_ROUTE, 1)[0])
            unknown = [k for k in parse_qs(urlsplit(url).query) if k not in _HTTP_QUERY]
            if unknown:
                yield Finding("problem", f"HTTP hook {url}: unknown options {', '.join(unknown)}")
            yield from _allowed(found.data, url, path)
            continue
        command = str(handler.get("command"))
        args, error = _hook_args(command)
        words = shlex.split(command) if args is not None else []
        if words and not (os.path.isfile(words[0]) or "/" not in words[0]):
            yield Finding("problem", f"the hook's Python {words[0]} does not exist (reinstall the hook)")
        if error:
            yield Finding(
                "problem", f"the installed command has a bad argument ({error}): every call fails open"
            )
        if args is not None:
            urls.add(_option(args, "--url") or os.environ.get("STOPSERVE_URL", "http://127.0.0.1:8080"))
            states.add(_option(args, "--state-dir"))
    for url in sorted(urls):
        down = _healthz(url)
        if down is None:
            yield Finding("ok", f"the service answers at {url}")
        else:
            yield Finding(
                "problem", f"the service at {url}: {down} (until it answers, every stop is let through)"
            )
    trusted = True
    if harness == "codex":
        from stopserve.hooks.trust import codex_config_path, trust_status

        config = codex_config_path()
        try:
            entries = trust_status(path, codex_handlers(path), config)
        except ConfigError as exc:
            entries = []
            yield Finding("problem", str(exc))
        bad = [e for e in entries if e.status != "trusted"]
        trusted = not bad
        if entries and not bad:
            yield Finding("ok", f"Codex trusts all {len(entries)} ({config})")
        for e in bad:
            what = {
                "untrusted": "not trusted",
                "modified": "changed since it was trusted (another --url or option)",
                "disabled": "disabled in Codex",
            }[e.status]
            yield Finding("problem", f"{e.event}: {what}; Codex skips it (`codex exec` silently)")
        if bad:
            yield Finding(
                "note",
                "to trust: `stopserve hook install codex --trust`, or /hooks in `codex`; "
                "or run `codex exec --dangerously-bypass-hook-trust`",
            )
    for where in sorted(states, key=str) or [state_dir]:
        state = StateDir(state_dir if state_dir is not None else where)
        n, last, error = _calls(state, harness)
        if not n:
            hint = " (Codex has not run them: they are not trusted)" if not trusted else ""
            yield Finding("note", f"never run yet (no calls logged in {state.root}){hint}")
            continue
        yield Finding("ok", f"{n} call(s) logged in {state.root}, the last {_ago(last or 0.0)}")
        if error:
            yield Finding("note", f"last error: {error}")


_HTTP_QUERY: Final = frozenset(
    {"mode", "max_blocks", "timeout", "lambda", "safety", "end_on_model_stop", "no_sketch"}
)


def _allowed(data: dict[str, Any], url: str, path: Path) -> Iterator[Finding]:
    allowed = data.get("allowedHttpHookUrls")
    if allowed is None:
        user = settings_path("claude-code")
        if user != path:
            with contextlib.suppress(ConfigError):
                allowed = load_settings(user).get("allowedHttpHookUrls")
    if isinstance(allowed, list) and not any(
        isinstance(p, str) and fnmatch.fnmatchcase(url, p) for p in allowed
    ):
        yield Finding(
            "problem",
            f"{url} matches no pattern in allowedHttpHookUrls: Claude Code blocks the HTTP hook",
        )


def summary(*, state_dir: str | None = None) -> list[str]:
    """Short lines for ``hook report``: per installed harness, trusted or not, calls logged."""
    out = []
    for harness in HARNESSES:
        problems = []
        installed = False
        for f in check(harness, state_dir=state_dir):
            if f.level == "problem":
                problems.append(f.text)
            if f.text.startswith("installed in"):
                installed = True
        if not installed:
            continue
        line = f"{harness} hooks: " + ("no problems found" if not problems else "; ".join(problems))
        out.append(line + "  (details: stopserve hook doctor)")
    return out
