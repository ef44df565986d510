"""Codex CLI's hook trust: which installed hooks Codex will run, and trusting ours.

Codex runs a command hook from a user or project ``hooks.json`` only once it is
trusted: its ``config.toml`` (``$CODEX_HOME``, else ``~/.codex``) then holds ::

    [hooks.state."/home/me/.codex/hooks.json:pre_tool_use:0:1"]
    trusted_hash = "sha256:..."

The key is the file, the event's snake-case name, the matcher group's index and the
handler's index in it; the hash is SHA-256 of the handler's normalized identity as
compact JSON with sorted keys (``event_name``, the group's ``matcher`` when it has one,
and ``hooks``: the one handler with ``type``, ``command``, ``timeout`` -- 600 when not
set -- and ``async``). A hook whose hash differs from its ``trusted_hash`` (the command
changed: another ``--url``, ``--mode``, ...) is *modified* and does not run again until
trusted again; ``codex exec`` never asks, it silently skips it (unless run with
``--dangerously-bypass-hook-trust``). The interactive TUI asks (``/hooks``).

Checked against Codex CLI 0.169.0's own view (``codex app-server``'s ``hooks/list``:
``currentHash``, ``trustStatus``) in ``tests/harness``.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import orjson

from stopserve.errors import ConfigError, Issue
from stopserve.hooks.state import replace_file

__all__ = ["HookTrust", "codex_config_path", "hook_hash", "hook_key", "trust", "trust_status"]

#: Codex's name of each hook event in trust keys and hashes
EVENT_LABELS: Final = {
    "PreToolUse": "pre_tool_use",
    "PostToolUse": "post_tool_use",
    "Stop": "stop",
    "SubagentStop": "subagent_stop",
    "PermissionRequest": "permission_request",
    "UserPromptSubmit": "user_prompt_submit",
    "SessionStart": "session_start",
}
_DEFAULT_TIMEOUT: Final = 600

Status = Literal["trusted", "untrusted", "modified", "disabled"]


@dataclass(frozen=True)
class HookTrust:
    """One installed hook as Codex sees it."""

    key: str
    event: str
    command: str
    current_hash: str
    trusted_hash: str | None
    status: Status


def codex_config_path() -> Path:
    """The user ``config.toml`` Codex reads (and its TUI writes trust to)."""
    home = os.environ.get("CODEX_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".codex") / "config.toml"


def hook_key(hooks_file: Path, event: str, group: int, handler: int) -> str:
    """The trust key of one handler: ``<file>:<event>:<group index>:<handler index>``."""
    label = EVENT_LABELS.get(event, re.sub(r"(?<!^)(?=[A-Z])", "_", event).lower())
    return f"{os.path.abspath(hooks_file)}:{label}:{group}:{handler}"


def hook_hash(event: str, handler: dict[str, Any], matcher: str | None = None) -> str:
    """The hash Codex computes for a command handler (see the module docstring)."""
    label = EVENT_LABELS.get(event, re.sub(r"(?<!^)(?=[A-Z])", "_", event).lower())
    timeout = handler.get("timeout", handler.get("timeoutSec"))
    normalized: dict[str, Any] = {
        "type": "command",
        "command": handler.get("command"),
        "timeout": max(1, int(timeout)) if isinstance(timeout, int | float) else _DEFAULT_TIMEOUT,
        "async": bool(handler.get("async", False)),
    }
    if isinstance(handler.get("statusMessage"), str):
        normalized["statusMessage"] = handler["statusMessage"]
    identity: dict[str, Any] = {"event_name": label, "hooks": [normalized]}
    if matcher is not None:
        identity["matcher"] = matcher
    raw = orjson.dumps(identity, option=orjson.OPT_SORT_KEYS)
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _states(config: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(config.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{config}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{config}: not valid TOML: {exc}", [Issue(str(exc), file=str(config))]) from None
    hooks = data.get("hooks")
    states = hooks.get("state") if isinstance(hooks, dict) else None
    return states if isinstance(states, dict) else {}


def trust_status(
    hooks_file: Path, handlers: list[tuple[str, int, int, dict[str, Any], str | None]], config: Path
) -> list[HookTrust]:
    """How Codex sees each ``(event, group index, handler index, handler, matcher)``."""
    states = _states(config)
    out = []
    for event, group, index, handler, matcher in handlers:
        key = hook_key(hooks_file, event, group, index)
        current = hook_hash(event, handler, matcher)
        state = states.get(key)
        trusted = state.get("trusted_hash") if isinstance(state, dict) else None
        trusted = trusted if isinstance(trusted, str) else None
        status: Status
        if isinstance(state, dict) and state.get("enabled") is False:
            status = "disabled"
        elif trusted is None:
            status = "untrusted"
        else:
            status = "trusted" if trusted == current else "modified"
        out.append(HookTrust(key, event, str(handler.get("command")), current, trusted, status))
    return out


def _toml_key(key: str) -> str:
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def trust(entries: list[HookTrust], config: Path) -> tuple[list[str], Path | None]:
    """Write ``trusted_hash`` for each entry not trusted yet into ``config``: ``(keys written, backup)``.

    Everything else in the file stays as it was: a new entry is appended as its own
    ``[hooks.state."<key>"]`` table, an existing one has its ``trusted_hash`` line
    replaced. The result is parsed again before it replaces the file (atomically, after
    a backup); a file laid out so that this cannot be done safely is left alone, with
    an error that says to trust the hooks in Codex (``/hooks``) instead.
    """
    todo = [e for e in entries if e.status in ("untrusted", "modified")]
    if not todo:
        return [], None
    try:
        text = config.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    for entry in todo:
        header = f"[hooks.state.{_toml_key(entry.key)}]"
        line = f'trusted_hash = "{entry.current_hash}"'
        at = text.find(header + "\n")
        if entry.trusted_hash is None or at < 0:
            if at >= 0:  # a table with no trusted_hash yet: add it under the header
                end = at + len(header) + 1
                text = text[:end] + line + "\n" + text[end:]
            else:
                text += ("" if not text or text.endswith("\n") else "\n") + f"\n{header}\n{line}\n"
            continue
        body_end = text.find("\n[", at + len(header))
        body = text[at : body_end if body_end >= 0 else len(text)]
        new_body, n = re.subn(r'(?m)^trusted_hash\s*=\s*"[^"\n]*"[ \t]*$', line, body, count=1)
        if n != 1:
            raise ConfigError(
                f"{config}: the trust entry of {entry.key} is laid out in a way stopserve does not "
                "edit; trust the hooks in Codex instead (`codex`, then /hooks)"
            )
        text = text[:at] + new_body + text[at + len(body) :]
    try:
        check = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"{config}: could not add the trust entries without breaking the file ({exc}); "
            "nothing was changed: trust the hooks in Codex instead (`codex`, then /hooks)"
        ) from None
    states = check.get("hooks", {}).get("state", {})
    for entry in todo:
        if states.get(entry.key, {}).get("trusted_hash") != entry.current_hash:  # pragma: no cover
            raise ConfigError(f"{config}: the trust entry of {entry.key} did not take; nothing was changed")
    backup = replace_file(config, text.encode())
    return [e.key for e in todo], backup
