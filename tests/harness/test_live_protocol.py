"""The hook protocol as the pinned binaries speak it: the fields stopserve reads, per event.

When a harness release changes its protocol, this is the test that fails, and it names
the field. A capture hook (a small script appending its stdin to a file) is installed
on every event stopserve uses; the scripted model makes a failing and a succeeding call
(Claude Code also a sub-agent).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from harnesses import PINNED, installed_version, run_claude, run_codex
from scenarios import FAILING, SUBTASK, SUCCEEDING, _shell
from scripted import Say, Step, Tool, View

CAPTURE = """import json, os, sys
data = json.load(sys.stdin)
tp, cid = data.get("transcript_path"), data.get("tool_use_id")
if data.get("hook_event_name") == "PostToolUse" and tp and cid and os.path.exists(tp):
    # Codex: is the command's exit code in the rollout already, before this hook returns?
    data["_exit_code_line"] = any(cid in l and "CommandExecution" in l for l in open(tp))
with open(os.environ["CAPTURE_FILE"], "a") as fh:
    fh.write(json.dumps(data) + "\\n")
"""

COMMON = {
    "session_id": str,
    "transcript_path": str,
    "cwd": str,
    "hook_event_name": str,
    "permission_mode": str,
}
TOOL = {"tool_name": str, "tool_input": dict, "tool_use_id": str}
CLAUDE: dict[str, dict[str, type]] = {
    "PreToolUse": {**COMMON, **TOOL, "prompt_id": str},
    "PostToolUse": {**COMMON, **TOOL, "prompt_id": str, "tool_response": dict},
    "PostToolUseFailure": {**COMMON, **TOOL, "prompt_id": str, "error": str},
    "Stop": {**COMMON, "prompt_id": str, "stop_hook_active": bool, "last_assistant_message": str},
    "SubagentStop": {
        **COMMON,
        "stop_hook_active": bool,
        "agent_id": str,
        "agent_type": str,
        "agent_transcript_path": str,
    },
}
CODEX: dict[str, dict[str, type]] = {
    "PreToolUse": {**COMMON, **TOOL, "turn_id": str},
    "PostToolUse": {**COMMON, **TOOL, "turn_id": str, "tool_response": str, "_exit_code_line": bool},
    "Stop": {**COMMON, "turn_id": str, "stop_hook_active": bool, "last_assistant_message": str},
}


def _capture_hook(tmp_path: Path) -> str:
    script = tmp_path / "capture.py"
    script.write_text(CAPTURE)
    return f"{sys.executable} {script}"


def _handlers(events: dict[str, dict[str, type]], command: str) -> dict[str, Any]:
    return {e: [{"hooks": [{"type": "command", "command": command, "timeout": 10}]}] for e in events}


def _check(harness: str, expected: dict[str, dict[str, type]], captured: list[dict[str, Any]]) -> None:
    seen = {c["hook_event_name"] for c in captured}
    missing_events = sorted(set(expected) - seen)
    assert not missing_events, f"{harness} {PINNED[harness]}: no {', '.join(missing_events)} call was made"
    problems = []
    for c in captured:
        for name, kind in expected.get(c["hook_event_name"], {}).items():
            if not isinstance(c.get(name), kind):
                got = type(c.get(name)).__name__ if name in c else "missing"
                problems.append(f"{c['hook_event_name']}.{name}: expected {kind.__name__}, got {got}")
    assert not problems, f"{harness} {PINNED[harness]} changed its hook protocol: " + "; ".join(
        sorted(set(problems))
    )


def _two_calls(view: View) -> Step:
    if view.user_texts and SUBTASK in view.user_texts[0]:
        return _shell(view.api, "true") if not view.results else Say("Nothing here.")
    if len(view.results) == 0:
        return _shell(view.api, FAILING)
    if len(view.results) == 1:
        return _shell(view.api, SUCCEEDING)
    if len(view.results) == 2 and view.api == "anthropic":
        return Tool("Agent", {"description": "look", "prompt": SUBTASK, "subagent_type": "general-purpose"})
    return Say("Done.")


def test_the_installed_binaries_are_the_pinned_versions(claude: Path, codex: Path) -> None:
    for name in ("claude", "codex"):
        assert installed_version(name) == PINNED[name], (
            f"{name}: installed {installed_version(name)}, tests/harness/package.json pins {PINNED[name]}"
        )


def test_claude_code_sends_the_fields_stopserve_reads(claude: Path, tmp_path: Path, monkeypatch: Any) -> None:
    out = tmp_path / "captured.jsonl"
    command = f"CAPTURE_FILE={out} {_capture_hook(tmp_path)}"
    run_claude(tmp_path / "home", _two_calls, settings={"hooks": _handlers(CLAUDE, command)})
    captured = [json.loads(line) for line in out.read_text().splitlines()]
    _check("claude", CLAUDE, captured)
    failure = next(c for c in captured if c["hook_event_name"] == "PostToolUseFailure")
    assert "tool_response" not in failure and not failure["error"].startswith("Error: ")
    transcript = Path(failure["transcript_path"]).read_text()
    # stopserve hashes "Error: " + error so that the hook's copy and the transcript's agree (item 8)
    assert json.dumps("Error: " + failure["error"]) in transcript


def test_codex_sends_the_fields_stopserve_reads(codex: Path, tmp_path: Path) -> None:
    out = tmp_path / "captured.jsonl"
    command = f"CAPTURE_FILE={out} {_capture_hook(tmp_path)}"
    hooks = json.dumps({"hooks": _handlers(CODEX, command)})
    run_codex(tmp_path / "home", _two_calls, before=lambda home: (home / "hooks.json").write_text(hooks))
    captured = [json.loads(line) for line in out.read_text().splitlines()]
    _check("codex", CODEX, captured)
    post = [c for c in captured if c["hook_event_name"] == "PostToolUse"]
    assert all(c["_exit_code_line"] for c in post), "Codex no longer writes item_completed before PostToolUse"
    assert not any(c["hook_event_name"] == "PostToolUseFailure" for c in captured)
