"""Format v1: models, validation that reports every problem with its location, streaming I/O."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from stopserve.errors import TraceFormatError, TraceValidationError
from stopserve.trace import (
    Event,
    Progress,
    Trace,
    TraceWriter,
    check_trace,
    is_decision_point,
    parse_trace,
    read_traces,
    scan,
    write_traces,
)


def _trace(trace_id: str = "r1", n: int = 3, **top: Any) -> dict[str, Any]:
    events = [
        {"id": f"e{i}", "t": float(i), "type": "tool_use", "agent": "a", "tokens": 10} for i in range(n)
    ]
    events.append(
        {"id": "end", "t": float(n), "type": "stop", "agent": "a", "reason": "information_complete"}
    )
    return {"trace_id": trace_id, "task_id": "task", "events": events, **top}


def _messages(data: Any, **kw: Any) -> list[str]:
    return [str(i) for i in check_trace(data, **kw)[1]]


def _write_lines(path: Path, items: list[Any]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in items))
    return path


# --------------------------------------------------------------------------- models


def test_survey_types_map_as_the_spec_says() -> None:
    def kind(**ev: Any) -> Event:
        return Event.model_validate({"id": "e", "t": 0, "agent": "a", **ev})

    assert kind(type="orchestrator_decision").type == "delegate"
    stop = kind(type="orchestrator_decision", decision="stop")
    assert (stop.type, stop.reason) == ("stop", "unknown")
    assert kind(type="message").type == "communicate"
    assert kind(type="tool_call").type == "tool_use"
    assert kind(type="tool_result").type == "return"
    assert kind(type="despawn").type == "return"
    human = kind(type="human_intervention")
    assert (human.type, human.role) == ("communicate", "human")
    safety = kind(type="safety_event")
    assert (safety.type, safety.error) == ("communicate", True)
    for same in ("spawn", "return", "aggregate"):
        assert kind(type=same).type == same


def test_decision_points() -> None:
    def ev(**kw: Any) -> Event:
        return Event.model_validate({"id": "e", "t": 0, "agent": "a", **kw})

    assert [is_decision_point(ev(type=k)) for k in ("return", "aggregate", "tool_use", "spawn")] == [
        True,
        True,
        False,
        False,
    ]
    assert is_decision_point(ev(type="reward", value=1.0))
    assert is_decision_point(ev(type="stop", reason="quality_met", proposed=True))
    assert not is_decision_point(ev(type="stop", reason="quality_met", proposed=False))


def test_round_trip_keeps_extra_fields_and_aliases(tmp_path: Path) -> None:
    data = _trace(
        budget={"max_turns": 50, "max_usd": 2.0}, stop={"reason": "budget_exhausted", "limit": "turns"}
    )
    data["events"][0].update({"from": "planner", "trusted": True, "decision": {"action": "continue"}})
    path = tmp_path / "one.json"
    write_traces(path, [parse_trace(data)])
    (back,) = read_traces(path)
    assert back.events[0].from_ == "planner"
    assert back.dump()["events"][0]["trusted"] is True
    assert back.dump()["format"] == "stopserve.trace/1"
    assert back.budget is not None and back.budget.max_turns == 50
    assert back.total_costs()["tokens"] == 30.0 and back.total_costs()["tool_calls"] == 3.0


def test_whole_number_floats_are_integers_but_strings_are_not() -> None:
    data = _trace()
    data["events"][0]["tokens"] = 12000.0
    trace, issues = check_trace(data)
    assert issues == [] and trace is not None and trace.events[0].tokens == 12000
    data["events"][0]["tokens"] = "12000"
    data["events"][1]["t"] = True
    data["events"][2]["error"] = "yes"
    msgs = _messages(data)
    assert any(m.startswith("trace 'r1': events[0].tokens: Input should be a valid integer") for m in msgs)
    assert any(m.startswith("trace 'r1': events[1].t: Input should be a valid number") for m in msgs)
    assert any(m.startswith("trace 'r1': events[2].error: Input should be a valid boolean") for m in msgs)


# --------------------------------------------------------------------------- validation


def test_every_problem_is_reported_with_its_field() -> None:
    data = _trace(n=4)
    data["events"][0]["type"] = "spwan"
    data["events"][1]["id"] = "e0"
    data["events"][2]["t"] = 0.5  # after t=1
    data["events"][3]["usd"] = -0.01
    data["events"].append({"id": "r", "t": 9, "type": "reward", "agent": "v"})
    data["edges"] = [{"src": "e0", "dst": "ghost", "type": "causal"}]
    data["costs"] = {"tokens": -5}
    data["stop"] = {"reason": "bored"}
    msgs = _messages(data, file="runs.jsonl", line=1042)
    expected = [
        "runs.jsonl:1042: trace 'r1': events[0].type: 'spwan' is not one of spawn, delegate, communicate,",
        "runs.jsonl:1042: trace 'r1': events[1].id: duplicate event id 'e0' (first at events[0])",
        "runs.jsonl:1042: trace 'r1': events[2].t: time goes backwards: 0.5 after 1.0",
        "runs.jsonl:1042: trace 'r1': events[3].usd: Input should be greater than or equal to 0",
        "runs.jsonl:1042: trace 'r1': events[5].value: a reward event must carry 'value'",
        "runs.jsonl:1042: trace 'r1': edges[0].dst: names no event: 'ghost'",
        "runs.jsonl:1042: trace 'r1': costs: cost 'tokens' must be >= 0, got -5",
        "runs.jsonl:1042: trace 'r1': stop.reason: 'bored' is not one of information_complete,",
    ]
    for prefix in expected:
        assert any(m.startswith(prefix) for m in msgs), (prefix, msgs)
    assert len(msgs) == len(expected)


def test_a_sketch_is_checked_like_every_field(tmp_path: Path) -> None:
    from stopserve.signals.sketch import sketch

    data = _trace(n=3)
    data["events"][0]["sketch"] = sketch("pytest -x tests/")
    data["events"][1]["sketch"] = "mh1:" + "0" * 12
    data["events"][2]["sketch"] = "sha256:0123456789abcdef"
    msgs = _messages(data, file="runs.jsonl", line=7)
    where = "runs.jsonl:7: trace 'r1': events"
    assert msgs == [
        f"{where}[1].sketch: a 'mh1:' sketch has 128 hex digits after its prefix, got 12",
        f"{where}[2].sketch: unknown sketch version 'sha256:' (this reader knows 'mh1:'): "
        "'sha256:0123456789abcdef'",
    ]
    del data["events"][1]["sketch"], data["events"][2]["sketch"]
    path = write_traces(tmp_path / "t.jsonl", [data]) and tmp_path / "t.jsonl"
    (back,) = read_traces(path)
    assert back.events[0].sketch == data["events"][0]["sketch"] and back.events[1].sketch is None
    # a reader that does not know the field keeps it as an extra (format v1 allows extra fields)
    assert json.loads(path.read_text())["events"][0]["sketch"] == data["events"][0]["sketch"]


def test_progress_is_optional_closed_and_checked_field_by_field() -> None:
    data = _trace()
    assert check_trace(data)[0].events[0].progress is None  # type: ignore[union-attr]
    data["events"][0]["progress"] = {
        "tests_passed": 5,
        "tests_failed": 2.0,
        "exit_code": -1,
        "source": "pytest",
    }
    data["events"][1]["progress"] = {"made_progress": False, "in_loop": True, "source": "magentic_one"}
    trace, issues = check_trace(data)
    assert issues == [] and trace is not None
    assert trace.events[0].dump()["progress"] == {
        "tests_passed": 5,
        "tests_failed": 2,
        "exit_code": -1,
        "source": "pytest",
    }
    assert trace.events[1].progress is not None and trace.events[1].progress.in_loop is True
    data["events"][0]["progress"] = {
        "tests_pased": 3,
        "tests_failed": -1,
        "exit_code": True,
        "error": "",
        "files_changed": "2",
        "in_loop": "yes",
        "ledger": 1,
    }
    data["events"][1]["progress"] = "5 passed"
    msgs = _messages(data, file="runs.jsonl", line=7)
    where = "runs.jsonl:7: trace 'r1': events[0].progress"
    expected = [
        f"{where}.tests_pased: unknown field (did you mean 'tests_passed'?)",
        f"{where}.tests_failed: Input should be greater than or equal to 0",
        f"{where}.exit_code: Input should be a valid integer",
        f"{where}.error: String should have at least 1 character",
        f"{where}.files_changed: Input should be a valid integer",
        f"{where}.in_loop: Input should be a valid boolean",
        f"{where}.ledger: unknown field (progress holds only error, exit_code, files_changed, in_loop,",
        "runs.jsonl:7: trace 'r1': events[1].progress: Input should be a valid dictionary",
    ]
    for prefix in expected:
        assert any(m.startswith(prefix) for m in msgs), (prefix, msgs)
    assert len(msgs) == len(expected)


def test_progress_fields_are_the_extractors_fields() -> None:
    from stopserve.signals import progress as signals

    assert tuple(Progress.model_fields) == signals.FIELDS


def test_required_fields_and_stop_reason() -> None:
    msgs = _messages({"trace_id": "x", "events": [{"id": "e", "t": 0, "type": "stop", "agent": "a"}]})
    assert "trace 'x': task_id: required field is missing" in msgs
    assert "trace 'x': events[0].reason: a stop event must carry 'reason'" in msgs
    assert _messages({"trace_id": "x", "task_id": "t", "events": []}) == [
        "trace 'x': events: List should have at least 1 item after validation, not 0"
    ]
    assert _messages([1, 2]) == ["a trace must be a JSON object, got list"]


def test_strict_rejects_unknown_top_level_fields_only() -> None:
    data = _trace(notes="free text")
    data["events"][0]["my_extra"] = 1
    assert _messages(data) == []
    assert _messages(data, strict=True) == ["trace 'r1': notes: unknown top-level field (--strict)"]


def test_parse_trace_raises_with_all_issues() -> None:
    data = _trace()
    data["events"][0]["type"] = "nope"
    data["events"][1]["tokens"] = -1
    with pytest.raises(TraceValidationError) as info:
        parse_trace(data, file="f.jsonl", line=3)
    assert str(info.value).startswith("f.jsonl:3: trace 'r1': invalid trace (2 problems)")
    assert len(info.value.issues) == 2


# --------------------------------------------------------------------------- reading bad files


def test_truncated_json_line_names_the_line(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "runs.jsonl", [_trace("a"), json.dumps(_trace("b"))[:40], _trace("c")])
    records = list(scan(path))
    assert [r.trace is not None for r in records] == [True, False, True]
    assert str(records[1].issues[0]).startswith(f"{path}:2: not valid JSON")
    assert not records[1].readable
    with pytest.raises(TraceFormatError, match=":2: not valid JSON"):
        list(read_traces(path))


def test_truncated_json_file(tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    path.write_text(json.dumps(_trace(), indent=1)[:-30])
    (record,) = scan(path)
    assert str(record.issues[0]).startswith(f"{path}: not valid JSON")
    assert "line" in record.issues[0].message  # orjson says where


def test_binary_file_gives_one_error(tmp_path: Path) -> None:
    path = tmp_path / "blob.jsonl"
    path.write_bytes(bytes(range(256)) * 400 + b"\n" * 50)
    records = list(scan(path))
    assert len(records) == 1
    assert str(records[0].issues[0]) == f"{path}: binary content (NUL byte): not a JSON trace file"


def test_empty_files(tmp_path: Path) -> None:
    for name, content in (("e.jsonl", b""), ("w.jsonl", b"\n  \n"), ("e.json", b""), ("l.json", b"[]")):
        path = tmp_path / name
        path.write_bytes(content)
        (record,) = scan(path)
        assert record.trace is None and not record.readable
        assert str(record.issues[0]).startswith(f"{path}: file ")


def test_missing_file_is_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"nope\.jsonl: cannot open"):
        list(scan(tmp_path / "nope.jsonl"))


def test_gzip_read_write_and_truncated_gzip(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl.gz"
    assert write_traces(path, [parse_trace(_trace(f"r{i}")) for i in range(5)]) == 5
    assert gzip.decompress(path.read_bytes()).count(b"\n") == 5
    assert [t.trace_id for t in read_traces(path)] == [f"r{i}" for i in range(5)]
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(path.read_bytes()[:-20])
    records = list(scan(cut))
    assert records[-1].trace is None and "cannot read" in records[-1].issues[0].message
    # a gzip file without .gz in its name is still recognised
    renamed = tmp_path / "plain.jsonl"
    renamed.write_bytes(path.read_bytes())
    assert len(list(read_traces(renamed))) == 5


def test_json_with_a_list_of_traces(tmp_path: Path) -> None:
    path = tmp_path / "many.json"
    bad = _trace("bad")
    bad["events"][0]["t"] = -1
    path.write_text(json.dumps([_trace("a"), bad, _trace("c")]))
    records = list(scan(path))
    assert [r.trace.trace_id if r.trace else None for r in records] == ["a", None, "c"]
    assert str(records[1].issues[0]).startswith(
        f"{path}[1]: trace 'bad': events[0].t: Input should be greater"
    )


def test_jsonl_content_in_a_json_file(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "lines.json", [_trace("a"), _trace("b")])
    assert [t.trace_id for t in read_traces(path)] == ["a", "b"]


def test_over_long_line_is_refused_without_loading(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "big.jsonl", [_trace("a", notes="x" * 5000), _trace("b")])
    records = list(scan(path, max_trace_bytes=1000))
    assert str(records[0].issues[0]) == f"{path}:1: line longer than 1000 bytes: refused to bound memory"
    assert records[1].trace is not None and records[1].line == 2


def test_writer_refuses_invalid_traces_and_second_json_trace(tmp_path: Path) -> None:
    bad = _trace()
    bad["events"][0]["tokens"] = -3
    with TraceWriter(tmp_path / "w.jsonl") as writer, pytest.raises(TraceValidationError):
        writer.write(bad)
    with TraceWriter(tmp_path / "w.json") as writer:
        writer.write(_trace("a"))
        with pytest.raises(TraceFormatError, match="holds one trace"):
            writer.write(_trace("b"))
    with pytest.raises(TraceFormatError, match="cannot write"):
        TraceWriter(tmp_path / "no" / "such" / "dir.jsonl")


def test_200_mb_file_streams_in_bounded_memory(tmp_path: Path) -> None:
    # 202 lines of ~1 MB each (a big kept extra field), one broken line near the end
    path = tmp_path / "big.jsonl"
    line = (json.dumps(_trace("t", notes="x" * 1_000_000)) + "\n").encode()
    with path.open("wb") as fh:
        for i in range(202):
            fh.write(line if i != 197 else line[: len(line) // 2] + b"\n")
    size = path.stat().st_size
    assert size > 200_000_000
    tracemalloc.start()
    try:
        n_ok = 0
        bad: list[str] = []
        for record in scan(path):
            n_ok += record.trace is not None
            bad += [str(i) for i in record.issues]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n_ok == 201
    assert len(bad) == 1 and bad[0].startswith(f"{path}:198: not valid JSON")
    # memory follows the largest line (JSON parsing peaks near 13x a line), never the file
    assert peak < size / 10, f"peak {peak / 1e6:.1f} MB while streaming a {size / 1e6:.0f} MB file"


def test_trace_model_is_the_public_contract() -> None:
    trace = Trace.model_validate(_trace())
    assert trace.dump()["events"][-1] == {
        "id": "end",
        "t": 3.0,
        "type": "stop",
        "agent": "a",
        "reason": "information_complete",
    }
