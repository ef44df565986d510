"""Hook input parsing: the fields each harness sends, errors that name the field."""

from __future__ import annotations

import json

import pytest

from stopserve.errors import HookInputError
from stopserve.hooks.protocol import parse_input


def raw(**data: object) -> bytes:
    return json.dumps(data).encode()


def test_claude_code_stop_subagent_and_tool_inputs() -> None:
    stop = parse_input(
        raw(hook_event_name="Stop", session_id="s1", transcript_path="/p/s1.jsonl", stop_hook_active=True),
        "claude-code",
    )
    assert (stop.kind, stop.run_id, stop.transcript, stop.stop_hook_active, stop.agent) == (
        "stop",
        "s1",
        "/p/s1.jsonl",
        True,
        "main",
    )
    sub = parse_input(
        raw(
            hook_event_name="SubagentStop",
            session_id="s1",
            transcript_path="/p/s1.jsonl",
            agent_id="ab1",
            agent_transcript_path="/p/s1/subagents/agent-ab1.jsonl",
        ),
        "claude-code",
    )
    assert (sub.run_id, sub.transcript, sub.agent) == ("s1:ab1", "/p/s1/subagents/agent-ab1.jsonl", "ab1")
    # a tool hook inside a sub-agent names only the session's transcript: the sub-agent's is derived
    tool = parse_input(
        raw(
            hook_event_name="PostToolUseFailure",
            session_id="s1",
            transcript_path="/p/s1.jsonl",
            agent_id="ab1",
            tool_name="Bash",
            tool_input={"command": "x"},
            tool_use_id="t1",
            error="Exit code 2",
        ),
        "claude-code",
    )
    assert (
        tool.kind == "tool"
        and tool.transcript == "/p/s1/subagents/agent-ab1.jsonl"
        # Claude Code's transcript has "Error: Exit code 2" (toolUseResult) for the same result
        and tool.tool_response == "Error: Exit code 2"
    )
    pre = parse_input(
        raw(
            hook_event_name="PreToolUse",
            session_id="s",
            tool_name="Bash",
            tool_input={},
            tool_use_id="t",
            tool_response={"x": 1},
        ),
        "claude-code",
    )
    assert pre.tool_response is None  # nothing ran yet
    assert parse_input(raw(hook_event_name="SessionStart", session_id="s"), "codex").kind == "other"


def test_run_ids_are_safe_and_distinct() -> None:
    a = parse_input(raw(hook_event_name="Stop", session_id="a/b"), "codex").run_id
    b = parse_input(raw(hook_event_name="Stop", session_id="a_b"), "codex").run_id
    assert a != b and "/" not in a and b == "a_b"
    long = parse_input(raw(hook_event_name="Stop", session_id="x" * 300), "codex").run_id
    assert len(long) <= 256


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (b"", "no hook input"),
        (b"[]", "JSON object"),
        (b"{bad", "not JSON"),
        (raw(session_id="s"), "hook_event_name"),
        (raw(hook_event_name="Stop", session_id=""), "session_id"),
        (raw(hook_event_name="Stop", session_id="s", stop_hook_active="yes"), "stop_hook_active"),
        (raw(hook_event_name="Stop", session_id="s", transcript_path=3), "transcript_path"),
        (raw(hook_event_name="PostToolUse", session_id="s", tool_name="Bash"), "tool_use_id"),
    ],
)
def test_bad_inputs_name_the_field(data: bytes, where: str) -> None:
    with pytest.raises(HookInputError) as info:
        parse_input(data, "claude-code")
    assert where in str(info.value)
