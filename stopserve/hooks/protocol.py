"""The hook protocols of Claude Code and Codex CLI: what comes in on stdin, what goes out.

Both harnesses send one JSON object per hook call with ``hook_event_name``,
``session_id`` and ``transcript_path``; ``Stop`` and ``SubagentStop`` add
``stop_hook_active`` (the agent is already continuing because a stop hook blocked)
and ``last_assistant_message``; ``SubagentStop`` adds ``agent_id``, ``agent_type``
and ``agent_transcript_path``; tool hooks (``PreToolUse``, ``PostToolUse``, Claude
Code's ``PostToolUseFailure``) add ``tool_name``, ``tool_input``, ``tool_use_id`` and,
after the call, ``tool_response`` (``error`` on a failure). Codex adds ``turn_id``.

Answers (stdout, exit code 0), the same in both harnesses:

* let it go on or stop as it wants: print nothing;
* block a stop: ``{"decision": "block", "reason": "..."}`` -- the reason is the
  agent's next instruction;
* end the run from a tool hook: ``{"continue": false, "stopReason": "..."}``.

Exit code 2 would also block (with stderr as the reason); the hook never uses it,
so an error can never hold an agent back.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from stopserve.errors import HookInputError, Issue
from stopserve.ids import MAX_RUN_ID_CHARS, RUN_ID_CHARS

__all__ = [
    "HARNESSES",
    "STOP_EVENTS",
    "TOOL_EVENTS",
    "HookInput",
    "block_output",
    "end_output",
    "parse_input",
]

Harness = Literal["claude-code", "codex"]
HARNESSES: Final[tuple[Harness, ...]] = ("claude-code", "codex")
STOP_EVENTS: Final = frozenset({"Stop", "SubagentStop"})
TOOL_EVENTS: Final = frozenset({"PreToolUse", "PostToolUse", "PostToolUseFailure"})
#: a hook input larger than this is refused (it carries one tool call at most)
MAX_INPUT_BYTES: Final = 16 * 1024 * 1024

_RUN_ID_BAD: Final = re.compile(rf"[^{RUN_ID_CHARS}]")


def _run_id(text: str) -> str:
    """A service run id (:data:`stopserve.ids.RUN_ID_PATTERN`) for ``text``; unsafe characters: ``_``."""
    safe = _RUN_ID_BAD.sub("_", text)
    if safe != text or len(safe) > MAX_RUN_ID_CHARS:  # keep two ids that differ apart
        safe = safe[:200] + "+" + hashlib.sha256(text.encode()).hexdigest()[:16]
    return safe


@dataclass(frozen=True)
class HookInput:
    """One hook call, as the harness sent it (only what the hook uses)."""

    harness: Harness
    event: str
    session_id: str
    transcript_path: str | None = None
    cwd: str | None = None
    stop_hook_active: bool = False
    last_assistant_message: str | None = None
    agent_id: str | None = None
    agent_type: str | None = None
    agent_transcript_path: str | None = None
    turn_id: str | None = None
    tool_name: str | None = None
    tool_input: Any = None
    tool_response: Any = None
    tool_use_id: str | None = None

    @property
    def kind(self) -> Literal["stop", "tool", "other"]:
        """``stop`` for Stop/SubagentStop, ``tool`` for tool hooks, else ``other``."""
        if self.event in STOP_EVENTS:
            return "stop"
        if self.event in TOOL_EVENTS:
            return "tool"
        return "other"

    @property
    def run_id(self) -> str:
        """The service run: the session, or ``<session>:<agent id>`` for a sub-agent."""
        if self.agent_id:
            return _run_id(f"{self.session_id}:{self.agent_id}")
        return _run_id(self.session_id)

    @property
    def agent(self) -> str:
        """The acting agent's name in events: ``main``, or the sub-agent's id."""
        return self.agent_id or "main"

    @property
    def transcript(self) -> str | None:
        """The transcript of this run: the sub-agent's own, else the session's.

        Claude Code keeps a sub-agent's transcript at
        ``<session transcript without .jsonl>/subagents/agent-<agent id>.jsonl``; a tool
        hook inside a sub-agent names only the session's, so that path is derived.
        """
        if self.agent_id:
            if self.agent_transcript_path:
                return self.agent_transcript_path
            if self.harness == "claude-code" and self.transcript_path:
                base = self.transcript_path.removesuffix(".jsonl")
                return f"{base}/subagents/agent-{self.agent_id}.jsonl"
            return None
        return self.transcript_path


def _str(data: dict[str, Any], key: str, *, required: bool = False) -> str | None:
    value = data.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value):
        what = "a non-empty string" if required else "a string or null"
        raise HookInputError(
            "hook input: unexpected field value", [Issue(f"expected {what}, got {value!r:.80}", path=key)]
        )
    return value


def parse_input(raw: bytes, harness: Harness) -> HookInput:
    """Parse one hook input; a missing or ill-typed field raises :class:`HookInputError` naming it.

    >>> parse_input(b'{"hook_event_name": "Stop", "session_id": "s1"}', "codex").kind
    'stop'
    """
    if len(raw) > MAX_INPUT_BYTES:
        raise HookInputError(f"hook input larger than {MAX_INPUT_BYTES} bytes: refused")
    if not raw.strip():
        raise HookInputError("no hook input on stdin: the harness sends one JSON object per call")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise HookInputError(f"hook input is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HookInputError(f"hook input must be a JSON object, got {type(data).__name__}")
    event = _str(data, "hook_event_name", required=True)
    session = _str(data, "session_id", required=True)
    assert event is not None and session is not None
    active = data.get("stop_hook_active", False)
    if not isinstance(active, bool):
        raise HookInputError(
            "hook input: unexpected field value",
            [Issue(f"expected true or false, got {active!r:.80}", path="stop_hook_active")],
        )
    tool_use_id = _str(data, "tool_use_id")
    tool_name = _str(data, "tool_name")
    if event in TOOL_EVENTS and (not tool_use_id or not tool_name):
        missing = "tool_use_id" if not tool_use_id else "tool_name"
        raise HookInputError(
            f"hook input: {event} without {missing}", [Issue("required for tool hooks", path=missing)]
        )
    response = data.get("tool_response")
    if event == "PostToolUseFailure" and response is None:
        response = data.get("error", "")  # Claude Code reports the failure as `error`
    return HookInput(
        harness=harness,
        event=event,
        session_id=session,
        transcript_path=_str(data, "transcript_path"),
        cwd=_str(data, "cwd"),
        stop_hook_active=active,
        last_assistant_message=_str(data, "last_assistant_message"),
        agent_id=_str(data, "agent_id"),
        agent_type=_str(data, "agent_type"),
        agent_transcript_path=_str(data, "agent_transcript_path"),
        turn_id=_str(data, "turn_id"),
        tool_name=tool_name,
        tool_input=data.get("tool_input"),
        tool_response=response if event != "PreToolUse" else None,
        tool_use_id=tool_use_id,
    )


def block_output(reason: str) -> dict[str, Any]:
    """Block a stop: the agent goes on with ``reason`` as its next instruction."""
    return {"decision": "block", "reason": reason}


def end_output(reason: str) -> dict[str, Any]:
    """End the run from a tool hook (``stopReason`` is shown to the user)."""
    return {"continue": False, "stopReason": reason}
