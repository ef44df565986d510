"""Test kit for the hooks: transcripts that grow as a harness writes them, hook inputs as
the harnesses send them, and the hook run as the harness runs it (a subprocess fed JSON
on stdin).

Hook input fields are those the real binaries send (Claude Code 2.1.328, Codex CLI
0.169.0, captured in tests/harness): common ``session_id``, ``transcript_path``, ``cwd``,
``permission_mode``, ``hook_event_name``; Claude Code's ``prompt_id`` (one per prompt),
Codex's ``turn_id`` and ``model``; ``stop_hook_active`` on stops; ``tool_*`` on tool
hooks (Claude Code's ``PostToolUseFailure``: ``error``, no ``tool_response``; Codex's
``tool_response``: the bare output text, its exit code in the rollout's
``item_completed`` ``CommandExecution`` event, written before the hook runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ClaudeSession", "CodexSession", "HookResult", "records", "run_hook"]


@dataclass
class HookResult:
    rc: int
    answer: dict[str, Any] | None
    stderr: str
    seconds: float


def run_hook(
    harness: str, payload: dict[str, Any] | bytes, *, url: str, state: Path, args: tuple[str, ...] = ()
) -> HookResult:
    """Run ``python -m stopserve hook <harness>`` as the harness does: JSON on stdin."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STOPSERVE_")}
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    argv = [
        sys.executable,
        "-m",
        "stopserve",
        "hook",
        harness,
        "--url",
        url,
        "--state-dir",
        str(state),
        *args,
    ]
    start = time.monotonic()
    proc = subprocess.run(argv, input=raw, capture_output=True, env=env, timeout=60, check=False)
    seconds = time.monotonic() - start
    out = proc.stdout.decode().strip()
    return HookResult(proc.returncode, json.loads(out) if out else None, proc.stderr.decode(), seconds)


def records(state: Path) -> list[dict[str, Any]]:
    """The hook's decision records."""
    path = state / "decisions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _now(offset: float = 0.0) -> str:
    t = time.time() + offset
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


class ClaudeSession:
    """A Claude Code session transcript that grows line by line, and its hook inputs."""

    def __init__(self, folder: Path, session_id: str, *, agent_id: str | None = None) -> None:
        self.session_id = session_id
        self.agent_id = agent_id
        self.path = folder / f"{session_id}.jsonl"
        if agent_id:
            self.path = folder / session_id / "subagents" / f"agent-{agent_id}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()
        self.main_path = folder / f"{session_id}.jsonl"
        self._n = 0
        self.prompt = 0
        self.offset = 0.0  # seconds the transcript's clock runs ahead of the wall's

    def later(self, seconds: float) -> None:
        """What follows is written ``seconds`` later (a session resumed the next morning)."""
        self.offset += seconds

    def _uuid(self) -> str:
        self._n += 1
        return f"{self.session_id}-{self.agent_id or 'main'}-{self._n}"

    def line(self, obj: dict[str, Any] | str) -> None:
        with self.path.open("a") as fh:
            fh.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")

    def _base(self, kind: str) -> dict[str, Any]:
        base: dict[str, Any] = {
            "type": kind,
            "uuid": self._uuid(),
            "timestamp": _now(self.offset),
            "sessionId": self.session_id,
        }
        if self.agent_id:
            base.update(isSidechain=True, agentId=self.agent_id)
        return base

    def user(self, text: str) -> None:
        self.prompt += 1
        self.line({**self._base("user"), "message": {"role": "user", "content": text}})

    def say(self, text: str) -> str:
        usage = {"input_tokens": 20, "output_tokens": 10, "cache_read_input_tokens": 500}
        message = {
            "id": f"msg_{self._n}",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "usage": usage,
        }
        self.line({**self._base("assistant"), "message": message})
        return text

    def call(self, call_id: str, name: str, tool_input: dict[str, Any]) -> None:
        block = {"type": "tool_use", "id": call_id, "name": name, "input": tool_input}
        usage = {"input_tokens": 30, "output_tokens": 15}
        message = {"id": f"msg_{self._n}", "role": "assistant", "content": [block], "usage": usage}
        self.line({**self._base("assistant"), "message": message})

    def result(self, call_id: str, response: dict[str, Any] | str, *, error: bool = False) -> None:
        text = (
            response
            if isinstance(response, str)
            else "\n".join(str(v) for v in response.values() if isinstance(v, str) and v)
        )
        block = {"type": "tool_result", "tool_use_id": call_id, "content": text, "is_error": error}
        self.line(
            {**self._base("user"), "message": {"role": "user", "content": [block]}, "toolUseResult": response}
        )

    def bash(self, call_id: str, command: str, stdout: str, *, error: bool = False) -> dict[str, Any]:
        response = {"stdout": stdout, "stderr": "", "interrupted": False, "isImage": False}
        self.call(call_id, "Bash", {"command": command, "description": "run it"})
        self.result(call_id, response, error=error)
        return response

    def edit(self, call_id: str, path: str) -> None:
        self.call(call_id, "Edit", {"file_path": path, "old_string": "a", "new_string": "b"})
        self.result(call_id, {"filePath": path, "oldString": "a", "newString": "b"})

    # -- hook inputs -----------------------------------------------------------------------

    def _common(self, event: str) -> dict[str, Any]:
        data: dict[str, Any] = {
            "session_id": self.session_id,
            "transcript_path": str(self.main_path),
            "cwd": str(self.main_path.parent),
            "permission_mode": "default",
            "hook_event_name": event,
            "prompt_id": f"prompt-{self.prompt}",
        }
        if self.agent_id:
            data.update(agent_id=self.agent_id, agent_type="general-purpose")
        return data

    def stop(self, *, active: bool = False) -> dict[str, Any]:
        if self.agent_id:
            return {
                **self._common("SubagentStop"),
                "stop_hook_active": active,
                "agent_transcript_path": str(self.path),
            }
        return {**self._common("Stop"), "stop_hook_active": active}

    def post_tool(self, call_id: str, name: str, tool_input: dict[str, Any], response: Any) -> dict[str, Any]:
        return {
            **self._common("PostToolUse"),
            "tool_name": name,
            "tool_input": tool_input,
            "tool_response": response,
            "tool_use_id": call_id,
        }

    def pre_tool(self, call_id: str, name: str, tool_input: dict[str, Any]) -> dict[str, Any]:
        return {
            **self._common("PreToolUse"),
            "tool_name": name,
            "tool_input": tool_input,
            "tool_use_id": call_id,
        }

    def post_tool_failure(
        self, call_id: str, name: str, tool_input: dict[str, Any], error: str
    ) -> dict[str, Any]:
        """As Claude Code 2.1 sends a failed call: ``error`` without the transcript's "Error: "."""
        return {
            **self._common("PostToolUseFailure"),
            "tool_name": name,
            "tool_input": tool_input,
            "tool_use_id": call_id,
            "error": error,
            "is_interrupt": False,
            "duration_ms": 12,
        }


class CodexSession:
    """A Codex rollout that grows record by record, and its hook inputs."""

    def __init__(self, folder: Path, thread_id: str) -> None:
        self.thread_id = thread_id
        self.path = folder / f"rollout-2026-05-02T08-00-00-{thread_id}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.turn = 0
        self.record("session_meta", {"id": thread_id, "cwd": str(folder), "cli_version": "0.130.0"})

    def record(self, kind: str, payload: dict[str, Any]) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps({"timestamp": _now(), "type": kind, "payload": payload}) + "\n")

    def user(self, text: str) -> None:
        self.turn += 1
        self.record("event_msg", {"type": "task_started", "turn_id": f"turn-{self.turn}"})
        self.record("event_msg", {"type": "user_message", "message": text})

    def say(self, text: str) -> str:
        self.record(
            "response_item",
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]},
        )
        return text

    def shell_call(self, call_id: str, command: str) -> None:
        args = json.dumps({"cmd": command})
        self.record(
            "response_item",
            {"type": "function_call", "name": "exec_command", "arguments": args, "call_id": call_id},
        )

    def shell_output(self, call_id: str, code: int, body: str) -> str:
        wall = f"Wall time: {time.time() % 1:.4f} seconds"  # differs each time, as in real rollouts
        out = f"Chunk ID: a1b2\n{wall}\nProcess exited with code {code}\nOutput:\n{body}"
        self.record("response_item", {"type": "function_call_output", "call_id": call_id, "output": out})
        return out

    def command_done(self, call_id: str, code: int, body: str) -> str:
        """Codex 0.169's ``item_completed`` event of a command (before its PostToolUse hook);
        the bare output text, as the hook's ``tool_response`` has it."""
        item = {
            "type": "CommandExecution",
            "id": call_id,
            "status": "failed" if code else "completed",
            "aggregated_output": body,
            "exit_code": code,
        }
        self.record("event_msg", {"type": "item_completed", "turn_id": f"turn-{self.turn}", "item": item})
        return body

    def _common(self, event: str) -> dict[str, Any]:
        return {
            "session_id": self.thread_id,
            "turn_id": f"turn-{self.turn}",
            "transcript_path": str(self.path),
            "cwd": str(self.path.parent),
            "hook_event_name": event,
            "model": "gpt-5.3-codex",
            "permission_mode": "default",
        }

    def stop(self, last: str | None, *, active: bool = False) -> dict[str, Any]:
        return {**self._common("Stop"), "stop_hook_active": active, "last_assistant_message": last}

    def pre_tool(self, call_id: str, command: str) -> dict[str, Any]:
        return {
            **self._common("PreToolUse"),
            "tool_name": "Bash",
            "tool_input": {"command": command},
            "tool_use_id": call_id,
        }

    def post_tool(self, call_id: str, command: str, response: Any) -> dict[str, Any]:
        return {
            **self._common("PostToolUse"),
            "tool_name": "Bash",
            "tool_input": {"command": command},
            "tool_response": response,
            "tool_use_id": call_id,
        }
