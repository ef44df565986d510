"""Off-policy estimates of stop policies against the simulator's truth (issue 25).

A run-to-cap simulator twin holds every prefix of a run, so any policy's true value on it
is exact; the logging policy's randomness on one run has few branches (how many of its
stops it explores before it keeps one), so the *expectation* of an estimator over that
randomness is exact too (``logged_runs.branches``). IS and DR must then equal the truth
run by run where every stop the evaluated policy goes past could have been explored, and
say so where one could not.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from logged_runs import branches, explored_stops, serve, true_value

from stopserve.objective import Objective
from stopserve.policy import Policy
from stopserve.trace import Trace
from stopserve.training.heuristics import HeuristicRule, TunedHeuristic
from stopserve.training.labels import build_decision_points
from stopserve.training.offpolicy import (
    MAX_UNSUPPORTED,
    MIN_ESS_SHARE,
    MIN_RUNS,
    MIN_WEIGHTED,
    LoggedEvaluation,
    RunValues,
    continue_propensity,
    evaluate_logged,
    per_run_values,
)
from stopserve.training.offpolicy import _support_verdict as support_verdict
from stopserve.training.replay import replay_decide
from stopserve.training.simulate import simulate

LAM = 0.1
EPS, RHO = 0.2, 0.6


def rule(**kw: Any) -> Policy:
    """A heuristic served as a policy, its loop detector off (every stop of its rule explorable)."""
    policy: Policy = TunedHeuristic("h", HeuristicRule(loop=False, **kw), math.nan, "ktokens", LAM).policy()
    return policy


LOGGER = rule(reward_threshold=0.5)
TARGETS = {
    "later": rule(reward_threshold=0.7),
    "earlier": rule(reward_threshold=0.4),
    "turn cap": rule(turn_cap=30),
    "never": rule(quality=False, proposals=False),
}


@pytest.fixture(scope="module")
def twins() -> list[dict[str, Any]]:
    return list(simulate(24, seed=3, topology="centralized", run_to_cap=True, optimal_lambda=LAM))


def _expectations(
    twins: list[dict[str, Any]], epsilon: float, rho: float, v_noise: float = 0.0
) -> dict[str, Any]:
    """Per twin: the exact expectation of IS and DR over the logging randomness, and the truth."""
    logged: list[tuple[int, float, dict[str, Any]]] = []
    for i, twin in enumerate(twins):
        for p, got in branches(LOGGER, twin, lam=LAM, epsilon=epsilon, rho=rho):
            logged.append((i, p, got.trace))
    traces = [Trace.model_validate(t) for _, _, t in logged]
    dp = build_decision_points(traces, cost_unit="ktokens")
    stops = replay_decide(traces, dp, lambda _: list(TARGETS.values()), objective=Objective(lam=LAM))
    # a wrong model of the value of going on, but one of the run's state (as a model is)
    weights = np.random.default_rng(0).normal(0.0, 1.0, dp.X.shape[1])
    v_hat = v_noise * np.sin(np.nan_to_num(dp.X) @ weights) if v_noise else None
    out: dict[str, Any] = {"p": defaultdict(float), "support": defaultdict(set)}
    for j, name in enumerate(TARGETS):
        rv = per_run_values(dp, stops[j], LAM, v_hat)
        ips: dict[int, float] = defaultdict(float)
        dr: dict[int, float] = defaultdict(float)
        for k, (i, p, _) in enumerate(logged):
            ips[i] += p * rv.ips[k]
            dr[i] += p * rv.dr[k]
            out["support"][name].add(str(rv.support[k]))
        out[name] = (ips, dr)
    for i, p, _ in logged:
        out["p"][i] += p
    return out


def test_is_and_dr_are_unbiased_where_every_stop_could_be_explored(twins: list[dict[str, Any]]) -> None:
    got = _expectations(twins, EPS, RHO, v_noise=0.3)  # DR with a deliberately wrong model part
    assert all(p == pytest.approx(1.0) for p in got["p"].values())
    for name, policy in TARGETS.items():
        ips, dr = got[name]
        for i, twin in enumerate(twins):
            truth = true_value(policy, twin, lam=LAM)
            assert ips[i] == pytest.approx(truth, abs=1e-9), (name, i)
            assert dr[i] == pytest.approx(truth, abs=1e-9), (name, i)
    # the policies that go on past the logger's stops were judged through explored runs
    assert {"weighted", "zeroed"} <= got["support"]["later"]
    assert got["support"]["earlier"] == {"exact"}  # stopping no later than the log: read from it


def test_without_exploration_a_later_policy_is_unsupported_and_said_so(twins: list[dict[str, Any]]) -> None:
    logged = [serve(LOGGER, t, lam=LAM, epsilon=0.0, rho=0.0, explore=0).trace for t in twins * 3]
    for k, t in enumerate(logged):
        t["trace_id"] = f"{t['trace_id']}~{k}"
    traces = [Trace.model_validate(t) for t in logged]
    dp = build_decision_points(traces, cost_unit="ktokens")
    _, mu = continue_propensity(dp)
    assert (mu[dp.is_last & dp.logged_stop] == 0.0).all()  # a stop logged without exploration: no way on
    policies = {"later": TARGETS["later"], "earlier": TARGETS["earlier"]}
    stops = replay_decide(traces, dp, lambda _: list(policies.values()), objective=Objective(lam=LAM))
    ev = evaluate_logged(policies, dp, {n: stops[j] for j, n in enumerate(policies)}, lam=LAM)
    later, earlier = ev.estimates["later"], ev.estimates["earlier"]
    assert later.unsupported > MAX_UNSUPPORTED * later.n_runs and not later.enough
    assert "no exploration could undo" in (later.why or "")
    truth = np.mean([true_value(TARGETS["later"], t, lam=LAM) for t in twins])
    assert abs(later.ips - truth) > 0.01  # biased: IS cannot see past a stop nothing explored
    assert earlier.enough and earlier.exact == earlier.n_runs
    assert earlier.ips == pytest.approx(np.mean([true_value(TARGETS["earlier"], t, lam=LAM) for t in twins]))


def test_intervals_cover_the_truth_on_sampled_logs() -> None:
    """Logs drawn with the logger's own randomness: the DR interval covers the same runs' truth."""
    twins = list(simulate(160, seed=11, topology="centralized", run_to_cap=True, optimal_lambda=LAM))
    truth = {n: np.mean([true_value(p, t, lam=LAM) for t in twins]) for n, p in TARGETS.items()}
    covered = {n: 0 for n in TARGETS}
    reps = 12
    for rep in range(reps):
        rng = random.Random(rep)
        logged = []
        for twin in twins:
            explore = explored_stops(rng, EPS, RHO)
            logged.append(serve(LOGGER, twin, lam=LAM, epsilon=EPS, rho=RHO, explore=explore).trace)
        traces = [Trace.model_validate(t) for t in logged]
        dp = build_decision_points(traces, cost_unit="ktokens")
        stops = replay_decide(traces, dp, lambda _: list(TARGETS.values()), objective=Objective(lam=LAM))
        ev = evaluate_logged(TARGETS, dp, {n: stops[j] for j, n in enumerate(TARGETS)}, lam=LAM, seed=rep)
        for name in TARGETS:
            lo, hi = ev.estimates[name].dr_ci90
            covered[name] += lo <= truth[name] <= hi
    assert all(c >= 0.75 * reps for c in covered.values()), covered


def test_a_figure_resting_on_a_few_heavy_weights_is_not_supported() -> None:
    """Never stopping needs every later stop explored too: a handful of runs weighted by the
    product of 1/propensity stand for the rest, and their bootstrap says far less than it seems."""
    twins = list(simulate(300, seed=21, topology="centralized", run_to_cap=True, optimal_lambda=LAM))
    rng = random.Random(0)
    logged = [
        serve(LOGGER, t, lam=LAM, epsilon=0.5, rho=0.8, explore=explored_stops(rng, 0.5, 0.8)).trace
        for t in twins
    ]
    traces = [Trace.model_validate(t) for t in logged]
    dp = build_decision_points(traces, cost_unit="ktokens")
    policies = {"never": TARGETS["never"], "turn cap": TARGETS["turn cap"]}
    stops = replay_decide(traces, dp, lambda _: list(policies.values()), objective=Objective(lam=LAM))
    ev = evaluate_logged(policies, dp, {n: stops[j] for j, n in enumerate(policies)}, lam=LAM)
    never = ev.estimates["never"]
    truth = np.mean([true_value(TARGETS["never"], t, lam=LAM) for t in twins])
    # enough explored runs by count, none resting on a model alone: only their weights' spread says no
    assert never.weighted >= MIN_WEIGHTED and never.unsupported == 0
    assert never.ess < MIN_ESS_SHARE * never.n_runs and not never.enough
    assert "weighted so unevenly" in (never.why or "")
    lo, hi = never.dr_ci90
    assert not lo <= truth <= hi, (never.dr, never.dr_ci90, truth)  # the interval it would have given misses
    # a policy going on past as many logged stops, but not as far, is judged on the same runs
    cap = ev.estimates["turn cap"]
    cap_truth = np.mean([true_value(TARGETS["turn cap"], t, lam=LAM) for t in twins])
    assert cap.weighted >= never.weighted and cap.ess >= MIN_ESS_SHARE * cap.n_runs and cap.enough
    assert cap.dr_ci90[0] <= cap_truth <= cap.dr_ci90[1]


def test_a_paired_difference_reads_both_policies_on_the_same_runs(twins: list[dict[str, Any]]) -> None:
    logged = [serve(LOGGER, t, lam=LAM, epsilon=EPS, rho=RHO, explore=0).trace for t in twins * 3]
    for k, t in enumerate(logged):
        t["trace_id"] = f"{t['trace_id']}~{k}"
    traces = [Trace.model_validate(t) for t in logged]
    dp = build_decision_points(traces, cost_unit="ktokens")
    policies = {"a": TARGETS["earlier"], "b": TARGETS["earlier"]}
    stops = replay_decide(traces, dp, lambda _: list(policies.values()), objective=Objective(lam=LAM))
    ev = evaluate_logged(policies, dp, {n: stops[j] for j, n in enumerate(policies)}, lam=LAM)
    assert ev.difference("a", "b") == (0.0, (0.0, 0.0))
    assert ev.estimates["logged"].exact == dp.n_traces


@pytest.mark.parametrize(
    ("counts", "ess", "says"),
    [
        ((MIN_RUNS - 1, MIN_RUNS - 1, 0, 0, 0), None, "at least"),
        ((100, 80, 0, 0, 20), None, "no exploration could undo"),
        ((100, 80, MIN_WEIGHTED - 1, 11, 0), None, "explored runs show what follows"),
        ((100, 60, MIN_WEIGHTED, 30, 0), None, None),
        ((100, 95, 0, 5, 0), None, None),  # 5% resting on the model alone: allowed
        # a few explored runs standing for most of the others: their weights' effective size decides
        ((100, 10, MIN_WEIGHTED, 85, 0), MIN_ESS_SHARE * 100 - 1, "counts as 5 runs"),
        ((100, 10, MIN_WEIGHTED, 85, 0), MIN_ESS_SHARE * 100, None),
    ],
)
def test_when_too_few_runs_support_a_figure(
    counts: tuple[int, int, int, int, int], ess: float | None, says: str | None
) -> None:
    why = support_verdict(*counts, ess=ess)
    assert (why is None) if says is None else (why is not None and says in why)


def test_dominance_is_every_run_at_least_as_good_and_one_better() -> None:
    """A lower end of exactly 0 on few differing runs: the gate may still promote a policy that
    is never worse on any run (no resampling can make it worse), and only that one."""

    def runs(values: list[float]) -> RunValues:
        v = np.asarray(values)
        return RunValues(ips=v, dr=v, weight=np.ones(v.size), support=np.full(v.size, "exact"))

    base = [0.2] * 60
    better_on_two = [*base[:58], 0.5, 0.6]
    ev = LoggedEvaluation(
        dp=None,  # type: ignore[arg-type]  # dominance reads the per-run figures only
        lam=0.1,
        groups=np.asarray([f"g{i}" for i in range(60)]),
        runs={
            "champion": runs(base),
            "a": runs(better_on_two),
            "b": runs([*better_on_two[:-3], 0.19, 0.5, 0.6]),  # better on two, worse on one
            "same": runs(base),
        },
    )
    assert ev.difference("a", "champion")[1][0] == 0.0  # the interval cannot tell
    assert ev.dominates("a", "champion")
    assert not ev.dominates("b", "champion") and not ev.dominates("same", "champion")
