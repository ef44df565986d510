"""Survey-schema importer: the real example, and every generated trace the real schema accepts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stopserve.cli import main
from stopserve.errors import ImporterError
from stopserve.importers.survey import convert, read
from stopserve.trace import SURVEY_TYPE_MAP, check_trace, read_traces

SURVEY_TYPES = [
    "orchestrator_decision",
    "spawn",
    "despawn",
    "message",
    "tool_call",
    "tool_result",
    "return",
    "aggregate",
    "human_intervention",
    "safety_event",
]
EDGE_TYPES = [
    "temporal",
    "causal",
    "spawn",
    "message",
    "tool_dependency",
    "return",
    "aggregate",
    "safety_flow",
]
# values the survey's free extra fields may hold: v1 reserves some of these names
ODD_VALUES = st.one_of(
    st.text(max_size=5), st.integers(-5, 5), st.floats(-3, 3), st.booleans(), st.none(), st.just({"k": 1})
)
RESERVED = ["tokens", "usd", "error", "value", "reason", "proposed", "grade", "decision", "channel"]


@st.composite
def survey_traces(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 6))
    ids = draw(st.lists(st.sampled_from(["e1", "e2", "e3", "e4", "x"]), min_size=n, max_size=n))
    events = []
    for eid in ids:
        ev: dict[str, Any] = {
            "id": eid,
            "t": draw(st.one_of(st.integers(0, 50), st.floats(0, 50))),
            "type": draw(st.sampled_from(SURVEY_TYPES)),
            "agent": draw(st.sampled_from(["orchestrator", "worker_1", "browser.search"])),
        }
        if ev["type"] == "orchestrator_decision" and draw(st.booleans()):
            ev["decision"] = draw(st.sampled_from(["stop", "continue", "delegate"]))
        for key in draw(st.lists(st.sampled_from(RESERVED), max_size=3, unique=True)):
            ev[key] = draw(ODD_VALUES)
        if draw(st.booleans()):
            ev["trusted"] = draw(st.booleans())
        events.append(ev)
    edges = [
        {"src": draw(st.sampled_from([*ids, "ghost"])), "dst": draw(st.sampled_from(ids)), "type": t}
        for t in draw(st.lists(st.sampled_from(EDGE_TYPES), max_size=3))
    ]
    costs: dict[str, Any] = {"tokens": draw(st.integers(0, 10**6)), "wall_clock_s": draw(st.floats(0, 1e4))}
    if draw(st.booleans()):
        costs["usd"] = draw(st.floats(-1, 1))
    return {
        "trace_id": "t",
        "task_id": "task",
        "events": events,
        "edges": edges,
        "rewards": {"team": draw(st.floats(0, 1))},
        "costs": costs,
    }


@pytest.fixture(scope="module")
def schema(survey_dir: Path) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((survey_dir / "trace_schema.json").read_text()))


def test_example_imports_and_validates(survey_dir: Path, tmp_path: Path, capsys) -> None:
    example = survey_dir / "example_trace.json"
    out = tmp_path / "survey.jsonl"
    assert main(["import", "survey", str(example), "-o", str(out), "--no-progress"]) == 0
    assert "imported 1 traces" in capsys.readouterr().out
    (trace,) = read_traces(out, strict=True)
    raw = json.loads(example.read_text())
    assert [e.id for e in trace.events] == [e["id"] for e in raw["events"]]
    for ev, src in zip(trace.events, raw["events"], strict=True):
        assert ev.type == SURVEY_TYPE_MAP.get(src["type"], src["type"])
    assert trace.events[3].from_ == "planner_1"
    assert getattr(trace.events[3], "trusted", None) is True  # survey extras are kept
    assert len(trace.edges) == len(raw["edges"])
    assert trace.rewards == raw["rewards"]
    # and the raw survey file validates as it is
    assert main(["validate", str(example)]) == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=survey_traces())
def test_every_schema_valid_trace_imports(
    schema: jsonschema.Draft202012Validator, data: dict[str, Any]
) -> None:
    schema.validate(data)  # the generator only makes what the real schema accepts
    trace = convert(data)
    _, issues = check_trace(trace.dump(), strict=True)
    assert issues == []
    assert len(trace.events) == len(data["events"])
    ts = [e.t for e in trace.events]
    assert ts == sorted(ts)
    assert len({e.id for e in trace.events}) == len(trace.events)


def test_repairs_are_recorded() -> None:
    data = {
        "trace_id": "r",
        "task_id": "t",
        "events": [
            {"id": "a", "t": 5, "type": "message", "agent": "x", "tokens": "many"},
            {"id": "a", "t": 1, "type": "tool_call", "agent": "x", "decision": {"k": 1}},
            {
                "id": "b",
                "t": 2,
                "type": "orchestrator_decision",
                "agent": "o",
                "decision": "stop",
                "reason": "done",
            },
        ],
        "edges": [{"src": "a", "dst": "b", "type": "causal"}, {"src": "zz", "dst": "b", "type": "causal"}],
        "rewards": {},
        "costs": {"tokens": 1, "wall_clock_s": 1, "refund": -2},
    }
    trace = convert(data)
    assert [e.id for e in trace.events] == ["a#2", "b", "a"]
    assert [e.type for e in trace.events] == ["tool_use", "stop", "communicate"]
    assert trace.events[1].reason == "unknown" and trace.events[1].survey_reason == "done"
    assert trace.events[2].survey_tokens == "many" and trace.events[2].tokens is None
    assert trace.metrics == {"survey_dropped_edges": 1.0, "survey_cost_refund": -2.0}
    assert "refund" not in trace.costs


def test_unconvertible_trace_names_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    good = {"trace_id": "g", "task_id": "t", "events": [{"id": "e", "t": 0, "type": "spawn", "agent": "a"}]}
    bad = {"trace_id": "b", "task_id": "t", "events": [{"id": "e", "t": 0, "type": "spwan", "agent": "a"}]}
    path.write_text("\n".join(json.dumps(x) for x in (good, bad, good)) + "\n{oops\n")
    skipped: list[ImporterError] = []
    traces = list(read([path], on_error=skipped.append))
    assert len(traces) == 2
    assert "bad.jsonl:2: trace 'b': events[0].type: 'spwan' is not one of" in str(skipped[0].issues[0])
    assert str(skipped[1].issues[0]).startswith(f"{path}:4: not valid JSON")
    with pytest.raises(ImporterError):
        list(read([path]))


def test_a_stop_decision_with_a_null_reason_imports() -> None:
    # the survey schema allows "reason": null on an orchestrator decision (hypothesis found it)
    data = {
        "trace_id": "n",
        "task_id": "t",
        "events": [
            {"id": "a", "t": 0, "type": "tool_call", "agent": "x"},
            {
                "id": "b",
                "t": 1,
                "type": "orchestrator_decision",
                "agent": "o",
                "decision": "stop",
                "reason": None,
            },
        ],
        "edges": [],
        "rewards": {"team": 0.0},
        "costs": {"tokens": 0, "wall_clock_s": 0.0},
    }
    trace = convert(data)
    assert trace.events[1].type == "stop" and trace.events[1].reason == "unknown"
