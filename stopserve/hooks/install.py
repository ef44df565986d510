"""``stopserve hook install|uninstall claude-code|codex``: merge hook entries into a settings file.

Both harnesses read hooks in the same shape, event -> matcher groups -> handlers::

    {"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "...", "timeout": 5}]}]}}

* Claude Code: ``~/.claude/settings.json`` (``$CLAUDE_CONFIG_DIR`` when set), or
  ``<project>/.claude/settings.json`` with ``--project``; events ``Stop``,
  ``SubagentStop``, ``PostToolUse``, ``PostToolUseFailure``;
* Codex CLI: ``~/.codex/hooks.json`` (``$CODEX_HOME`` when set), or
  ``<project>/.codex/hooks.json``; events ``Stop``, ``SubagentStop``, ``PostToolUse``.
  Codex runs a new or changed command hook only once it is trusted (``/hooks`` in Codex).

Installing merges: everything else in the file stays as it was; a handler of ours
(its command runs ``stopserve hook``) is updated in place, never added twice, so a
second install changes nothing. Before any change the file is copied to
``<file>.<UTC time>.stopserve.bak``, and the new file is written atomically.
Uninstalling removes only our handlers (and the groups and events they leave empty).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import orjson

from stopserve.errors import ConfigError, Issue

__all__ = ["EVENTS", "InstallResult", "hook_command_line", "install", "settings_path", "uninstall"]

EVENTS: Final[dict[str, tuple[str, ...]]] = {
    "claude-code": ("Stop", "SubagentStop", "PostToolUse", "PostToolUseFailure"),
    "codex": ("Stop", "SubagentStop", "PostToolUse"),
}
#: seconds the harness gives one hook call (the hook itself gives up after --timeout)
HANDLER_TIMEOUT: Final = 5
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
    """Whether a handler runs ``stopserve hook`` (any Python, any options)."""
    return (
        isinstance(handler, dict)
        and isinstance(handler.get("command"), str)
        and bool(_OURS.search(handler["command"]))
    )


def _load(path: Path) -> dict[str, Any]:
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
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        backup = path.with_name(f"{path.name}.{stamp}.stopserve.bak")
        n = 1
        while backup.exists():
            n += 1
            backup = path.with_name(f"{path.name}.{stamp}-{n}.stopserve.bak")
        shutil.copy2(path, backup)
        result.backup = backup
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
        if result.backup is not None:
            shutil.copymode(result.backup, tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def install(harness: str, command: str, *, project: str | os.PathLike[str] | None = None) -> InstallResult:
    """Merge a handler running ``command`` into every hook event of ``harness``."""
    path = settings_path(harness, project)
    data = _load(path)
    result = InstallResult(path)
    hooks: dict[str, Any] = data.setdefault("hooks", {})
    handler = {"type": "command", "command": command, "timeout": HANDLER_TIMEOUT}
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
    data = _load(path)
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
            f"--url {url!r}: expected the service's http:// or https:// URL, e.g. http://127.0.0.1:8080"
        )
    try:
        parts.port  # noqa: B018 - raises ValueError on a port that is no number or out of range
    except ValueError as exc:
        raise ConfigError(f"--url {url!r}: {exc}") from None
    return url


def install_command(args: argparse.Namespace) -> int:
    """``stopserve hook install claude-code|codex``."""
    check_url(args.url)  # a typo here would leave a hook that lets every stop through, silently
    extra: list[str] = []
    if args.mode != "enforce":
        extra += ["--mode", args.mode]
    if args.state_dir:
        extra += ["--state-dir", str(Path(args.state_dir).expanduser().resolve())]
    if args.max_blocks is not None:
        extra += ["--max-blocks", str(args.max_blocks)]
    command = hook_command_line(args.harness, url=args.url, extra=extra)
    result = install(args.harness, command, project=args.project)
    if not result.changed:
        print(f"{result.path}: stopserve's hooks are already installed; nothing changed")
        return 0
    what = [
        f"added {', '.join(result.added)}" if result.added else "",
        f"updated {', '.join(result.updated)}" if result.updated else "",
    ]
    print(f"{result.path}: {'; '.join(w for w in what if w)}")
    if result.backup:
        print(f"backup of the previous file: {result.backup}")
    print(f"hook command: {command}")
    if args.harness == "codex":
        print(
            "Codex runs a new or changed hook only once trusted: "
            "open /hooks in Codex and trust the stopserve entries."
        )
    print(
        f"the service must be running at {args.url} (stopserve serve); "
        "until it is, the hook lets every stop through"
    )
    return 0


def uninstall_command(args: argparse.Namespace) -> int:
    """``stopserve hook uninstall claude-code|codex``."""
    result = uninstall(args.harness, project=args.project)
    if not result.changed:
        print(f"{result.path}: no stopserve hooks found; nothing changed")
        return 0
    print(f"{result.path}: removed stopserve from {', '.join(dict.fromkeys(result.removed))}")
    if result.backup:
        print(f"backup of the previous file: {result.backup}")
    return 0
