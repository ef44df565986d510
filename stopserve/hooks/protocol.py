"""The hook protocols of Claude Code and Codex CLI: what comes in, what goes out.

Observed on the real binaries (Claude Code 2.1.328, Codex CLI 0.169.0; the versions
``tests/harness/package.json`` pins). Every event has ``hook_event_name``,
``session_id``, ``transcript_path``, ``cwd`` and ``permission_mode``; Claude Code adds
``prompt_id`` (one per user prompt: the turn), Codex ``turn_id`` and ``model``.
``Stop``/``SubagentStop`` add ``stop_hook_active`` and ``last_assistant_message``;
``SubagentStop`` adds ``agent_id``, ``agent_type``, ``agent_transcript_path``; tool
hooks add ``tool_name``, ``tool_input``, ``tool_use_id`` and, after the call,
``tool_response`` (Claude Code: an object, for Bash ``stdout``/``stderr``/...; Codex:
the output text, no exit code). Claude Code's ``PostToolUseFailure`` has ``error``
(the text without the ``Error: `` prefix its transcript gives the same result) and no
``tool_response``; Codex never sends it.

What each harness does with an answer (stdout, exit code 0), as observed:

* nothing: both go on (or stop) as they wanted;
* ``Stop`` ``{"decision": "block", "reason"}``: both give the reason to the agent as
  its next instruction;
* ``PreToolUse`` deny (``hookSpecificOutput.permissionDecision: "deny"``): in both the
  call does not run and the model reads the reason (Codex also logs it on stderr);
* ``continue: false``: Claude Code ends the turn (``terminal_reason: hook_stopped``)
  from ``PreToolUse`` and ``PostToolUse``, and from ``PostToolUseFailure`` only logs
  "requested preventContinuation"; Codex rejects it from ``PreToolUse`` as unsupported
  and from ``PostToolUse`` only replaces the output the model sees;
* ``PostToolUse`` ``{"decision": "block", "reason"}``: Codex replaces the output the
  model sees with the reason;
* ``systemMessage``: Claude Code shows it to the user (in ``stream-json`` a ``system``
  message of subtype ``informational``); ``codex exec`` shows it nowhere.

So a run is ended where each harness allows it (:func:`end_output`): after a call the
model is told to report and finish (``decision: block``), and from then on every tool
call of the turn is refused from ``PreToolUse`` -- in Claude Code with ``continue:
false``, which ends the turn and shows the user why; in Codex the refusals bring the
turn to its ``Stop``. Exit code 2 would block (both harnesses read it so); the hook
never uses it, so an error can never hold an agent back.
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
    "Harness",
    "HookInput",
    "block_output",
    "end_output",
    "nudge_output",
    "parse_input",
    "refuse_output",
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
    prompt_id: str | None = None
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
    def turn(self) -> str | None:
        """The turn this call belongs to: Codex's ``turn_id``, Claude Code's ``prompt_id``."""
        return self.turn_id or self.prompt_id

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
        # Claude Code reports the failure as `error`; its transcript's toolUseResult is the
        # same text after "Error: ", and the result's hash must be the same in both places
        error = data.get("error")
        text = error if isinstance(error, str) else ""
        response = text if text.startswith("Error: ") else f"Error: {text}"
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
        prompt_id=_str(data, "prompt_id"),
        tool_name=tool_name,
        tool_input=data.get("tool_input"),
        tool_response=response if event != "PreToolUse" else None,
        tool_use_id=tool_use_id,
    )


def block_output(reason: str) -> dict[str, Any]:
    """Block a stop: the agent goes on with ``reason`` as its next instruction."""
    return {"decision": "block", "reason": reason}


def end_output(inp: HookInput, reason: str) -> dict[str, Any]:
    """End the run from a tool hook, the way this harness honours it (see the module docstring).

    ``PreToolUse``: the call is refused; in Claude Code also ``continue: false`` (the turn
    ends) with the reason as ``stopReason`` and ``systemMessage`` (the user is shown it).
    After a call (``PostToolUse``, ``PostToolUseFailure``): ``decision: block``, the reason
    to the model, which is told to report and finish; its next call is refused. (Claude
    Code's ``continue: false`` there would end the turn one model call sooner, but shows
    the user nothing in ``claude -p``; from ``PostToolUseFailure`` it is not acted on.)
    """
    if inp.event != "PreToolUse":
        return {"decision": "block", "reason": reason}
    if inp.harness == "codex":
        return refuse_output(reason)
    return {
        "continue": False,
        "stopReason": reason,
        "systemMessage": reason,
        "hookSpecificOutput": _deny(reason),
    }


def nudge_output(inp: HookInput, nudge: str) -> dict[str, Any] | None:
    """Tell the agent, after a call, that it repeats itself (``None``: not after a call).

    Claude Code (``PostToolUse``, ``PostToolUseFailure``): ``additionalContext``, which the
    model reads beside the call's result. Codex (``PostToolUse``): ``decision: block``,
    whose reason replaces the output the model sees: the reason is the nudge, then the
    output unchanged (``tests/harness`` checks both on the real binaries).
    """
    if inp.event not in ("PostToolUse", "PostToolUseFailure"):
        return None
    if inp.harness == "codex":
        if inp.event != "PostToolUse":
            return None
        output = (
            inp.tool_response
            if isinstance(inp.tool_response, str)
            else orjson.dumps(inp.tool_response).decode()
        )
        return {"decision": "block", "reason": f"{nudge}\n\nThe output, unchanged:\n{output}"}
    return {"hookSpecificOutput": {"hookEventName": inp.event, "additionalContext": nudge}}


def refuse_output(reason: str) -> dict[str, Any]:
    """Refuse a tool call from ``PreToolUse`` (both harnesses): it does not run, the model reads why."""
    return {"hookSpecificOutput": _deny(reason)}


def _deny(reason: str) -> dict[str, Any]:
    return {"hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": reason}
