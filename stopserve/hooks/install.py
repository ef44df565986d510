"""``stopserve hook install|uninstall claude-code|codex``: merge hook entries into a settings file.

Both harnesses read hooks in the same shape, event -> matcher groups -> handlers::

    {"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "...", "timeout": 5}]}]}}

* Claude Code: ``~/.claude/settings.json`` (``$CLAUDE_CONFIG_DIR`` when set), or
  ``<project>/.claude/settings.json`` with ``--project``; events ``Stop``,
  ``SubagentStop``, ``PreToolUse``, ``PostToolUse``, ``PostToolUseFailure`` (Claude Code
  ends a run from ``PreToolUse`` and ``PostToolUse``, not from ``PostToolUseFailure``:
  a failing loop ends at the next call's ``PreToolUse``). ``--http`` writes
  ``"type": "http"`` handlers that POST to the service's ``/v1/hooks/claude-code``
  instead of starting a process per call (and adds the URL to ``allowedHttpHookUrls``
  when the file restricts them);
* Codex CLI: ``~/.codex/hooks.json`` (``$CODEX_HOME`` when set), or
  ``<project>/.codex/hooks.json``; events ``Stop``, ``SubagentStop``, ``PreToolUse``,
  ``PostToolUse``. Codex runs a new or changed command hook only once it is trusted
  (:mod:`stopserve.hooks.trust`); ``--trust`` trusts ours in ``config.toml``.

Installing merges: everything else in the file stays as it was; a handler of ours
(its command runs ``stopserve hook``) is updated in place, never added twice, so a
second install changes nothing. Before any change the file is copied to
``<file>.<UTC time>.stopserve.bak``, and the new file is written atomically.
Uninstalling removes only our handlers (and the groups and events they leave empty).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode, urlsplit

import orjson

from stopserve.errors import ConfigError, Issue
from stopserve.hooks.state import replace_file

__all__ = [
    "EVENTS",
    "HANDLER_TIMEOUT",
    "HTTP_ROUTE",
    "InstallResult",
    "check_url",
    "codex_handlers",
    "hook_command_line",
    "http_hook_url",
    "install",
    "is_ours",
    "load_settings",
    "settings_path",
    "uninstall",
]

EVENTS: Final[dict[str, tuple[str, ...]]] = {
    "claude-code": ("Stop", "SubagentStop", "PreToolUse", "PostToolUse", "PostToolUseFailure"),
    "codex": ("Stop", "SubagentStop", "PreToolUse", "PostToolUse"),
}
#: seconds the harness gives one hook call (the hook itself gives up after --timeout)
HANDLER_TIMEOUT: Final = 5
#: the service's route for Claude Code's HTTP hooks
HTTP_ROUTE: Final = "/v1/hooks/claude-code"
_OURS: Final = re.compile(
    r"(?:^|[\s/\\'\"])(?:-m\s+stopserve(?:\.cli)?|stopserve)['\"]?\s+hook\s+(?:claude-code|codex)\b"
)


@dataclass
class InstallResult:
    """What an install or uninstall did to the settings file."""

    path: Path
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    backup: Path | None = None

    @property
    def changed(self) -> bool:
        """Whether the file was written."""
        return bool(self.added or self.updated or self.removed)


def settings_path(harness: str, project: str | os.PathLike[str] | None = None) -> Path:
    """The settings file the hooks go into."""
    if harness == "claude-code":
        if project is not None:
            return Path(project).expanduser() / ".claude" / "settings.json"
        home = os.environ.get("CLAUDE_CONFIG_DIR")
        return (Path(home).expanduser() if home else Path.home() / ".claude") / "settings.json"
    if project is not None:
        return Path(project).expanduser() / ".codex" / "hooks.json"
    home = os.environ.get("CODEX_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".codex") / "hooks.json"


def hook_command_line(harness: str, *, url: str | None = None, extra: list[str] | None = None) -> str:
    """The handler's command: this Python running ``-m stopserve hook <harness>`` (quoted for a shell)."""
    words = [sys.executable, "-m", "stopserve", "hook", harness]
    if url:
        words += ["--url", url]
    words += extra or []
    return " ".join(shlex.quote(w) for w in words)


def is_ours(handler: Any) -> bool:
    """Whether a handler is stopserve's: a command running ``stopserve hook`` (any Python, any
    options), or an HTTP hook posting to the service's ``/v1/hooks/claude-code``."""
    if not isinstance(handler, dict):
        return False
    if isinstance(handler.get("command"), str):
        return bool(_OURS.search(handler["command"]))
    url = handler.get("url")
    return handler.get("type") == "http" and isinstance(url, str) and HTTP_ROUTE in url


def http_hook_url(url: str, query: dict[str, str]) -> str:
    """The URL an HTTP hook posts to: the service's route, with the hook's options as query."""
    base = url.rstrip("/") + HTTP_ROUTE
    return base + ("?" + urlencode(query) if query else "")


def _allow_pattern(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/v1/hooks/*"


def load_settings(path: Path) -> dict[str, Any]:
    """A settings file's JSON (``{}`` when absent); one we cannot merge into raises :class:`ConfigError`."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not raw.strip():
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: not valid JSON; fix it, then install again (nothing was changed)",
            [Issue(f"{exc.msg} (column {exc.colno})", file=str(path), line=exc.lineno)],
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object at the top, got {type(data).__name__}")
    hooks = data.get("hooks", {})
    if not isinstance(hooks, dict):
        raise ConfigError(
            f"{path}: cannot merge hooks",
            [Issue("expected an object of events", file=str(path), path="hooks")],
        )
    for event, groups in hooks.items():
        if not isinstance(groups, list):
            raise ConfigError(
                f"{path}: cannot merge hooks",
                [Issue("expected a list of matcher groups", file=str(path), path=f"hooks.{event}")],
            )
    return data


def _write(path: Path, data: dict[str, Any], result: InstallResult) -> None:
    result.backup = replace_file(path, orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")


def install(
    harness: str,
    command: str | None = None,
    *,
    project: str | os.PathLike[str] | None = None,
    url: str | None = None,
    timeout: int = HANDLER_TIMEOUT,
) -> InstallResult:
    """Merge our handler into every hook event of ``harness``: a command running ``command``,
    or (Claude Code) an HTTP hook posting to ``url`` (:func:`http_hook_url`)."""
    path = settings_path(harness, project)
    data = load_settings(path)
    result = InstallResult(path)
    hooks: dict[str, Any] = data.setdefault("hooks", {})
    if url is not None:
        handler: dict[str, Any] = {"type": "http", "url": url, "timeout": timeout}
        allowed = data.get("allowedHttpHookUrls")
        if isinstance(allowed, list) and _allow_pattern(url) not in allowed:
            # the file restricts HTTP hooks to these patterns: without ours, Claude Code blocks ours
            allowed.append(_allow_pattern(url))
            result.updated.append("allowedHttpHookUrls")
    else:
        handler = {"type": "command", "command": command, "timeout": timeout}
    for event in EVENTS[harness]:
        groups: list[Any] = hooks.setdefault(event, [])
        found = False
        for group in groups:
            handlers = group.get("hooks") if isinstance(group, dict) else None
            if not isinstance(handlers, list):
                continue
            for i, existing in enumerate(handlers):
                if not is_ours(existing):
                    continue
                if found:  # a second copy of ours: drop it
                    handlers[i] = None
                    result.updated.append(event)
                    continue
                found = True
                if existing != handler:
                    handlers[i] = handler
                    result.updated.append(event)
            group["hooks"] = [h for h in handlers if h is not None]
        if not found:
            groups.append({"hooks": [handler]})
            result.added.append(event)
    if result.changed:
        _write(path, data, result)
    return result


def uninstall(harness: str, *, project: str | os.PathLike[str] | None = None) -> InstallResult:
    """Remove our handlers from the settings file; everything else stays."""
    path = settings_path(harness, project)
    result = InstallResult(path)
    if not path.exists():
        return result
    data = load_settings(path)
    hooks = data.get("hooks")
    if not isinstance(hooks, dict):
        return result
    for event in list(hooks):
        groups = hooks[event]
        kept_groups = []
        for group in groups:
            handlers = group.get("hooks") if isinstance(group, dict) else None
            if not isinstance(handlers, list):
                kept_groups.append(group)
                continue
            kept = [h for h in handlers if not is_ours(h)]
            if len(kept) < len(handlers):
                result.removed.append(event)
                if not kept:
                    continue  # the group held only ours
                group["hooks"] = kept
            kept_groups.append(group)
        if event in result.removed and not kept_groups:
            del hooks[event]
        else:
            hooks[event] = kept_groups
    if result.changed and not hooks:
        del data["hooks"]  # ours were the only hooks: leave no empty object behind
    if result.changed:
        _write(path, data, result)
    return result


def check_url(url: str) -> str:
    """``url`` when it is an http(s) URL with a host (the service the hook will call), else ConfigError."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"url {url!r}: expected the service's http:// or https:// URL, e.g. http://127.0.0.1:8080"
        )
    try:
        parts.port  # noqa: B018 - raises ValueError on a port that is no number or out of range
    except ValueError as exc:
        raise ConfigError(f"url {url!r}: {exc}") from None
    return url


def codex_handlers(path: Path) -> list[tuple[str, int, int, dict[str, Any], str | None]]:
    """Our handlers in a Codex ``hooks.json``: ``(event, group index, handler index, handler, matcher)``."""
    data = load_settings(path)
    out = []
    for event, groups in (data.get("hooks") or {}).items():
        for g, group in enumerate(groups):
            handlers = group.get("hooks") if isinstance(group, dict) else None
            matcher = group.get("matcher") if isinstance(group, dict) else None
            for h, handler in enumerate(handlers if isinstance(handlers, list) else []):
                if is_ours(handler):
                    out.append((event, g, h, handler, matcher if isinstance(matcher, str) else None))
    return out
