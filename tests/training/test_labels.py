"""Decision points and labels: q_t, c_t, cost units, outcomes, the features CSV."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from eval_helpers import step_trace

from stopserve.cli import main
from stopserve.errors import TrainingError
from stopserve.features import FEATURE_NAMES, RunState
from stopserve.trace import Trace, is_decision_point, write_traces
from stopserve.training.labels import build_decision_points


def test_outcome_only_labels_are_zero_until_the_last_decision_point() -> None:
    dp = build_decision_points([step_trace("r", "t", 3, team=1.0)])
    assert dp.cost_unit == "usd"
    assert dp.turn.tolist() == [1, 2, 3]
    assert dp.q.tolist() == [0.0, 0.0, 1.0]
    np.testing.assert_allclose(dp.c, [0.01, 0.02, 0.03])
    assert dp.is_last.tolist() == [False, False, True]
    assert dp.q_final.tolist() == [1.0, 1.0, 1.0]
    np.testing.assert_allclose(dp.cost_to_go(), [0.02, 0.01, 0.0], atol=1e-12)
    np.testing.assert_allclose(dp.r_stop(10.0), [-0.1, -0.2, 0.7])
    assert dp.propensity.tolist() == [1.0, 1.0, 1.0]


def test_grades_win_over_the_outcome() -> None:
    dp = build_decision_points([step_trace("r", "t", 3, grades=[0.2, 0.5, 0.4], team=1.0)])
    assert dp.q.tolist() == [0.2, 0.5, 0.4]
    assert dp.trace_q_final.tolist() == [0.4]


def test_labels_from_rewards_read_the_quality_channel() -> None:
    trace = step_trace("r", "t", 3, rewards=[0.3, 0.6, 0.9], team=None)
    dp = build_decision_points([trace], labels_from_rewards=True)
    # a row after each return and after each reward
    assert dp.q.tolist() == [0.0, 0.3, 0.3, 0.6, 0.6, 0.9]
    assert dp.trace_q_final.tolist() == [0.9]
    assert np.isnan(dp.latest_reward[0]) and dp.latest_reward[-1] == 0.9
    with pytest.raises(TrainingError, match="'r' has no outcome"):
        build_decision_points([trace])
    # the spec's order: a reward read as a grade comes before the final outcome
    with_team = step_trace("r", "t", 3, rewards=[0.3, 0.6, 0.9], team=1.0)
    assert build_decision_points([with_team], labels_from_rewards=True).q[-1] == 0.9
    assert build_decision_points([with_team]).q.tolist() == [0.0] * 5 + [1.0]


def test_cost_unit_falls_back_to_ktokens_and_can_be_overridden() -> None:
    traces = [step_trace("a", "t1", 2), step_trace("b", "t2", 2, usd=None, tokens=1500)]
    assert build_decision_points(traces[:1]).cost_unit == "usd"
    with pytest.raises(TrainingError, match="'eur'"):
        build_decision_points(traces, cost_unit="eur")
    dp = build_decision_points(traces)
    assert dp.cost_unit == "ktokens"
    np.testing.assert_allclose(dp.c, [1.0, 2.0, 1.5, 3.0])
    np.testing.assert_allclose(dp.trace_c_final, [2.0, 3.0])
    sec = build_decision_points(traces, cost_unit="seconds")
    np.testing.assert_allclose(sec.c, [1.0, 2.0, 1.0, 2.0])
    # usd forced: the trace without money counts 0, but none at all is refused
    usd = build_decision_points(traces, cost_unit="usd")
    np.testing.assert_allclose(usd.c, [0.01, 0.02, 0.0, 0.0])
    with pytest.raises(TrainingError, match="no event carries 'usd'"):
        build_decision_points(traces[1:], cost_unit="usd")


def test_features_come_from_the_live_featurizer_at_each_decision_point() -> None:
    trace = step_trace("r", "t", 4, rewards=[0.1, 0.2, 0.3, 0.4], loop_from=1)
    dp = build_decision_points([trace])
    state = RunState(topology=trace.topology, budget=trace.budget)
    expected = []
    for ev in trace.events:
        state.fold(ev)
        if is_decision_point(ev):
            expected.append(state.features())
    assert dp.X.shape == (len(expected), len(FEATURE_NAMES))
    np.testing.assert_array_equal(dp.X, np.vstack(expected))


def test_loop_flag_marks_a_stuck_run() -> None:
    # ten steps, a loop from the second: past the threshold and its two nudges
    dp = build_decision_points([step_trace("loop", "t", 10, loop_from=2), step_trace("ok", "u", 10)])
    assert dp.loop[: dp.offsets[1]].any()
    assert not dp.loop[dp.offsets[1] :].any()
    assert not dp.loop[:2].any()


def test_a_trace_without_decision_points_gets_one_at_its_last_event() -> None:
    trace = Trace.model_validate(
        {
            "trace_id": "r",
            "task_id": "t",
            "rewards": {"team": 1.0},
            "events": [
                {"id": "a", "t": 0, "type": "tool_use", "agent": "x", "tokens": 10},
                {"id": "s", "t": 2, "type": "stop", "agent": "x", "reason": "error"},
            ],
        }
    )
    dp = build_decision_points([trace])
    assert dp.n_rows == 1 and dp.is_last.tolist() == [True]
    assert dp.q.tolist() == [1.0]
    assert dp.c.tolist() == [0.01]


def test_groups_by_repository_and_subsets() -> None:
    traces = [
        step_trace("1", "django__django-1", 2),
        step_trace("2", "django__django-2", 3),
        step_trace("3", "sympy__sympy-9", 1, team=0.0),
    ]
    dp = build_decision_points(traces, group_by="repo")
    assert dp.group.tolist() == ["django", "django", "sympy"]
    assert build_decision_points(traces).group.tolist() == [t.task_id for t in traces]
    sub = dp.subset([2, 0])
    assert sub.trace_id.tolist() == ["3", "1"]
    assert sub.offsets.tolist() == [0, 1, 3]
    assert sub.q.tolist() == [0.0, 0.0, 1.0]
    assert sub.trace_idx.tolist() == [0, 1, 1]


def test_no_traces_and_bad_options_are_refused() -> None:
    with pytest.raises(TrainingError, match="no traces"):
        build_decision_points([])
    with pytest.raises(TrainingError, match="cost unit 'eur'"):
        build_decision_points([step_trace("r", "t", 1)], cost_unit="eur")


def test_features_command_writes_one_row_per_decision_point(tmp_path: Path) -> None:
    src = tmp_path / "runs.jsonl"
    write_traces(src, [step_trace("a", "t1", 3, team=1.0), step_trace("b", "t2", 2, team=0.0)])
    out = tmp_path / "f.csv"
    assert main(["features", str(src), "-o", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 5
    features = [f for f in FEATURE_NAMES if f != "turn"]
    assert list(rows[0]) == ["trace_id", "turn", *features, "q_t", "c_t", "q_final", "cost_to_go"]
    assert [r["turn"] for r in rows] == ["1", "2", "3", "1", "2"]
    assert [r["trace_id"] for r in rows] == ["a", "a", "a", "b", "b"]
    assert float(rows[2]["q_t"]) == 1.0 and float(rows[0]["q_final"]) == 1.0
    assert float(rows[0]["cost_to_go"]) == pytest.approx(0.02)


def test_features_command_reports_a_trace_without_outcome(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "runs.jsonl"
    src.write_text(json.dumps(step_trace("nogood", "t", 2, team=None).dump()) + "\n")
    assert main(["features", str(src), "-o", str(tmp_path / "f.csv")]) == 2
    err = capsys.readouterr().err
    assert "trace 'nogood' has no outcome" in err and "Traceback" not in err
