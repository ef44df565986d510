"""The learner: what it ships, the guard, the one replay, bad input."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from eval_helpers import step_trace
from fit_data import synth_trace, synth_traces

from stopserve.artifacts import load_model_dir
from stopserve.cli import build_parser, main
from stopserve.errors import ConfigError, TrainingError
from stopserve.objective import Objective
from stopserve.policy import Policy
from stopserve.trace import Trace, write_traces
from stopserve.training.evaluate import evaluate
from stopserve.training.fit import PolicyLearner, _ipw, _next_stop_value, _targets, k_target
from stopserve.training.heuristics import replay
from stopserve.training.labels import build_decision_points

FAST: dict[str, Any] = {"folds": 3, "max_rounds": 40, "n_boot": 300}


@pytest.fixture(scope="module")
def traces() -> list[Trace]:
    return synth_traces(160, seed=2)


@pytest.fixture(scope="module")
def fitted(traces: list[Trace]) -> PolicyLearner:
    return PolicyLearner(objective=Objective(lam=2.0), method="behavior", **FAST).fit(traces)


def test_learned_policy_beats_heuristics_on_a_learnable_signal(fitted: PolicyLearner) -> None:
    pol = fitted.cv_["policies"]
    m = fitted.manifest_
    assert m.kind == "model" and fitted.chosen_ == "learned"
    assert pol["learned"]["value"] > pol["behavior"]["value"]
    assert pol["learned"]["value"] > pol[fitted.cv_["best_heuristic"]]["value"]
    assert pol["learned"]["value"] <= pol["oracle"]["value"] + 1e-12
    assert set(fitted.models_) == {"g", "k", "s"}  # what the behavior method reads, and S
    assert m.guard is not None and m.training_data is not None and m.cv is not None
    assert m.guard["shipped"] == "learned model"
    lo, hi = m.guard["difference_interval_90"]
    assert lo >= 0 and lo <= m.guard["difference"] <= hi
    assert m.training_data["n_traces"] == 160 and len(m.training_data["sha256"]) == 64
    assert m.base_rule is not None and m.base_rule.name in m.cv["policies"]
    assert fitted.timings_["lightgbm_train_s"] > 0
    # repetition / error features carry the signal
    top = list(fitted.importance_)[:10]
    assert any(("error" in n or "ident" in n or "ref" in n or "same" in n or "result" in n) for n in top), top


def test_evaluating_the_written_model_on_its_training_set_gives_the_guards_figure(
    fitted: PolicyLearner, traces: list[Trace], tmp_path: Path
) -> None:
    # one replay, the served one: the trainer's in-sample figure is what evaluate measures
    out = fitted.save(tmp_path / "m")
    policy = Policy.load(out)
    report = evaluate(policy, traces, objective=Objective(lam=2.0), n_boot=50)
    assert report["policies"]["learned"]["value"] == pytest.approx(fitted.guard_["in_sample_value"], abs=1e-9)


def test_cross_validated_values_are_replays(fitted: PolicyLearner) -> None:
    dp = fitted.dp_
    never = replay(dp, np.zeros(dp.n_rows, dtype=bool), 2.0)
    assert fitted.cv_["policies"]["behavior"]["value"] == pytest.approx(never.mean_value)
    best = np.maximum.reduceat(dp.r_stop(2.0), dp.offsets[:-1]).mean()
    assert fitted.cv_["policies"]["oracle"]["value"] == pytest.approx(best)


def test_cost_share_is_resolved_from_the_mean_behavior_cost(traces: list[Trace], tmp_path: Path) -> None:
    learner = PolicyLearner(objective=Objective(cost_share=0.3), method="behavior", **FAST).fit(traces[:80])
    dp = learner.dp_
    mean = float(dp.trace_c_final.mean())
    m = learner.manifest_
    assert m.objective == Objective(cost_share=0.3, unit=dp.cost_unit)  # as asked, and once
    assert m.cost_scale.kind == "fixed" and m.cost_scale.mean_behavior_cost == pytest.approx(mean)
    assert learner.cv_["lambda"] == pytest.approx(0.3 / mean)
    # served with no objective, the policy weighs cost as it was trained to
    policy = learner.policy()
    assert policy.resolve(None) == Objective(cost_share=0.3, unit=dp.cost_unit)
    assert policy.resolve(Objective(lam=1.0)) == Objective(lam=1.0)
    with pytest.raises(ConfigError, match="per seconds"):
        policy.resolve(Objective(lam=1.0, unit="seconds"))


def test_the_learner_reproduces_a_heuristic_it_cannot_beat(tmp_path: Path) -> None:
    # runs whose only signal is the turn: a turn cap is optimal and the learner must not lose to it
    rng = random.Random(5)
    runs = []
    for i in range(120):
        n = rng.randint(2, 8)
        solved_at = 1 if rng.random() < 0.6 else 99
        grades = [1.0 if s + 1 >= solved_at else 0.0 for s in range(n)]
        runs.append(step_trace(f"r{i}", f"t{i % 60}", n, grades=grades, team=grades[-1]))
    learner = PolicyLearner(objective=Objective(cost_share=0.5), **FAST).fit(runs)
    pol = learner.cv_["policies"]
    best = learner.cv_["best_heuristic"]
    assert pol["learned"]["value"] >= pol[best]["value"] - 1e-9 or learner.chosen_ != "learned"
    # what ships is never below the best heuristic in its own in-sample replay
    heur_only = PolicyLearner(objective=Objective(cost_share=0.5), min_groups=10_000, **FAST).fit(runs)
    assert heur_only.chosen_ != "learned" and heur_only.manifest_.kind == "heuristic"
    assert learner.guard_["in_sample_value"] >= heur_only.guard_["in_sample_value"] - 1e-9


def test_too_little_data_ships_the_heuristic_and_says_so_plainly(capsys: pytest.CaptureFixture[str]) -> None:
    three = synth_traces(3, seed=1)
    learner = PolicyLearner(**FAST).fit(three)
    assert learner.chosen_ != "learned" and learner.manifest_.kind == "heuristic"
    notes = " ".join(learner.notes_)
    assert "too little data" in notes and "3 groups" in notes
    if learner.guard_["shipped_rule"].startswith("never stop"):
        assert "NEVER STOPS A RUN ON ITS OWN" in notes


def test_the_model_version_names_its_kind_and_method_once() -> None:
    learner = PolicyLearner(**FAST).fit(synth_traces(3, seed=1))  # too little data: a heuristic ships
    version = learner.manifest_.model_version
    assert version.startswith("heuristic-") and "heuristic-heuristic" not in version


def test_optimal_method_fits_c_and_serves_it(traces: list[Trace], tmp_path: Path) -> None:
    learner = PolicyLearner(objective=Objective(lam=2.0), method="optimal", **FAST).fit(traces[:100])
    if learner.chosen_ == "learned":
        assert set(learner.models_) == {"c", "g", "s", "k"}
        assert learner.manifest_.objective is not None and learner.manifest_.objective.lam == 2.0
    out = learner.save(tmp_path / "opt")
    policy = Policy.load(out)
    report = evaluate(policy, traces[:100], objective=Objective(lam=2.0), n_boot=50)
    assert report["policies"]["learned"]["value"] == pytest.approx(
        learner.guard_["in_sample_value"], abs=1e-9
    )


def test_k_target_is_scale_free() -> None:
    cheap = [step_trace(f"r{i}", f"t{i}", 5, tokens=1000 * (i + 1)) for i in range(3)]
    dear = [step_trace(f"r{i}", f"t{i}", 5, tokens=1_000_000 * (i + 1)) for i in range(3)]
    a = k_target(build_decision_points(cheap, cost_unit="ktokens"))
    b = k_target(build_decision_points(dear, cost_unit="ktokens"))
    np.testing.assert_allclose(a, b)
    # 5 equal steps: after step 1, four more of the same cost
    assert a[0] == pytest.approx(4.0)


def test_next_stop_value_matches_brute_force(traces: list[Trace]) -> None:
    dp = build_decision_points(traces[:30])
    rng = np.random.default_rng(0)
    stop = rng.random(dp.n_rows) < 0.2
    got = _next_stop_value(dp, stop, 0.5)
    for r in range(dp.n_rows):
        tr = dp.trace_idx[r]
        later = [j for j in range(r + 1, int(dp.offsets[tr + 1])) if stop[j] and not dp.is_last[r]]
        want = dp.q[later[0]] - 0.5 * dp.c[later[0]] if later else dp.q_final[r] - 0.5 * dp.c_final[r]
        assert got[r] == pytest.approx(want)


def test_propensities_below_one_weight_rows() -> None:
    rng = random.Random(3)
    runs = [synth_trace(i, rng, propensity=0.5 if i % 2 else None) for i in range(10)]
    w = _ipw(build_decision_points(runs))
    assert w.mean() == pytest.approx(1.0) and w.max() > w.min()


def test_bad_input_is_refused() -> None:
    with pytest.raises(TrainingError, match="at least 2 traces"):
        PolicyLearner(**FAST).fit(synth_traces(1))
    with pytest.raises(TrainingError, match="folds"):
        PolicyLearner(folds=1).fit(synth_traces(10))
    with pytest.raises(TrainingError, match="method"):
        PolicyLearner(method="magic").fit(synth_traces(10))
    with pytest.raises(ConfigError, match="not both"):
        PolicyLearner(objective=Objective(lam=1.0, cost_share=0.3)).fit(synth_traces(10))
    with pytest.raises(TrainingError, match="objective must be an Objective"):
        PolicyLearner(objective=0.3).fit(synth_traces(10))  # type: ignore[arg-type]
    with pytest.raises(TrainingError, match="per_run"):
        PolicyLearner(objective=Objective(lam=1.0), cost_scale="per_run").fit(synth_traces(10))
    with pytest.raises(TrainingError, match="unknown features"):
        PolicyLearner(features=["no_such_feature"]).fit(synth_traces(10))
    with pytest.raises(TrainingError, match="not fitted"):
        PolicyLearner().policy()


def test_scale_free_features_are_the_only_ones_read(traces: list[Trace]) -> None:
    learner = PolicyLearner(
        objective=Objective(lam=2.0), method="behavior", features="scale-free", **FAST
    ).fit(traces[:100])
    used = set(learner.manifest_.features_used)
    assert "tokens" not in used and "reward_latest" in used
    for name, share in learner.importance_.items():
        if name not in used:
            assert share == 0.0, name


def test_train_command_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "runs.jsonl"
    write_traces(path, synth_traces(60, seed=4))
    out = tmp_path / "m"
    code = main(["train", str(path), "-o", str(out), "--folds", "3", "--no-progress", "--method", "behavior"])
    assert code == 0
    err = capsys.readouterr().err
    assert "guard:" in err and "chosen policy:" in err and "in-sample value" in err
    art = load_model_dir(out)
    assert art.manifest.objective == Objective(cost_share=0.3, unit=art.manifest.cost_unit)  # the default
    assert art.manifest.cost_scale.mean_behavior_cost is not None


def test_train_help_shows_every_default() -> None:
    train = build_parser()._subparsers._group_actions[0].choices["train"]  # type: ignore[union-attr]
    text = train.format_help()
    for option in ("--cost-share", "--cost-scale", "--method", "--min-turns", "--features", "--folds"):
        assert option in text
    for action in train._actions:
        if action.option_strings and action.default not in (None, False) and action.dest != "help":
            assert "Default" in (action.help or ""), action.dest


def test_train_command_refuses_traces_without_outcome(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = synth_traces(1)[0].model_copy(update={"rewards": {}})
    path = tmp_path / "bad.jsonl"
    write_traces(path, [trace, *synth_traces(3, seed=1)])
    code = main(["train", str(path), "-o", str(tmp_path / "m"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "no outcome" in err and "Traceback" not in err


def test_group_by_choices_match_the_labels_module() -> None:
    from stopserve.cli import GROUP_BY as CLI_GROUP_BY
    from stopserve.training.labels import GROUP_BY

    assert CLI_GROUP_BY == GROUP_BY


def test_min_turns_and_margins_recorded(fitted: PolicyLearner) -> None:
    m = fitted.manifest_
    assert m.gates.model_min_turns in (1, 2, 3)
    stop, cont = m.margins.stop, m.margins.continue_
    assert stop is None or math.isfinite(stop)
    assert cont is None or math.isfinite(cont)
    assert stop is not None or cont is not None  # a shipped model deviates from its rule somewhere


def test_each_model_declares_how_its_raw_score_is_read(traces: list[Trace]) -> None:
    from stopserve.training.fit import _targets

    # grades in [0, 1]: S is a probability (cross-entropy, read through a sigmoid)
    assert _targets(build_decision_points(traces[:20]))["s"].transform == "sigmoid"
    # grades outside [0, 1] (a noisy verifier): S is a regression, read as it is
    rng = random.Random(7)
    wide = [
        step_trace(f"w{i}", f"t{i}", 6, grades=[rng.uniform(-0.2, 1.2) for _ in range(6)], team=None)
        for i in range(10)
    ]
    assert _targets(build_decision_points(wide))["s"].transform == "identity"
    raw = np.array([-1.0, 0.0, 2.0])
    sig = Policy.from_manifest(
        {"format": "stopserve.model/2", "kind": "none", "models": {"s": {"transform": "sigmoid"}}}
    )
    ident = Policy.from_manifest({"format": "stopserve.model/2", "kind": "none", "models": {"s": {}}})
    assert sig.transformed("s", raw) == pytest.approx(1 / (1 + np.exp(-raw)))
    assert ident.transformed("s", raw) == pytest.approx(raw)
    # the shipped entries say it too
    learner = PolicyLearner(objective=Objective(lam=2.0), method="behavior", **FAST).fit(traces[:60])
    if learner.models_:
        assert learner.manifest_.models["s"].transform == "sigmoid"


# --------------------------------------------------------------------------- issue 27: no leak, the rules


def test_a_folds_base_rule_never_depends_on_that_folds_own_traces(traces: list[Trace]) -> None:
    """Each fold's base rule (and so the optimal method's later rule on its rows) is chosen and
    tuned without that fold's traces: changing their outcomes changes nothing of it."""
    learner = PolicyLearner(objective=Objective(lam=2.0), method="optimal", **FAST).fit(traces)
    folds = learner.cv_["fold_choices"]
    from stopserve.training.heuristics import group_folds

    dp = learner.dp_
    # the decision points hold the traces in the canonical order (by id), not as given
    fold = dict(zip(dp.trace_id.tolist(), group_folds(dp.group, FAST["folds"], 0).tolist(), strict=True))
    flipped = [
        t.model_copy(update={"rewards": {"team": 1.0 - float(t.rewards["team"])}})
        if fold[t.trace_id] == 0
        else t
        for t in traces
    ]
    again = (
        PolicyLearner(objective=Objective(lam=2.0), method="optimal", **FAST).fit(flipped).cv_["fold_choices"]
    )
    assert (again[0]["base"], again[0]["base_rule"]) == (folds[0]["base"], folds[0]["base_rule"])


def test_never_stop_ships_named_as_such_where_no_rule_beats_the_end(tmp_path: Path) -> None:
    # every run succeeds only at its last step: no rule beats running to the end
    runs = [step_trace(f"r{i}", f"t{i}", 4 + i % 3, grades=[0.0] * (3 + i % 3) + [1.0]) for i in range(24)]
    learner = PolicyLearner(objective=Objective(lam=0.01), method="behavior", **FAST).fit(runs)
    assert learner.cv_["best_heuristic"] == "never_stop"
    base = learner.manifest_.base_rule
    assert base is not None and base.name in ("never_stop", "loop_detector")


def test_the_optimal_methods_later_rule_on_a_folds_rows_is_that_folds_own(traces: list[Trace]) -> None:
    """The leak of old: the backward induction's base rule was tuned on every trace, each fold's
    test traces included. Now each row's later rule fires where its own fold's rule does."""
    from stopserve.training.fit import TraceSource

    learner = PolicyLearner(objective=Objective(lam=2.0), method="optimal", **FAST)
    learner._check_params()
    st = learner._prepare(TraceSource(traces), None, False, "task")
    learner._heuristics(st)
    fires = learner._fold_fires(st)
    row_fold = st.trace_fold[st.dp.trace_idx]
    for f in range(st.k):
        own = st.fold_heur[f][st.fold_family[f]].fires(st.dp)
        mine = row_fold == f
        for kind in ("loop", "quality", "rule", "proposed"):
            np.testing.assert_array_equal(getattr(fires, kind)[mine], getattr(own, kind)[mine])


def _cut_log(n: int = 200, every: int = 5) -> list[Trace]:
    """Runs a logging policy stopped at step 3 (quality 0.2), but one in ``every``, explored at
    propensity 1/every, which went on to step 6 and quality 1.0, as the service logs them."""
    grades = [0.1, 0.15, 0.2, 0.5, 0.8, 1.0]
    out: list[Trace] = []
    for i in range(n):
        explored = i % every == 0
        steps = 6 if explored else 3
        raw = step_trace(
            f"r{i}", f"task{i}", steps, tokens=100, usd=None, grades=grades[:steps], team=grades[steps - 1],
            final_stop=explored,
        ).model_dump(mode="json", exclude_none=True)  # fmt: skip
        for ev in raw["events"]:
            if ev["type"] == "return":
                at_cut = ev["id"] == "r2"
                ev["decision"] = (
                    {"action": "continue", "propensity": 1.0 / every}
                    if at_cut and explored
                    else {"action": "stop", "propensity": 1.0 - 1.0 / every}
                    if at_cut
                    else {"action": "continue", "propensity": 1.0}
                )
        if not explored:
            raw["stop"] = {"reason": "no_progress", "by": "service"}
        out.append(Trace.model_validate(raw))
    return out


def test_a_row_where_the_logging_policy_cut_the_run_teaches_nothing_of_going_on() -> None:
    dp = build_decision_points(_cut_log(20), cost_unit="ktokens")
    cut = dp.cut
    assert cut.sum() == 16  # every run but the explored ones, at its last row
    rows = _targets(dp)["g"].rows
    assert rows is not None and not rows[cut].any() and rows[~cut].all()
    # traces no service decided on: every row teaches G
    assert _targets(build_decision_points(synth_traces(10)))["g"].rows is None


def test_next_stop_value_goes_on_past_a_cut_run_at_the_value_given() -> None:
    dp = build_decision_points(_cut_log(10), cost_unit="ktokens")
    cut = dp.cut
    no_stop = np.zeros(dp.n_rows, dtype=bool)
    beyond = np.where(cut, 0.9, np.nan)
    got = _next_stop_value(dp, no_stop, 0.1, beyond)
    plain = _next_stop_value(dp, no_stop, 0.1)
    cut_trace = cut[dp.offsets[1:] - 1][dp.trace_idx]
    np.testing.assert_allclose(got[cut_trace], 0.9)
    np.testing.assert_allclose(got[~cut_trace], plain[~cut_trace])
    # where the rule stops at the cut row, what stopping there gave
    at_cut = _next_stop_value(dp, cut, 0.1, beyond)
    last = dp.offsets[1:][dp.trace_idx] - 1
    before = cut_trace & ~cut
    np.testing.assert_allclose(at_cut[before], (dp.q - 0.1 * dp.c)[last[before]])


def test_a_retrain_learns_what_going_on_past_the_logged_stops_is_worth() -> None:
    """Four runs in five were cut at quality 0.2, the explored fifth went on to 1.0: going on is
    worth about 1.0 there (C, the fitted backward induction's value of going on), not the IPW mix
    of "the run ended here" and "it went on" (about 0.6, what the cut rows taught before)."""
    from stopserve.training.fit import TraceSource

    learner = PolicyLearner(objective=Objective(lam=0.1), method="optimal", min_turns=1, **FAST)
    learner._check_params()
    st = learner._prepare(TraceSource(_cut_log(200)), "ktokens", False, "task")
    for name in ("g", "k", "s"):
        learner._cross_fit(st, st.targets[name])
    learner._heuristics(st)
    learner._fit_optimal(st)
    cut = st.dp.cut
    assert cut.sum() == 160
    assert float(st.oof["c"][cut].mean()) > 0.9
