"""claude-code importer: a real Claude Code 2.1.14 session (data/claude-code, MIT, see
data/README.md), and sessions written here in the documented transcript format: sub-agents
in ``<session>/subagents/``, repeated usage, malformed and unknown lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stopserve.cli import main
from stopserve.errors import ImporterError
from stopserve.ids import content_ref
from stopserve.importers import IMPORTERS
from stopserve.importers.claude_code import ClaudeCodeMapper, read, tool_payload
from stopserve.trace import is_decision_point, read_traces

DATA = Path(__file__).parent / "data" / "claude-code"
REAL = DATA / "c64cc478-3430-40fe-8e9c-4ee9986e9754.jsonl"
#: real tool output (pytest 9.0.3 and others, tests/signals/data/README.md)
TOOLS = Path(__file__).parents[1] / "signals" / "data" / "tools"


def ts(second: float) -> str:
    whole = int(second)
    return f"2026-03-01T10:{whole // 60:02d}:{whole % 60:02d}.{round((second - whole) * 1000):03d}Z"


def user(uuid: str, t: float, text: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "user",
        "uuid": uuid,
        "timestamp": ts(t),
        "message": {"role": "user", "content": text},
        **extra,
    }


def assistant(
    uuid: str, t: float, blocks: list[dict[str, Any]], msg: str, usage: dict[str, int] | None = None
) -> dict[str, Any]:
    message: dict[str, Any] = {"id": msg, "role": "assistant", "content": blocks}
    message["usage"] = usage or {"input_tokens": 10, "output_tokens": 5}
    return {"type": "assistant", "uuid": uuid, "timestamp": ts(t), "message": message}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(call_id: str, name: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": tool_input}


def tool_result(
    uuid: str, t: float, call_id: str, output: str, *, error: bool = False, structured: Any = None
) -> dict[str, Any]:
    line: dict[str, Any] = {
        "type": "user",
        "uuid": uuid,
        "timestamp": ts(t),
        "message": {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call_id, "content": output, "is_error": error}
            ],
        },
    }
    if structured is not None:
        line["toolUseResult"] = structured
    return line


def write(path: Path, lines: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


def test_the_real_session_maps_turn_by_turn() -> None:
    (trace,) = list(read(REAL))
    assert trace.trace_id == trace.task_id == "c64cc478-3430-40fe-8e9c-4ee9986e9754"
    assert trace.system == "claude-code" and trace.topology == "harness"
    kinds = [(e.type, e.agent, e.tool) for e in trace.events]
    assert kinds[0] == ("communicate", "user", None)  # the prompt
    assert ("tool_use", "main", "Glob") in kinds and ("return", "Glob", "Glob") in kinds
    # the agent said "Done" and the Stop hook fired: a proposed stop, then the hook's feedback
    stops = [e for e in trace.events if e.type == "stop" and e.proposed]
    assert [s.id for s in stops] == [
        "b77721fb-f730-4b69-a948-4fabb217ba33.stop",
        "c80c766f-899e-4d34-82c0-d57c77d8ca75.stop",
    ]
    after_first = trace.events[trace.events.index(stops[0]) + 1]
    assert (after_first.agent, after_first.role) == ("harness", "hook")
    # the failing `git commit` (is_error, toolUseResult a string) is an error
    commit = next(e for e in trace.events if e.id == "toolu_01LZHfE3DNUh3HBws9z8uhN2.out")
    assert commit.error is True
    tests = next(e for e in trace.events if e.id == "toolu_012b68ubGTb54EL4FP3YDLUC.out")
    assert tests.error is False
    # one API message split over two lines (a text, then the Glob call) repeats its usage: counted once
    first = next(e for e in trace.events if e.id == "244eec3a-8c69-4ba4-8cf3-8eca2737a928.0")
    assert first.tokens == 3 + 3
    glob = next(e for e in trace.events if e.id == "toolu_0173gGuN8G4FkjzEPrXPe2ea")
    assert glob.tokens is None
    assert first.model_extra == {"cache_read_tokens": 15289, "cache_write_tokens": 3257}
    assert trace.costs["cache_read_tokens"] == sum(
        (e.model_extra or {}).get("cache_read_tokens", 0) for e in trace.events
    )
    assert trace.metrics["lines"] == 14 and trace.metrics["lines_skipped"] == 1  # the queue-operation
    assert trace.stop is not None and trace.stop.reason == "information_complete"
    assert sum(is_decision_point(e) for e in trace.events) == 5  # 3 results + 2 proposed stops


def test_the_real_session_facts() -> None:
    mapper = ClaudeCodeMapper()
    for line in REAL.read_text().splitlines():
        mapper.feed(json.loads(line))
    facts = mapper.facts
    assert (
        facts.last_test == "python -m pytest tests/test_math_utils.py -v" and facts.last_test_passed is True
    )
    assert facts.edits_total == 1 and facts.edited_after_test == []  # the edit came before the passing run
    assert (
        facts.last_call_failed is True and facts.last_error is not None and "Exit code 1" in facts.last_error
    )


def test_the_real_session_results_carry_progress() -> None:
    (trace,) = list(read(REAL))
    progress = {e.id: e.progress for e in trace.events if e.type == "return"}
    tests = progress["toolu_012b68ubGTb54EL4FP3YDLUC.out"]  # pytest -v: "2 passed in 0.01s"
    assert tests is not None and (tests.tests_passed, tests.tests_failed, tests.source) == (2, 0, "pytest")
    assert tests.exit_code is None and tests.error is None  # no exit code printed; nothing failed
    commit = progress[
        "toolu_01LZHfE3DNUh3HBws9z8uhN2.out"
    ]  # "Exit code 1\nOn branch master\nnothing to commit"
    assert commit is not None and commit.exit_code == 1 and commit.files_changed == 0
    assert commit.error is not None and commit.error.startswith("error:")
    assert progress["toolu_0173gGuN8G4FkjzEPrXPe2ea.out"] is None  # a Glob's file list shows no signal


def test_edits_count_files_and_a_failing_test_run_its_tests() -> None:
    failing = "Exit code 1\n" + (TOOLS / "pytest-q-fail.txt").read_text()  # as Claude Code reports it
    mapper = ClaudeCodeMapper()
    lines = [
        assistant("a1", 0, [tool_use("t1", "Edit", {"file_path": "/w/calc.py", "old_string": "a"})], "m1"),
        tool_result("r1", 1, "t1", "The file /w/calc.py has been updated."),
        assistant("a2", 2, [tool_use("t2", "Write", {"file_path": "/w/new.py", "content": "x"})], "m2"),
        tool_result(
            "r2", 3, "t2", "<tool_use_error>File has not been read yet.</tool_use_error>", error=True
        ),
        assistant("a3", 4, [tool_use("t3", "Bash", {"command": "python -m pytest -q"})], "m3"),
        tool_result("r3", 5, "t3", failing, error=True),
        assistant("a4", 6, [tool_use("t4", "Bash", {"command": "git log -1 --format=%s"})], "m4"),
        tool_result("r4", 7, "t4", "TypeError: raised for a non-string name"),
    ]
    events = [e for line in lines for e in mapper.feed(line)]
    progress = {e["id"]: e.get("progress") for e in events if e["type"] == "return"}
    assert progress["t1.out"] == {"files_changed": 1, "source": "edit_tool"}
    assert "files_changed" not in progress["t2.out"]  # a refused write changed nothing
    run = progress["t3.out"]
    assert (run["tests_passed"], run["tests_failed"], run["exit_code"]) == (1, 3, 1)
    assert run["source"] == "pytest" and run["error"].startswith("tests:")
    assert mapper.facts.last_test_passed is False
    # a command not flagged failed succeeded: an exception's name in what it printed is no error
    assert progress["t4.out"] is None


def test_a_hook_result_and_its_transcript_line_carry_the_same_progress() -> None:
    output = (TOOLS / "pytest-q-pass.txt").read_text()
    response = {"stdout": output, "stderr": "", "interrupted": False, "isImage": False}
    live = ClaudeCodeMapper()
    live.tool_event("toolu_2", "Bash", {"command": "pytest -q"}, response, 1.0e9, error=False)
    offline = ClaudeCodeMapper()
    offline.feed(assistant("a1", 0, [tool_use("toolu_2", "Bash", {"command": "pytest -q"})], "m1"))
    (ret,) = offline.feed(tool_result("r1", 1, "toolu_2", output, structured=response))
    assert (
        live.drain()[1]["progress"]
        == ret["progress"]
        == {
            "tests_passed": 1,
            "tests_failed": 0,
            "source": "pytest",
        }
    )


def test_what_a_write_or_a_read_shows_is_content_not_an_outcome() -> None:
    """A ``PostToolUse`` hook's ``tool_response`` of a ``Write`` holds the file written: a test
    module expecting a traceback is no error, nor its test counts a test run."""
    written = (TOOLS / "pytest-q-fail.txt").read_text()
    response = {"type": "create", "filePath": "/w/expected.txt", "content": written, "structuredPatch": []}
    live = ClaudeCodeMapper()
    live.tool_event(
        "toolu_w", "Write", {"file_path": "/w/expected.txt", "content": written}, response, 1.0e9, error=False
    )
    assert live.drain()[1]["progress"] == {"files_changed": 1, "source": "edit_tool"}
    # nor is a file read or a page fetched a failure for the traceback it shows; a failed read is
    read = "     1\tTraceback (most recent call last):\n     2\t  File \"app.py\"\n     3\tKeyError: 'x'\n"
    page = "Traceback (most recent call last):\n  File \"app.py\", line 3\nKeyError: 'x'\nHow do I fix it?"
    live.tool_event("toolu_r", "Read", {"file_path": "/w/log.txt"}, read, 1.0e9, error=False)
    live.tool_event("toolu_f", "WebFetch", {"url": "https://example.org/q"}, page, 1.0e9, error=False)
    live.tool_event(
        "toolu_x", "Read", {"file_path": "/w/gone.txt"}, "File does not exist.", 1.0e9, error=True
    )
    returns = [e for e in live.drain() if e["type"] == "return"]
    assert [e.get("progress") for e in returns[:2]] == [None, None]
    assert returns[2]["progress"]["error"].startswith("error:")


def test_subagents_are_spawned_delegated_and_merged_in_time_order(tmp_path: Path) -> None:
    session = tmp_path / "proj" / "sess-1.jsonl"
    write(
        session,
        [
            user("u1", 0, "survey the repo with a helper"),
            assistant(
                "a1",
                1,
                [
                    tool_use(
                        "toolu_task",
                        "Task",
                        {"description": "survey", "subagent_type": "Explore", "prompt": "look"},
                    )
                ],
                "m1",
            ),
            tool_result(
                "r1", 9, "toolu_task", "three modules", structured={"agentId": "ab12", "status": "completed"}
            ),
            assistant("a2", 10, [text("There are three modules.")], "m2"),
        ],
    )
    write(
        session.with_suffix("") / "subagents" / "agent-ab12.jsonl",
        [
            user("s1", 2, "look", isSidechain=True, agentId="ab12"),
            assistant(
                "s2", 3, [tool_use("toolu_ls", "Bash", {"command": "ls", "description": "list"})], "m9"
            ),
            tool_result("s3", 4, "toolu_ls", "a b c"),
            assistant("s4", 5, [text("three modules")], "m10"),
        ],
    )
    (trace,) = list(read(tmp_path / "proj"))
    assert trace.topology == "hierarchical" and trace.metrics["subagents"] == 1
    rows = [(e.type, e.agent, e.to) for e in trace.events]
    assert rows[1:3] == [("spawn", "ab12", None), ("delegate", "main", "ab12")]
    assert ("tool_use", "ab12", None) in rows  # the sub-agent's own events, under its id
    assert rows.index(("tool_use", "ab12", None)) < rows.index(("return", "ab12", None))  # before its result
    ret = next(e for e in trace.events if e.id == "toolu_task.out")
    assert ret.agent == "ab12" and ret.tool == "Task"
    assert [e.t for e in trace.events] == sorted(e.t for e in trace.events)
    # the sub-agent ended in text: its own proposed stop, under its id
    assert any(e.type == "stop" and e.proposed and e.agent == "ab12" for e in trace.events)


def test_malformed_and_unknown_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    path = write(
        tmp_path / "s.jsonl",
        [
            user("u1", 0, "hi"),
            "{not json",
            "[1, 2]",
            {"type": "a-type-from-the-future", "uuid": "x"},
            {"type": "summary", "summary": "s", "leafUuid": "u1"},
            {"type": "assistant", "uuid": "bad", "timestamp": ts(1), "message": "not an object"},
            assistant("a1", 2, [text("hello")], "m1"),
        ],
    )
    with path.open("a") as fh:
        fh.write('{"type": "user", "trunc')  # a last line cut off mid-write
    (trace,) = list(read(path))
    assert trace.metrics["lines_malformed"] == 4  # not JSON, an array, a bad message, the cut line
    assert trace.metrics["lines_unknown"] == 1 and trace.metrics["lines_skipped"] == 1
    assert [e.type for e in trace.events] == ["communicate", "communicate", "stop", "stop"]


def test_a_later_larger_usage_of_the_same_message_adds_only_the_difference() -> None:
    mapper = ClaudeCodeMapper()
    first = mapper.feed(assistant("a1", 0, [text("a")], "m1", {"input_tokens": 100, "output_tokens": 3}))
    again = mapper.feed(assistant("a2", 1, [text("b")], "m1", {"input_tokens": 100, "output_tokens": 40}))
    same = mapper.feed(assistant("a3", 2, [text("c")], "m1", {"input_tokens": 100, "output_tokens": 40}))
    assert first[0]["tokens"] == 103 and again[0]["tokens"] == 37 and "tokens" not in same[0]


def test_a_hook_tool_call_and_its_transcript_lines_count_once() -> None:
    """What a PostToolUse hook reports and what the transcript later shows share ids and hashes."""
    response = {"stdout": "ok", "stderr": "", "interrupted": False, "isImage": False}
    live = ClaudeCodeMapper()
    live.tool_event(
        "toolu_1", "Bash", {"command": "make", "description": "build"}, response, 1.0e9, error=False
    )
    from_hook = live.drain()
    later = live.feed(
        assistant("a1", 0, [tool_use("toolu_1", "Bash", {"command": "make", "description": "again"})], "m1")
    )
    later += live.feed(tool_result("r1", 1, "toolu_1", "ok", structured=response))
    assert [e["id"] for e in from_hook] == ["toolu_1", "toolu_1.out"]
    assert [e["type"] for e in later] == []  # both already sent
    offline = ClaudeCodeMapper()
    events = offline.feed(assistant("a1", 0, [tool_use("toolu_1", "Bash", {"command": "make"})], "m1"))
    events += offline.feed(tool_result("r1", 1, "toolu_1", "ok", structured=response))
    assert [e["content_ref"] for e in events] == [e["content_ref"] for e in from_hook]
    assert from_hook[0]["content_ref"] == content_ref(tool_payload("Bash", {"command": "make"}))


def test_mapper_state_round_trips_mid_session() -> None:
    lines = [json.loads(x) for x in REAL.read_text().splitlines()]
    whole = ClaudeCodeMapper()
    expected = [e for line in lines for e in whole.feed(line)]
    got: list[dict[str, Any]] = []
    mapper = ClaudeCodeMapper()
    for line in lines:  # a fresh process per line, as the hook runs
        mapper = ClaudeCodeMapper.load(json.loads(json.dumps(mapper.dump())))
        got += mapper.feed(line)
    assert got == expected


def test_labels_become_rewards_and_the_cli_imports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    labels = write(tmp_path / "labels.jsonl", [{"session_id": REAL.stem, "reward": 1.0}])
    out = tmp_path / "cc.jsonl"
    assert main(["import", "claude-code", str(DATA), "-o", str(out), "--labels", str(labels)]) == 0
    (trace,) = list(read_traces(out))
    assert trace.rewards == {"team": 1.0}
    assert "imported 1 traces" in capsys.readouterr().out
    assert "claude-code" in IMPORTERS


def test_bad_labels_and_missing_sources_are_located(tmp_path: Path) -> None:
    labels = write(tmp_path / "labels.jsonl", [{"session_id": "s"}, "x"])
    with pytest.raises(ImporterError, match=r"labels\.jsonl:1"):
        list(read(REAL, labels=labels))
    with pytest.raises(ImporterError, match="no such file"):
        list(read(tmp_path / "nope"))
    empty = write(tmp_path / "e" / "empty.jsonl", [{"type": "summary", "summary": "s"}])
    skipped: list[ImporterError] = []
    assert list(read(empty, on_error=skipped.append)) == []
    assert "no events" in str(skipped[0])
