"""The summary of logs a real server wrote: the numbers a person reads on the page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from _logs import LOOP_REF, RESULT_REF, SNIPPET

from stopserve.report.commands import summarize_dirs
from stopserve.report.summary import BUDGET_NETS, Summarizer, end_kind
from stopserve.safety import BUDGET_NETS as SAFETY_BUDGET_NETS


def test_budget_nets_are_the_safety_modules() -> None:
    assert set(BUDGET_NETS) >= set(SAFETY_BUDGET_NETS)


def test_runs_stops_and_how_each_ended(served: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    log_dir, last = served
    s = summarize_dirs([log_dir])
    assert s.n_problems == 0
    assert s.n_runs == len(last) == 6
    decisions = sum(1 for _ in (log_dir / "decisions.jsonl").open())
    assert s.n_decisions == decisions
    assert last["loop-1"]["reason"] == "loop_detected" and last["budget-1"]["safety_net"] == "max_turns"
    ends = {r.run_id: r.end for r in s.runs}
    assert ends == {
        "loop-1": "rule",
        "budget-1": "budget",
        "ok-0": "agent",
        "ok-1": "agent",
        "ok-2": "agent",
        "open-1": "open",
    }
    assert s.n_stopped == 2
    assert ("loop_detected", "rule", 1) in s.stops_by_reason
    assert ("budget_exhausted", "budget", 1) in s.stops_by_reason
    assert dict(s.stops_by_net) == {"loop_detector": 1, "max_turns": 1}
    assert sum(sum(b.ends.values()) for b in s.bins) == 6


def test_the_loop_shows_the_repeated_action_by_its_hash_and_the_logged_snippet(
    served: tuple[Path, dict[str, dict[str, Any]]],
) -> None:
    s = summarize_dirs([served[0]])
    assert s.n_loops == 1
    loop = s.loops[0]
    assert loop.run_id == "loop-1" and loop.pattern == "repeated_action_error"
    assert loop.action_ref == LOOP_REF and loop.result_ref == RESULT_REF
    assert loop.action == "tool_use bash by coder"
    assert loop.repeats == served[1]["loop-1"]["turn"]  # every step repeated the one failing call
    assert loop.error and loop.snippet == SNIPPET
    assert loop.sketch is None  # no event carried a sketch


def test_cost_spent_is_the_traces_and_saved_comes_from_cost_to_go_or_runs_like_it(
    served: tuple[Path, dict[str, dict[str, Any]]],
) -> None:
    log_dir, last = served
    s = summarize_dirs([log_dir])
    traces = [orjson.loads(line) for line in (log_dir / "traces.jsonl").read_bytes().splitlines()]
    tokens = sum(e.get("tokens", 0) for t in traces for e in t["events"])
    assert s.cost.unit == "ktokens"  # the shipped model's unit
    assert abs(s.cost.spent - tokens / 1000) < 1e-9 and s.cost.runs_costed == 5
    rows = {r.run_id: r for r in s.runs}
    # the loop stop was the model's deciding: its cost_to_go (ktokens) is the estimate
    assert rows["loop-1"].saved_how == "cost_to_go"
    assert rows["loop-1"].saved == last["loop-1"]["cost_to_go"]
    # a budget stop carries no cost_to_go: what the runs that went on past its decision points still spent
    budget = rows["budget-1"]
    assert last["budget-1"]["cost_to_go"] is None
    n = budget.decisions
    rest = []
    for t in traces:
        if t["trace_id"].startswith("ok-"):
            cum, tok = [], 0
            for e in t["events"]:
                tok += e.get("tokens", 0)
                if "decision" in e:
                    cum.append(tok / 1000)
            if len(cum) > n:
                rest.append(cum[-1] - cum[n - 1])
    assert rest and budget.saved_how == f"median of {len(rest)} runs like it"
    assert abs(budget.saved - sorted(rest)[len(rest) // 2]) < 1e-9
    assert s.cost.methods == {"cost_to_go": 1, "median": 1, "none": 0}
    assert abs(s.cost.saved - (rows["loop-1"].saved + budget.saved)) < 1e-9


def test_success_by_how_runs_ended(served: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    s = summarize_dirs([served[0]])
    by = {o.end: (o.runs, o.successes) for o in s.outcomes}
    assert by == {"budget": (1, 1), "rule": (1, 0), "agent": (3, 3)}


def test_timeline_of_a_run_is_every_decision_in_order(served: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    log_dir, _ = served
    s = summarize_dirs([log_dir])
    points = s.timelines["loop-1"]
    logged = [
        orjson.loads(line)
        for line in (log_dir / "decisions.jsonl").read_bytes().splitlines()
        if b'"loop-1"' in line
    ]
    assert [p.seq for p in points] == [r["seq"] for r in logged]
    assert [p.v_stop for p in points] == [r["v_stop"] for r in logged]
    assert points[-1].action == "stop" and points[-1].reason == "loop_detected"


def test_champion_promotions_and_the_learning_curve(served: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    s = summarize_dirs([served[0]])
    m = s.models
    assert m.champion == "cand-2"
    assert [p.kind for p in m.promotions] == ["refusal", "promotion"]
    refusal, promotion = m.promotions
    assert refusal.version == "cand-1" and refusal.runs_judged == 60 and refusal.champion == 0.30
    assert promotion.version == "cand-2" and promotion.candidate == 0.36
    assert promotion.difference is not None and abs(promotion.difference - 0.05) < 1e-9
    assert promotion.candidate_ci == (0.36 - 0.02, 0.36 + 0.02)


def test_challengers_agreement_and_where_they_would_stop() -> None:
    s = Summarizer()
    base = {"kind": "decision", "ts": 1.0, "turn": 1}
    for seq, (ours, theirs) in enumerate([("continue", "continue"), ("continue", "stop"), ("stop", "stop")]):
        shadow = {"c": {"action": theirs}}
        s.add("decision", {**base, "run_id": "r", "seq": seq, "action": ours, "challengers": shadow})
    shadow = {"c": {"action": "continue"}}
    s.add("decision", {**base, "run_id": "q", "seq": 0, "action": "stop", "challengers": shadow})
    (row,) = s.summary().models.challengers
    assert (row.name, row.decisions, row.agreed) == ("c", 4, 2)
    assert (row.earlier, row.same, row.later) == (1, 0, 1)


def test_a_replayed_line_is_counted_once() -> None:
    s = Summarizer()
    rec = {"kind": "decision", "ts": 1.0, "run_id": "r", "seq": 0, "action": "continue", "turn": 1}
    s.add("decision", rec)
    s.add("decision", {**rec, "replayed": True})
    assert s.summary().n_decisions == 1


def test_end_kinds() -> None:
    assert end_kind(None, False) == "open" and end_kind(None, True) == "agent"
    assert end_kind({"safety_net": "max_usd", "reason": "budget_exhausted"}, True) == "budget"
    assert end_kind({"safety_net": "loop_detector&max_turns"}, True) == "budget"
    assert end_kind({"safety_net": "quality_met", "reason": "quality_met"}, True) == "rule"
    assert end_kind({"safety_net": None, "reason": "no_progress"}, False) == "model"
