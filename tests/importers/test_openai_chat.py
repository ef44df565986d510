"""openai-chat importer: runs logged from the real ``openai`` SDK's response objects."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletion

from stopserve.cli import main
from stopserve.errors import ImporterError
from stopserve.importers.openai_chat import CHARS_PER_TOKEN, convert, read
from stopserve.trace import is_decision_point, read_traces


def _completion(message: dict[str, Any], created: int, prompt: int, completion: int) -> dict[str, Any]:
    """An assistant message as an app logs it: the SDK's message plus the call's usage and time."""
    resp = ChatCompletion.model_validate(
        {
            "id": f"chatcmpl-{created}",
            "object": "chat.completion",
            "created": created,
            "model": "gpt-4o-2024-08-06",
            "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }
    )
    logged = resp.choices[0].message.model_dump(exclude_none=True)
    assert resp.usage is not None
    logged["usage"] = resp.usage.model_dump(exclude_none=True)
    logged["created"] = resp.created
    return logged


def _run(run_id: str, reward: float | None = 1.0) -> dict[str, Any]:
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "web_search", "arguments": '{"q": "tallest"}'},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"x": "3*7"}'},
            },
        ],
    }
    run: dict[str, Any] = {
        "trace_id": run_id,
        "task_id": "tallest-building",
        "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "Which building is tallest?"},
            _completion(call, 1_700_000_000, 120, 30),
            {"role": "tool", "tool_call_id": "call_a", "content": "Burj Khalifa, 828 m"},
            {"role": "tool", "tool_call_id": "call_b", "content": "21"},
            _completion(
                {"role": "assistant", "content": "The Burj Khalifa (828 m)."}, 1_700_000_007, 200, 12
            ),
        ],
    }
    if reward is not None:
        run["reward"] = reward
    return run


def test_sdk_logged_run_maps_message_by_message() -> None:
    trace = convert(_run("r1"))
    kinds = [(e.type, e.agent, e.tool) for e in trace.events]
    assert kinds == [
        ("delegate", "user", None),
        ("tool_use", "assistant", "web_search"),
        ("tool_use", "assistant", "calculator"),
        ("return", "web_search", "web_search"),
        ("return", "calculator", "calculator"),
        ("aggregate", "assistant", None),
        ("stop", "assistant", None),
    ]
    assert trace.events[1].tokens == 150 and trace.events[2].tokens is None
    assert trace.events[5].tokens == 212 and trace.events[5].t == 7.0
    assert trace.events[-1].reason == "information_complete"
    assert trace.rewards == {"team": 1.0}
    assert "tokens_estimated" not in trace.metrics
    assert sum(is_decision_point(e) for e in trace.events) == 3
    # equal tool calls hash equal, different ones differ
    again = convert(_run("r2"))
    assert again.events[1].content_ref == trace.events[1].content_ref != trace.events[2].content_ref


def test_tokens_estimated_from_text_without_usage() -> None:
    text = "x" * 41
    trace = convert({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]})
    assert trace.events[1].tokens == math.ceil(41 / CHARS_PER_TOKEN)
    assert trace.metrics["tokens_estimated"] == 1.0
    assert trace.rewards == {}


def test_jsonl_gz_and_reward_option(tmp_path: Path, capsys) -> None:
    path = tmp_path / "runs.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        for i in range(3):
            fh.write(json.dumps(_run(f"r{i}", reward=None if i else 0.0)) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["import", "openai-chat", str(path), "-o", str(out), "--reward", "0.5", "--no-progress"]) == 0
    assert "imported 3 traces" in capsys.readouterr().out
    assert [t.rewards["team"] for t in read_traces(out)] == [0.0, 0.5, 0.5]


def test_bare_message_list_file_is_one_run(tmp_path: Path) -> None:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(_run("x")["messages"]))
    (trace,) = read([path])
    assert trace.trace_id == "chat" and len(trace.events) == 7


def test_bad_runs_name_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    bad_role = {"messages": [{"role": "robot", "content": "hi"}]}
    bad_reward = {**_run("b"), "reward": "high"}
    path.write_text("\n".join(json.dumps(x) for x in (_run("a"), bad_role, bad_reward)) + "\n")
    skipped: list[ImporterError] = []
    assert [t.trace_id for t in read([path], on_error=skipped.append)] == ["a"]
    assert str(skipped[0].issues[0]).startswith(
        f"{path}:2: trace 'runs:2': messages[0].role: unknown role 'robot'"
    )
    assert str(skipped[1].issues[0]) == f"{path}:3: trace 'b': reward: expected a number"
    assert str(skipped[1]).startswith(f"{path}:3: trace 'b': cannot import\n")
    with pytest.raises(ImporterError, match="unknown role"):
        list(read([path]))
