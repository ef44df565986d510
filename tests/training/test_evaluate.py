"""Truncation-replay evaluation: policies, figures, intervals, the command, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from eval_helpers import step_trace

from stopserve.artifacts import save_model_dir
from stopserve.cli import main
from stopserve.errors import ConfigError
from stopserve.objective import Objective
from stopserve.policy import Policy
from stopserve.safety import SafetyConfig
from stopserve.trace import Trace, write_traces
from stopserve.training.evaluate import evaluate
from stopserve.training.heuristics import HEURISTICS, HeuristicRule, TunedHeuristic, rank_families, replay
from stopserve.training.labels import build_decision_points

FIGURES = ("value", "success", "cost", "cost_saved", "success_lost", "gap_closed")


def _runs(n: int, seed: int, prefix: str = "r") -> list[Trace]:
    """Runs that are solved at a random step (or never), then keep going until a random end."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        steps = int(rng.integers(3, 10))
        solved = int(rng.integers(1, steps + 3))  # > steps: never solved
        grades = [1.0 if s + 1 >= solved else 0.0 for s in range(steps)]
        out.append(step_trace(f"{prefix}{i}", f"{prefix}task{i % (n // 2)}", steps, grades=grades))
    return out


def test_every_policy_is_scored_against_behavior_and_oracle() -> None:
    traces, tune = _runs(20, 1), _runs(20, 2, prefix="t")
    rule = HeuristicRule(turn_cap=2)
    policy = Policy.from_manifest(TunedHeuristic("turn_cap", rule, 0.0, "usd", 5.0).manifest())
    report = evaluate(policy, traces, objective=Objective(lam=5.0), tune_on=tune, n_boot=200)
    pols = report["policies"]
    assert set(pols) == {"behavior", *HEURISTICS, "learned", "oracle"}
    assert all(set(FIGURES) <= set(p) for p in pols.values())
    assert report["n_traces"] == 20 and report["cost_unit"] == "usd" and report["lambda"] == 5.0
    assert pols["learned"]["kind"] == "heuristic" and report["exact"] is False
    assert "--tune-on" in report["heuristic_tuning"]
    # replayed through decide, the heuristic policy is exactly the vectorised turn cap of 2
    dp = build_decision_points(traces)
    cap2 = replay(dp, rule.stop_mask(dp), 5.0)
    assert pols["learned"]["value"] == pytest.approx(cap2.mean_value)
    assert pols["learned"]["cost"] == pytest.approx(cap2.c.mean())
    b, o = pols["behavior"], pols["oracle"]
    assert b["cost_saved"] == 0 and b["success_lost"] == 0 and b["gap_closed"] == 0
    assert o["gap_closed"] == pytest.approx(1.0)
    assert o["value"] >= max(p["value"] for p in pols.values()) - 1e-12
    # the fair comparison is the family the training side chooses; the best on these traces is hindsight
    assert report["best_heuristic_hindsight"] == max(HEURISTICS, key=lambda n: pols[n]["value"])
    assert report["best_heuristic"] == rank_families(build_decision_points(tune), 5.0).best
    assert "--tune-on" in report["best_heuristic_choice"]
    for p in pols.values():
        lo, hi = p["ci95"]["value"]
        assert lo <= p["value"] <= hi
    expected_saved = 1 - pols["learned"]["cost"] / b["cost"]
    assert pols["learned"]["cost_saved"] == pytest.approx(expected_saved)


def test_without_tune_on_heuristics_are_cross_fitted_and_it_says_so() -> None:
    report = evaluate(None, _runs(20, 3), objective=Objective(lam=5.0), n_boot=50)
    assert "learned" not in report["policies"]
    assert report["heuristic_tuning"].startswith("cross-fitted")
    assert any("cross-fitted" in n for n in report["notes"])
    assert len(report["heuristics"]["turn_cap"]["parameter_per_fold"]) == 5


def test_optimal_values_and_exactness_from_simulator_metrics() -> None:
    traces = [
        step_trace(
            f"r{i}",
            f"t{i}",
            4,
            usd=None,
            grades=[0.0, 0.5, 1.0, 1.0],
            metrics={"optimal_value": 0.99, "optimal_lambda": 0.5, "run_to_cap": 1.0},
        )
        for i in range(4)
    ]
    report = evaluate(None, traces, objective=Objective(lam=0.5), tune_on=traces, n_boot=50)
    assert report["exact"] is True and report["cost_unit"] == "ktokens"
    opt = report["policies"]["optimal"]
    assert opt["value"] == pytest.approx(0.99) and opt["gap_closed_optimal"] == pytest.approx(1.0)
    # behavior 1 - 0.5*4 = -1; oracle stops at turn 3: 1 - 1.5 = -0.5
    assert report["policies"]["behavior"]["value"] == pytest.approx(-1.0)
    assert report["policies"]["oracle"]["gap_closed_optimal"] == pytest.approx(0.5 / 1.99)
    other = evaluate(None, traces, objective=Objective(lam=0.1), tune_on=traces, n_boot=50)
    assert "optimal" not in other["policies"] and any("optimal" in n for n in other["notes"])


def test_all_successes_at_no_cost_leave_no_gap_to_close() -> None:
    traces = [step_trace(f"r{i}", f"t{i}", 3, team=1.0) for i in range(4)]
    report = evaluate(None, traces, objective=Objective(lam=0.0), tune_on=traces, n_boot=50)
    assert report["policies"]["behavior"]["gap_closed"] is None
    assert report["policies"]["oracle"]["value"] == pytest.approx(1.0)


def test_bad_lambda_and_cost_weights_are_refused() -> None:
    with pytest.raises(ConfigError, match="lambda"):
        evaluate(None, _runs(4, 1), objective=Objective(lam=float("nan")))
    with pytest.raises(ConfigError, match="not both"):
        evaluate(None, _runs(4, 1), objective=Objective(lam=1.0, cost_share=0.3))


def _model_dir(tmp_path: Path, rule: SafetyConfig) -> Path:
    config = {k: v for k, v in rule.to_dict().items() if k != "min_turns"}
    manifest = {
        "kind": "heuristic",
        "base_rule": {"config": config},
        "gates": {"reward_rule_min_turns": rule.min_turns},
        "cost_unit": "usd",
        "objective": {"lambda": 5.0},
    }
    return save_model_dir(tmp_path / "model", manifest)


def test_evaluate_command_prints_one_json_object_and_draws_the_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs, tune = tmp_path / "runs.jsonl", tmp_path / "tune.jsonl"
    write_traces(runs, _runs(16, 4))
    write_traces(tune, _runs(16, 5, prefix="t"))
    model = _model_dir(tmp_path, SafetyConfig(max_turns=3, loop=None))
    chart = tmp_path / "pareto.png"
    argv = ["evaluate", "--model", str(model), str(runs), "--tune-on", str(tune), "--lambda", "5"]
    assert main([*argv, "--json", "--plot", str(chart)]) == 0
    out = capsys.readouterr().out
    report = json.loads(out)  # exactly one JSON object, nothing else on stdout
    assert {"lambda", "cost_unit", "n_traces", "policies", "best_heuristic"} <= set(report)
    assert report["policies"]["learned"]["kind"] == "heuristic"
    assert report["lambda"] == 5.0 and report["n_traces"] == 16
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "learned (heuristic)" in table and "best heuristic:" in table


def test_evaluate_command_reports_bad_input_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _model_dir(tmp_path, SafetyConfig())
    one_task = tmp_path / "one.jsonl"
    write_traces(one_task, [step_trace("a", "same", 3), step_trace("b", "same", 4, team=0.0)])
    assert main(["evaluate", "--model", str(model), str(one_task)]) == 2
    err = capsys.readouterr().err
    assert "only 1 group" in err and "--tune-on" in err and "Traceback" not in err
    no_outcome = tmp_path / "none.jsonl"
    write_traces(no_outcome, [step_trace("x", "t", 3, team=None)])
    assert main(["evaluate", "--model", str(model), str(no_outcome), "--tune-on", str(one_task)]) == 2
    assert "trace 'x' has no outcome" in capsys.readouterr().err
    assert main(["evaluate", "--model", str(model), str(one_task), "--cost-unit", "ktokens"]) == 2
    assert "differs from the model's cost unit 'usd'" in capsys.readouterr().err


def test_real_swe_runs_replay(swe_dir: Path) -> None:
    from stopserve.importers import mini_swe_agent

    traces = list(mini_swe_agent.read([swe_dir]))[::8]  # every 8th run: several repositories
    dp = build_decision_points(traces, group_by="repo")
    assert dp.cost_unit == "usd" and dp.n_traces == len(traces) > 30
    assert np.unique(dp.group).size >= 3
    assert set(np.unique(dp.trace_q_final)) <= {0.0, 1.0}
    policy = Policy.safety_only(SafetyConfig(max_usd=0.5))
    report = evaluate(policy, traces[::2], objective=Objective(lam=0.3), group_by="repo", n_boot=100)
    pols = report["policies"]
    assert pols["oracle"]["value"] >= pols["behavior"]["value"]
    assert pols["behavior"]["success"] == pytest.approx(float(dp.trace_q_final[::2].mean()))


def test_import_train_evaluate_end_to_end_on_real_runs(
    swe_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    imported = tmp_path / "swe.jsonl"
    assert main(["import", "mini-swe-agent", str(swe_dir), "-o", str(imported), "--no-progress"]) == 0
    lines = imported.read_text().splitlines()
    # every 5th run for training, the ones after them for evaluation: several repositories each
    (tmp_path / "train.jsonl").write_text("\n".join(lines[::5]) + "\n")
    (tmp_path / "test.jsonl").write_text("\n".join(lines[1::5]) + "\n")
    model = tmp_path / "model"
    argv = ["train", str(tmp_path / "train.jsonl"), "-o", str(model), "--lambda", "0.3"]
    assert main([*argv, "--group-by", "repo", "--folds", "3", "--no-progress"]) == 0
    capsys.readouterr()
    chart = tmp_path / "pareto.png"
    argv = ["evaluate", "--model", str(model), str(tmp_path / "test.jsonl")]
    argv += ["--tune-on", str(tmp_path / "train.jsonl"), "--json", "--plot", str(chart)]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cost_unit"] == "usd" and report["lambda"] == pytest.approx(0.3)
    assert report["n_traces"] == len(lines[1::5])
    assert report["policies"]["learned"]["kind"] in ("model", "heuristic")
    assert report["policies"]["oracle"]["value"] >= report["policies"]["learned"]["value"]
    assert chart.stat().st_size > 1000


def test_the_pareto_chart_says_its_axis_is_relative_and_draws_no_empty_sweep() -> None:
    pytest.importorskip("matplotlib")
    from stopserve.training.evaluate import pareto_figure

    point = {"cost": 1.19, "success": 0.25}
    report = {
        "cost_unit": "ktokens",
        "cost_normalised": True,
        "cost_share": 0.3,
        "n_traces": 12,
        "policies": {"learned": point, "behavior": {"cost": 1.0, "success": 0.25}, "oracle": point},
        "sweeps": {
            "learned": [dict(point) for _ in range(9)],  # a shipped heuristic ignores the cost weight
            "turn_cap": [{"cost": 0.3, "success": 0.08}, {"cost": 1.05, "success": 0.25}],
        },
    }
    fig = pareto_figure(report)
    (ax,) = fig.axes
    assert "relative" in ax.get_xlabel() and "(ktokens" not in ax.get_xlabel()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "learned (cost-weight sweep)" not in legend and "turn_cap (parameter sweep)" in legend
    report["cost_normalised"] = False
    assert pareto_figure(report).axes[0].get_xlabel() == "mean cost (ktokens)"
