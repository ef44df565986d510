"""Heuristic baselines: truncation replay, tuning, and conversion to safety configs."""

from __future__ import annotations

import numpy as np
import pytest
from eval_helpers import step_trace

from stopserve.errors import TrainingError
from stopserve.features import RunState
from stopserve.safety import DEFAULT_SAFETY
from stopserve.trace import Trace, is_decision_point
from stopserve.training.heuristics import (
    HEURISTICS,
    HeuristicRule,
    cross_fit_heuristics,
    group_folds,
    rank_families,
    replay,
    tune_heuristics,
)
from stopserve.training.labels import build_decision_points


def _dp():
    # a: solved at step 2 of 6 (graded); b: never solved; c: solved only at its end
    return build_decision_points(
        [
            step_trace("a", "t1", 6, grades=[0, 1, 1, 1, 1, 1]),
            step_trace("b", "t2", 6, grades=[0, 0, 0, 0, 0, 0], team=0.0),
            step_trace("c", "t3", 4, grades=[0, 0, 0, 1]),
        ]
    )


def test_replay_first_stop_wins_and_no_stop_gets_the_logged_end() -> None:
    dp = _dp()
    stop = np.zeros(dp.n_rows, dtype=bool)
    stop[[1, 3]] = True  # trace a: rows 1 and 3 -> the first (turn 2) wins
    stop[dp.offsets[1] + 2] = True  # trace b at turn 3
    rep = replay(dp, stop, lam=10.0)
    assert rep.stop_row.tolist() == [1, dp.offsets[1] + 2, -1]
    assert rep.stopped.tolist() == [True, True, False]
    np.testing.assert_allclose(rep.q, [1.0, 0.0, 1.0])
    np.testing.assert_allclose(rep.c, [0.02, 0.03, 0.04])
    np.testing.assert_allclose(rep.value, [1.0 - 0.2, -0.3, 1.0 - 0.4])
    with pytest.raises(TrainingError, match="one per row"):
        replay(dp, stop[:-1], lam=1.0)


def test_turn_cap_tuning_finds_the_best_cap() -> None:
    dp = _dp()
    tuned = tune_heuristics(dp, lam=10.0)
    assert set(tuned) == set(HEURISTICS)
    # cap 2: a keeps its success at 0.2 cost, b stops early, c loses its late success
    # cap 4 (or none): a 1-0.4, b -0.4, c 1-0.4 -> 0.2/3*... ; brute force both and compare
    values = {
        cap: replay(dp, HeuristicRule(turn_cap=cap).stop_mask(dp), 10.0).mean_value for cap in range(1, 7)
    }
    best_cap = max(values, key=lambda k: values[k])
    assert tuned["turn_cap"].rule.turn_cap == best_cap
    assert tuned["turn_cap"].value == pytest.approx(values[best_cap])
    assert tuned["combination"].value >= max(tuned[n].value for n in HEURISTICS[:-1]) - 1e-12
    # never_stop runs every trace to its end: the behavior's value
    assert tuned["never_stop"].value == pytest.approx(replay(dp, np.zeros(dp.n_rows, bool), 10.0).mean_value)
    # with no cost there is nothing to save: every cap is off (ties keep the net off)
    free = tune_heuristics(dp, lam=0.0)
    assert free["turn_cap"].rule.turn_cap is None and free["cost_cap"].rule.cost_cap is None


def test_cost_cap_and_reward_threshold_match_the_safety_nets() -> None:
    traces = [
        step_trace("a", "t1", 5, rewards=[0.1, 0.95, 0.2, 0.3, 0.99], grades=[0, 1, 1, 1, 1]),
        step_trace("b", "t2", 5, rewards=[0.1, 0.2, 0.3, 0.4, 0.5], team=0.0, usd=0.02),
        step_trace("c", "t3", 8, loop_from=2, team=0.0),
    ]
    dp = build_decision_points(traces)
    tuned = tune_heuristics(dp, lam=5.0)
    for h in tuned.values():
        policy = h.policy()
        # the served heuristic, run live on each trace, stops exactly where the replayed rule does
        expected = h.stop_mask(dp)
        got = []
        for trace in traces:
            state = RunState(topology=trace.topology, budget=trace.budget)
            for ev in trace.events:
                state.fold(ev)
                if is_decision_point(ev):
                    proposed = ev.type == "stop" and bool(ev.proposed)
                    got.append(policy.decide(state, proposed_stop=proposed).action == "stop")
        assert got == expected.tolist(), h.name


def test_cost_cap_in_thousands_of_tokens_becomes_max_tokens() -> None:
    config = HeuristicRule(cost_cap=2.5).base_config("ktokens")
    assert config.max_tokens == 2500 and config.max_usd is None and config.max_turns is None
    assert not config.loop.enabled  # the loop detector lives in the policy's own config, not its base rule
    own = HeuristicRule(loop=False, quality=False).own_config(DEFAULT_SAFETY)
    assert not own.loop.enabled and own.quality_met is None and own.max_turns == DEFAULT_SAFETY.max_turns
    assert HeuristicRule().own_config(DEFAULT_SAFETY) == DEFAULT_SAFETY


def test_cross_fitting_never_tunes_on_the_held_out_group() -> None:
    traces = [
        step_trace(f"r{i}", f"task{i}", 3 + i % 3, grades=[0, 1, 1, 1, 1][: 3 + i % 3]) for i in range(6)
    ]
    dp = build_decision_points(traces)
    fold, tuned = cross_fit_heuristics(dp, lam=1.0, folds=3, seed=1)
    assert len(tuned) == 3 and all(set(t) == set(HEURISTICS) for t in tuned)
    folds = group_folds(dp.group, 3, 1)
    assert fold.tolist() == folds.tolist()
    assert sorted(np.bincount(folds).tolist()) == [2, 2, 2]
    # each fold's rules are tuned without that fold's traces: retuning on the others gives the same
    for f, t in enumerate(tuned):
        alone = tune_heuristics(dp.subset(np.flatnonzero(fold != f)), lam=1.0)
        assert {n: h.rule for n, h in alone.items()} == {n: h.rule for n, h in t.items()}


def test_a_single_group_cannot_be_cross_fitted() -> None:
    dp = build_decision_points([step_trace("a", "same", 3), step_trace("b", "same", 2)])
    with pytest.raises(TrainingError, match="only 1 group"):
        cross_fit_heuristics(dp, lam=1.0)


def test_all_failures_make_the_earliest_stop_best() -> None:
    dp = build_decision_points([step_trace(f"r{i}", f"t{i}", 4, team=0.0) for i in range(3)])
    tuned = tune_heuristics(dp, lam=1.0)
    assert tuned["turn_cap"].rule.turn_cap == 1
    assert tuned["turn_cap"].value == pytest.approx(-0.01)


# --------------------------------------------------------------------------- issue 27: the families


def _finish_at_end(n: int, *, long_failure: bool = False) -> list[Trace]:
    """Runs that succeed only at their last step (stopping any earlier loses the success)."""
    out = [step_trace(f"r{i}", f"t{i}", 5, grades=[0, 0, 0, 0, 1], team=1.0) for i in range(n)]
    if long_failure:  # one long run that never succeeds: a cap would save its cost, and only its
        out.append(step_trace("long", "tlong", 40, grades=[0] * 40, team=0.0))
    return out


def test_never_stop_is_a_family_and_wins_where_running_to_the_end_is_best() -> None:
    dp = build_decision_points(_finish_at_end(30))
    tuned = tune_heuristics(dp, lam=0.01)
    behavior = replay(dp, np.zeros(dp.n_rows, dtype=bool), 0.01).mean_value
    assert tuned["never_stop"].value == pytest.approx(behavior)
    assert tuned["never_stop"].rule.is_never_stop and tuned["never_stop"].to_dict()["rule"].startswith(
        "never stop"
    )
    ranking = rank_families(dp, 0.01)
    assert ranking.best == "never_stop"  # ties go to the simpler family
    assert ranking.values["never_stop"] >= max(ranking.values.values()) - 1e-12


def test_a_cap_is_not_set_at_the_knife_edge_of_the_longest_run_that_paid() -> None:
    # the in-sample maximum caps turns at 5, the length of every run that succeeded: one step more
    # for a new run and the cap cuts it; its gain rests on the one long failure
    dp = build_decision_points(_finish_at_end(30, long_failure=True))
    best_cap = max(
        range(1, 41), key=lambda c: replay(dp, HeuristicRule(turn_cap=c).stop_mask(dp), 0.1).mean_value
    )
    assert best_cap == 5
    tuned = tune_heuristics(dp, lam=0.1)
    cap = tuned["turn_cap"].rule.turn_cap
    assert cap is None or cap >= 20, cap  # within one standard error, the most conservative cap
    # the same gain on many runs is taken
    many = build_decision_points(
        _finish_at_end(30) + [step_trace(f"l{i}", f"tl{i}", 40, grades=[0] * 40, team=0.0) for i in range(10)]
    )
    assert tune_heuristics(many, lam=0.1)["turn_cap"].rule.turn_cap is not None


def test_few_groups_rank_the_families_by_leave_one_group_out_whatever_the_seed() -> None:
    traces = [
        step_trace(f"r{i}", f"task{i % 6}", 3 + i % 4, grades=[0, 1, 1, 1, 1, 1][: 3 + i % 4], team=1.0)
        for i in range(24)
    ]
    dp = build_decision_points(traces)
    rankings = [rank_families(dp, lam=1.0, seed=seed) for seed in range(8)]
    assert {r.scheme for r in rankings} == {"leave one group out"}
    assert len({r.best for r in rankings}) == 1 and len({tuple(r.values.items()) for r in rankings}) == 1
    many = build_decision_points([step_trace(f"m{i}", f"task{i}", 4, team=1.0) for i in range(30)])
    assert rank_families(many, lam=1.0).scheme == "5-fold x 3"


def test_a_tuned_family_is_named_for_the_rule_it_is() -> None:
    from stopserve.training.heuristics import TunedHeuristic

    off = TunedHeuristic("reward_threshold", HeuristicRule(), 0.0, "usd", 1.0)
    assert off.display_name == "loop_detector" and off.manifest().base_rule.name == "loop_detector"  # type: ignore[union-attr]
    never = TunedHeuristic(
        "combination", HeuristicRule(loop=False, quality=False, proposals=False), 0.0, "usd", 1.0
    )
    assert never.display_name == "never_stop"
    capped = TunedHeuristic("turn_cap", HeuristicRule(turn_cap=4), 0.0, "usd", 1.0)
    assert capped.display_name == "turn_cap"
