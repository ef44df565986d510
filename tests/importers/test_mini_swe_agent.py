"""mini-swe-agent and SWE-agent importer, on the 306 real shared runs and a SWE-agent fixture.

``data/django__django-10097.traj`` is hand-written after SWE-agent's documented ``.traj``
layout (SWE-agent docs, "trajectories"; ``sweagent/agent/agents.py``): ``trajectory`` items
with action / observation / response / thought / execution_time / state, ``info`` with
exit_status, submission and model_stats.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from stopserve.cli import main
from stopserve.errors import ImporterError
from stopserve.importers import IMPORTERS
from stopserve.importers.mini_swe_agent import read, repo_of
from stopserve.trace import is_decision_point, read_traces

DATA = Path(__file__).parent / "data"


def test_cli_imports_all_306_runs_234_resolved(swe_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "swe.jsonl"
    rc = main(["import", "mini-swe-agent", str(swe_dir), "-o", str(out), "--no-progress"])
    assert rc == 0
    assert "imported 306 traces" in capsys.readouterr().out
    traces = list(read_traces(out, strict=True))
    assert len(traces) == 306
    assert sum(t.rewards.get("team") == 1.0 for t in traces) == 234
    assert sum(t.rewards.get("team") == 0.0 for t in traces) == 72
    for t in traces:
        assert t.system == "mini-swe-agent" and t.topology == "harness"
        assert t.task_id == t.trace_id and "__" in t.task_id
        assert t.events[-1].type == "stop" and t.events[-1].proposed is False
        assert t.stop is not None and t.stop.reason == "information_complete"
        assert all(e.usd is not None for e in t.events if e.type == "tool_use")


def test_steps_map_to_tool_use_and_return(swe_dir: Path) -> None:
    path = swe_dir / "trajs" / "django__django-10097.traj.json"
    raw = json.loads(path.read_text())
    (trace,) = read([path])
    calls = [m for m in raw["messages"] if m["role"] == "assistant"]
    uses = [e for e in trace.events if e.type == "tool_use"]
    assert len(uses) == len(calls) == raw["info"]["model_stats"]["api_calls"]
    first = calls[0]["extra"]["response"]
    assert uses[0].t == 0.0
    assert uses[0].tokens == first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
    assert uses[0].usd == pytest.approx(first["usage"]["cost"])
    assert uses[3].t == calls[3]["extra"]["response"]["created"] - first["created"]
    assert trace.costs["usd"] == pytest.approx(raw["info"]["model_stats"]["instance_cost"])
    # every step hands control back, except the submitting one that ends the run
    assert sum(is_decision_point(e) for e in trace.events) == len(calls) - 1
    returns = [e for e in trace.events if e.type == "return"]
    observed = raw["messages"][3]["content"]
    assert observed.startswith("<returncode>0</returncode>")
    assert returns[0].error is False
    # the 4 format errors of this run ("Please always provide EXACTLY ONE action")
    n_format = sum(m["content"].startswith("Please always provide") for m in raw["messages"])
    assert n_format == 4
    assert sum(bool(getattr(e, "format_error", False)) for e in returns) == n_format
    assert trace.metrics["format_errors"] == n_format
    assert trace.budget is not None and trace.budget.max_turns == 250 and trace.budget.max_usd == 3.0
    assert repo_of(trace.task_id) == "django"


def test_nonzero_returncode_is_an_error(swe_dir: Path) -> None:
    n_err = n_nonzero = 0
    for trace in read([swe_dir / "trajs"], results=swe_dir / "results_summary.json"):
        for e in trace.events:
            code = getattr(e, "returncode", None)
            if code is not None:
                n_nonzero += code != 0
                n_err += bool(e.error)
    assert n_nonzero > 500  # the runs hold 630+ non-zero exits
    assert n_err == n_nonzero


def test_single_file_finds_outcome_in_run_folder(swe_dir: Path) -> None:
    summary = json.loads((swe_dir / "results_summary.json").read_text())
    unresolved = next(i["instance_id"] for i in summary["instances"] if not i["resolved"])
    (trace,) = read(swe_dir / "trajs" / f"{unresolved}.traj.json")
    assert trace.rewards == {"team": 0.0}


def test_reports_folder_and_nested_layout(swe_dir: Path, tmp_path: Path) -> None:
    # mini-swe-agent's own batch layout: <id>/<id>.traj.json, outcome from <id>.report.json
    iid = "django__django-10097"
    (tmp_path / "run" / iid).mkdir(parents=True)
    shutil.copy(swe_dir / "trajs" / f"{iid}.traj.json", tmp_path / "run" / iid)
    (trace,) = read([tmp_path / "run"], reports=swe_dir / "reports")
    report = json.loads((swe_dir / "reports" / f"{iid}.report.json").read_text())
    assert trace.rewards["team"] == (1.0 if report["resolved"] else 0.0)
    (no_outcome,) = read([tmp_path / "run"])
    assert no_outcome.rewards == {}


def test_swe_bench_resolved_ids_results(swe_dir: Path, tmp_path: Path) -> None:
    results = tmp_path / "report.json"
    results.write_text(json.dumps({"resolved_ids": [], "completed_ids": ["django__django-10097"]}))
    traces = read([swe_dir / "trajs" / "django__django-10097.traj.json"], results=results)
    assert next(iter(traces)).rewards == {"team": 0.0}


def test_swe_agent_traj_fixture() -> None:
    (trace,) = IMPORTERS["mini-swe-agent"]([DATA / "django__django-10097.traj"])
    assert trace.system == "swe-agent" and trace.task_id == "django__django-10097"
    uses = [e for e in trace.events if e.type == "tool_use"]
    assert [e.tool for e in uses] == ["find_file", "open", "python", "edit", "submit"]
    assert sum(e.tokens or 0 for e in uses) == 41210 + 613
    assert trace.events[-1].type == "stop" and trace.events[-1].reason == "information_complete"
    assert trace.events[-1].t == pytest.approx(0.41 + 0.22 + 1.75 + 0.63 + 0.3)
    assert trace.costs["usd"] == pytest.approx(0.0843)


def test_limits_exceeded_is_a_budget_stop(swe_dir: Path, tmp_path: Path) -> None:
    raw = json.loads((swe_dir / "trajs" / "django__django-10097.traj.json").read_text())
    raw["messages"] = raw["messages"][:12]  # cut mid-run
    raw["info"]["exit_status"] = "LimitsExceeded"
    raw["info"]["config"]["agent"]["step_limit"] = 5
    path = tmp_path / "cut.traj.json"
    path.write_text(json.dumps(raw))
    (trace,) = read([path])
    assert trace.stop is not None
    assert (trace.stop.reason, trace.stop.limit, trace.stop.by) == ("budget_exhausted", "turns", "safety_net")


def test_bad_files_are_skipped_with_reason(swe_dir: Path, tmp_path: Path, capsys) -> None:
    shutil.copy(swe_dir / "trajs" / "django__django-10097.traj.json", tmp_path)
    (tmp_path / "broken.traj.json").write_text('{"messages": [')
    (tmp_path / "wrong.traj.json").write_text('{"messages": 3}')
    out = tmp_path / "out.jsonl"
    rc = main(["import", "mini-swe-agent", str(tmp_path), "-o", str(out), "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0
    assert "imported 1 traces" in captured.out and "skipped 2" in captured.out
    assert "broken.traj.json:1: not valid JSON" in captured.err
    assert "wrong.traj.json: messages: expected a list of messages" in captured.err
    assert len(list(read_traces(out))) == 1
    with pytest.raises(ImporterError, match="not valid JSON"):
        list(read([tmp_path / "broken.traj.json"]))


def test_missing_source_is_a_clear_error(tmp_path: Path, capsys) -> None:
    rc = main(["import", "mini-swe-agent", str(tmp_path / "nope"), "-o", str(tmp_path / "o.jsonl")])
    assert rc == 2
    assert "nope: no such file or folder" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


def test_v2_tool_call_trajectory(tmp_path: Path) -> None:
    # mini-swe-agent 2.x ("mini-swe-agent-1.1"): native tool calls, role "tool" observations
    # with extra.returncode, and a final role "exit" message (v2 migration guide)
    def call(cid: str, command: str, created: int) -> dict[str, Any]:
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": "bash", "arguments": json.dumps({"command": command})},
                }
            ],
            "extra": {
                "response": {"created": created, "usage": {"prompt_tokens": 50, "completion_tokens": 5}},
                "cost": 0.001,
            },
        }

    traj = {
        "trajectory_format": "mini-swe-agent-1.1",
        "instance_id": "astropy__astropy-12907",
        "info": {
            "exit_status": "Submitted",
            "submission": "diff",
            "model_stats": {"instance_cost": 0.003},
            "config": {"agent": {"step_limit": 0, "cost_limit": 3.0}},
        },
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "task"},
            call("c1", "ls", 100),
            {"role": "tool", "tool_call_id": "c1", "content": "a.py", "extra": {"returncode": 0}},
            call("c2", "python a.py", 103),
            {"role": "tool", "tool_call_id": "c2", "content": "Traceback", "extra": {"returncode": 1}},
            call("c3", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", 107),
            {"role": "exit", "content": "diff", "extra": {"exit_status": "Submitted", "submission": "diff"}},
        ],
    }
    path = tmp_path / "astropy__astropy-12907.traj.json"
    path.write_text(json.dumps(traj))
    (trace,) = read([path])
    assert [(e.type, e.error) for e in trace.events] == [
        ("tool_use", None),
        ("return", False),
        ("tool_use", None),
        ("return", True),
        ("tool_use", None),
        ("stop", None),
    ]
    assert [e.t for e in trace.events if e.type == "tool_use"] == [0.0, 3.0, 7.0]
    assert trace.events[0].tokens == 55 and trace.costs["usd"] == pytest.approx(0.003)
    assert trace.budget is not None and trace.budget.max_turns is None and trace.budget.max_usd == 3.0
    assert trace.events[-1].reason == "information_complete"
