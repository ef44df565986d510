"""codex importer: a real Codex CLI 0.77.0 rollout (data/codex, Apache-2.0, see
data/README.md), and rollouts written here in the documented record format: tool calls
and outputs, token counts, turn ends, patches, a sub-agent thread."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stopserve.importers.codex import CodexMapper, read, result_payload, tool_call

DATA = Path(__file__).parent / "data" / "codex"
#: real tool output (pytest 9.0.3, codex-cli 0.169.0's apply_patch, ...: tests/signals/data/README.md)
TOOLS = Path(__file__).parents[1] / "signals" / "data" / "tools"


def ts(second: float) -> str:
    return f"2026-05-02T08:00:{int(second):02d}.{round((second % 1) * 1000):03d}Z"


def rec(t: float, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"timestamp": ts(t), "type": kind, "payload": payload}


def meta(thread: str, **source: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {"id": thread, "cwd": "/w", "cli_version": "0.130.0"}
    if source:
        payload["source"] = {"subagent": {"thread_spawn": source}}
    return rec(0, "session_meta", payload)


def call(t: float, call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return rec(
        t,
        "response_item",
        {"type": "function_call", "name": name, "arguments": json.dumps(args), "call_id": call_id},
    )


def output(t: float, call_id: str, text: str) -> dict[str, Any]:
    return rec(t, "response_item", {"type": "function_call_output", "call_id": call_id, "output": text})


def tokens(t: float, inp: int, cached: int, out: int) -> dict[str, Any]:
    usage = {
        "input_tokens": inp,
        "cached_input_tokens": cached,
        "output_tokens": out,
        "total_tokens": inp + out,
    }
    return rec(
        t,
        "event_msg",
        {"type": "token_count", "info": {"total_token_usage": usage, "last_token_usage": usage}},
    )


def exec_out(code: int, body: str, wall: float) -> str:
    return f"Chunk ID: 5f3a\nWall time: {wall:.4f} seconds\nProcess exited with code {code}\nOutput:\n{body}"


def write(path: Path, lines: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_the_real_rollout() -> None:
    (trace,) = list(read(DATA))
    assert trace.trace_id == "019b64e5-57fa-7463-b644-fba7e456f905" and trace.system == "codex"
    # the prompt once (the event), not its response_item copy nor the environment context
    assert [(e.type, e.agent, e.role) for e in trace.events[:-1]] == [("communicate", "user", "human")]
    assert trace.metrics["lines"] == 6 and trace.metrics["lines_skipped"] == 5


def test_a_turn_with_tool_calls(tmp_path: Path) -> None:
    path = write(
        tmp_path / "rollout-1.jsonl",
        [
            meta("t-1"),
            rec(1, "event_msg", {"type": "task_started", "turn_id": "turn-1"}),
            rec(
                1,
                "response_item",
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
            ),
            rec(1, "event_msg", {"type": "user_message", "message": "fix it"}),
            tokens(2, 1000, 200, 50),
            call(2, "c1", "exec_command", {"cmd": "pytest -q"}),
            output(3, "c1", exec_out(1, "1 failed", 0.51)),
            rec(
                4,
                "response_item",
                {
                    "type": "custom_tool_call",
                    "name": "apply_patch",
                    "call_id": "c2",
                    "input": "*** Begin Patch\n*** Update File: src/app.py\n@@\n-x\n+y\n*** End Patch",
                },
            ),
            rec(
                4, "response_item", {"type": "custom_tool_call_output", "call_id": "c2", "output": "Success."}
            ),
            tokens(5, 2500, 900, 80),
            call(5, "c3", "shell", {"command": ["bash", "-lc", "pytest -q"]}),
            output(
                6,
                "c3",
                json.dumps({"output": "3 passed", "metadata": {"exit_code": 0, "duration_seconds": 0.4}}),
            ),
            rec(
                7,
                "response_item",
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Fixed."}],
                },
            ),
            rec(7, "event_msg", {"type": "agent_message", "message": "Fixed."}),
            rec(
                7, "event_msg", {"type": "task_complete", "turn_id": "turn-1", "last_agent_message": "Fixed."}
            ),
        ],
    )
    (trace,) = list(read(path))
    rows = [(e.id, e.type, e.tool, e.error) for e in trace.events]
    assert ("c1", "tool_use", "Bash", None) in rows and ("c1.out", "return", "Bash", True) in rows
    assert ("c2", "tool_use", "apply_patch", None) in rows
    assert ("c3.out", "return", "Bash", False) in rows  # the old JSON output shape, exit code 0
    # `exec_command {"cmd": ...}` and `shell {"command": [bash -lc ...]}` are one action: equal refs
    refs = {e.id: e.content_ref for e in trace.events}
    assert refs["c1"] == refs["c3"]
    stop = next(e for e in trace.events if e.type == "stop" and e.proposed)
    assert stop.id == "turn-1.stop"
    # tokens: uncached input + output, from the growth of the running total
    counted = [e.tokens for e in trace.events if e.tokens]
    assert counted == [1000 - 200 + 50, (2500 - 900 + 80) - (1000 - 200 + 50)]
    assert trace.costs["cache_read_tokens"] == 900
    assert sum(1 for e in trace.events if e.type == "communicate") == 2  # prompt and answer, once each


def test_results_carry_progress_from_exit_codes_test_runs_and_patches() -> None:
    patched = (TOOLS / "codex-apply-patch.txt").read_text()  # "Success. Updated the following files:"
    patch = "*** Begin Patch\n*** Add File: new.py\n+x\n*** Update File: old.py\n@@\n-a\n+b\n*** End Patch"
    mapper = CodexMapper()
    lines = [
        call(1, "c1", "exec_command", {"cmd": "python -m pytest -q"}),
        output(2, "c1", exec_out(1, (TOOLS / "pytest-q-fail.txt").read_text(), 0.4)),
        rec(
            3,
            "response_item",
            {"type": "custom_tool_call", "name": "apply_patch", "call_id": "c2", "input": patch},
        ),
        rec(
            4,
            "response_item",
            {
                "type": "custom_tool_call_output",
                "call_id": "c2",
                "output": json.dumps(
                    {"output": patched, "metadata": {"exit_code": 0, "duration_seconds": 0.0}}
                ),
            },
        ),
        call(5, "c3", "exec_command", {"cmd": "git status"}),
        output(6, "c3", exec_out(0, (TOOLS / "git-status.txt").read_text(), 0.01)),
        call(7, "c4", "exec_command", {"cmd": "ls"}),
        output(8, "c4", exec_out(0, "a.py\nb.py\n", 0.01)),
    ]
    events = [e for line in lines for e in mapper.feed(line)]
    progress = {e["id"]: e.get("progress") for e in events if e["type"] == "return"}
    run = progress["c1.out"]
    assert (run["tests_passed"], run["tests_failed"], run["exit_code"], run["source"]) == (1, 3, 1, "pytest")
    assert run["error"].startswith("tests:")
    assert progress["c2.out"] == {"exit_code": 0, "files_changed": 2, "source": "apply_patch"}
    # deleted b.py, modified a.py, untracked c.py and status.out
    assert progress["c3.out"] == {"exit_code": 0, "files_changed": 4, "source": "git"}
    assert progress["c4.out"] == {"exit_code": 0, "source": "exit_code"}


def test_the_hook_and_the_rollout_read_the_same_progress() -> None:
    """A PostToolUse hook's output is the bare text; the exit code comes from the command's end."""
    body = (TOOLS / "pytest-q-fail.txt").read_text()
    live = CodexMapper()
    live.feed(call(1, "c5", "exec_command", {"cmd": "pytest -q"}))
    live.feed(rec(2, "event_msg", {"type": "exec_command_end", "call_id": "c5", "exit_code": 1}))
    live.tool_event("c5", "Bash", {"command": "pytest -q"}, body, 1.0e9, error=False)
    (hooked,) = live.drain()
    offline = CodexMapper()
    offline.feed(call(1, "c5", "exec_command", {"cmd": "pytest -q"}))
    (logged,) = offline.feed(output(2, "c5", exec_out(1, body, 0.4)))
    assert hooked["progress"] == logged["progress"]
    assert hooked["progress"]["exit_code"] == 1 and hooked["progress"]["tests_failed"] == 3


def test_the_same_output_at_another_wall_time_hashes_the_same() -> None:
    a, _, code_a = result_payload(exec_out(0, "ok\n", 0.12))
    b, _, code_b = result_payload(exec_out(0, "ok\n", 3.5))
    c, _, _ = result_payload(exec_out(0, "not ok\n", 0.12))
    assert a == b != c and code_a == code_b == 0


def test_the_hook_and_the_rollout_name_a_shell_call_alike() -> None:
    """A PostToolUse hook says ``Bash`` with ``{"command": ...}``; the rollout ``exec_command``."""
    assert tool_call("Bash", {"command": "ls -la"})[:2] == tool_call("exec_command", '{"cmd": "ls -la"}')[:2]
    live = CodexMapper()
    live.tool_event("c9", "Bash", {"command": "ls -la"}, exec_out(0, "a\n", 0.1), 1.0e9, error=False)
    sent = live.drain()
    replay = live.feed(call(1, "c9", "exec_command", {"cmd": "ls -la"})) + live.feed(
        output(2, "c9", exec_out(0, "a\n", 9.9))
    )
    assert [e["id"] for e in sent] == ["c9", "c9.out"] and replay == []


def test_a_subagent_thread_is_merged_without_its_copy_of_the_parent(tmp_path: Path) -> None:
    write(
        tmp_path / "rollout-parent.jsonl",
        [
            meta("p-1"),
            rec(1, "event_msg", {"type": "user_message", "message": "research"}),
            call(2, "sp1", "spawn_agent", {"task_name": "scout", "message": "look around"}),
            output(9, "sp1", json.dumps({"task_name": "scout"})),
        ],
    )
    write(
        tmp_path / "rollout-child.jsonl",
        [
            meta("c-1", parent_thread_id="p-1", spawn_call_id="sp1"),
            rec(1, "event_msg", {"type": "user_message", "message": "research"}),  # the parent's history
            call(2, "sp1", "spawn_agent", {"task_name": "scout", "message": "look around"}),
            call(3, "k1", "exec_command", {"cmd": "ls"}),
            output(4, "k1", exec_out(0, "x", 0.1)),
        ],
    )
    (trace,) = list(read(tmp_path))
    assert trace.trace_id == "p-1" and trace.topology == "hierarchical"
    rows = [(e.type, e.agent) for e in trace.events]
    assert ("spawn", "scout") in rows and ("delegate", "main") in rows
    assert ("tool_use", "c-1") in rows and ("return", "Bash") in rows  # its call, its tool's result
    assert sum(1 for e in trace.events if e.type == "communicate") == 1  # the copied prompt is skipped


def test_bad_records_are_counted_not_fatal(tmp_path: Path) -> None:
    path = write(
        tmp_path / "rollout-x.jsonl",
        [
            meta("x-1"),
            "garbage",
            {"timestamp": ts(1), "type": "response_item", "payload": "nope"},
            rec(1, "a_record_from_the_future", {"x": 1}),
            rec(2, "event_msg", {"type": "user_message", "message": "hi"}),
        ],
    )
    (trace,) = list(read(path))
    assert trace.metrics["lines_malformed"] == 2 and trace.metrics["lines_unknown"] == 1
