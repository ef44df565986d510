"""The served policy: nets, base rule, margins, the value of continuing, monotone cost weight."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent / "training"))
from fit_data import synth_trace, synth_traces

from stopserve.artifacts import save_model_dir
from stopserve.decision import StopDecision
from stopserve.errors import ModelIntegrityError
from stopserve.features import FEATURE_NAMES, RunState
from stopserve.manifest import LEGACY_OVERRULES, BaseRule, Margins
from stopserve.objective import Objective
from stopserve.policy import Policy
from stopserve.safety import DEFAULT_SAFETY, LoopConfig, SafetyConfig
from stopserve.trace import Trace, is_decision_point
from stopserve.training.fit import PolicyLearner
from stopserve.training.heuristics import HeuristicRule, TunedHeuristic
from stopserve.training.labels import build_decision_points

NO_LOOP = SafetyConfig.from_dict({"loop": False})
FAST: dict[str, Any] = {
    "folds": 3,
    "max_rounds": 40,
    "n_boot": 200,
    "floors": None,
}  # no success floor: these tests need a learned model


@pytest.fixture(scope="module")
def learned() -> dict[str, Policy]:
    traces = synth_traces(160, seed=1)
    out = {}
    for method in ("behavior", "optimal"):
        learner = PolicyLearner(objective=Objective(lam=2.0), method=method, **FAST).fit(traces)
        assert learner.manifest_.kind == "model", learner.notes_
        out[method] = learner.policy()
    per_run = PolicyLearner(
        objective=Objective(cost_share=0.3), cost_scale="per_run", method="behavior", **FAST
    ).fit(traces)
    out["per_run"] = per_run.policy()
    return out


def _worth(kw: dict[str, Any]) -> dict[str, Any]:
    """``lam=`` / ``cost_share=`` keywords as ``decide``'s objective."""
    lam, share = kw.pop("lam", None), kw.pop("cost_share", None)
    return {**kw, "objective": Objective.of(lam, share)}


def _walk(policy: Policy, trace: Trace, **kw: Any) -> list[StopDecision]:
    kw = _worth(kw)
    state = RunState()
    out = []
    for ev in trace.events:
        state.fold(ev)
        if is_decision_point(ev):
            out.append(policy.decide(state, proposed_stop=ev.type == "stop" and bool(ev.proposed), **kw))
    return out


def _first_stop(decisions: list[StopDecision]) -> int:
    return next((d.turn for d in decisions if d.action == "stop"), 10**6)


def test_decide_agrees_with_the_vectorised_values(learned: dict[str, Policy]) -> None:
    traces = synth_traces(20, seed=9)
    dp = build_decision_points(traces)
    for name, policy in learned.items():
        kw = {"cost_share": 0.3} if name == "per_run" else {"lam": 2.0}
        raw = policy.raw_batch(dp.X)
        v, _, _ = policy.values(raw, dp.turn, dp.c_raw, Objective(**kw))
        got = []
        for tr in traces:
            got += [d.v_stop for d in _walk(policy, tr, safety=NO_LOOP, **kw)]
        np.testing.assert_allclose(np.asarray(got, dtype=float), v, rtol=1e-6, atol=1e-9)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    success=st.booleans(),
    lams=st.tuples(st.floats(0, 20), st.floats(0, 20)),
    share=st.tuples(st.floats(0, 3), st.floats(0, 3)),
)
def test_the_stop_never_moves_later_when_cost_weighs_more(
    learned: dict[str, Policy],
    seed: int,
    success: bool,
    lams: tuple[float, float],
    share: tuple[float, float],
) -> None:
    trace = synth_trace(seed, random.Random(seed), success=success)
    lo, hi = sorted(lams)
    for name in ("behavior", "optimal"):
        policy = learned[name]
        assert _first_stop(_walk(policy, trace, lam=hi)) <= _first_stop(_walk(policy, trace, lam=lo))
    s_lo, s_hi = sorted(share)
    for name in ("behavior", "per_run"):
        policy = learned[name]
        assert _first_stop(_walk(policy, trace, cost_share=s_hi)) <= _first_stop(
            _walk(policy, trace, cost_share=s_lo)
        )


def test_cost_weight_modes() -> None:
    # absolute: lambda times the cost still to come (turn-equivalents times the mean cost per turn)
    w, ctg = Objective(lam=0.5).weight(3.0, 4, 8.0, mean_cost=None)
    assert ctg == pytest.approx(6.0) and w == pytest.approx(3.0)
    # a share with a known mean behavior cost: lambda = share / mean
    w, _ = Objective(cost_share=0.3).weight(3.0, 4, 8.0, mean_cost=10.0)
    assert w == pytest.approx(0.03 * 6.0)
    # per run: the share of this run's expected total still to come, whatever the scale
    w1, _ = Objective(cost_share=0.3).weight(3.0, 4, 8.0, mean_cost=None)
    w2, _ = Objective(cost_share=0.3).weight(3.0, 4, 8e6, mean_cost=None)
    assert w1 == w2 == pytest.approx(0.3 * 3 / 7)
    arr, _ = Objective(lam=0.5).weight(
        np.array([3.0, 0.0]), np.array([4, 0]), np.array([8.0, 0.0]), mean_cost=None
    )
    assert arr.tolist() == pytest.approx([3.0, 0.0])


def test_min_turns_vetoes_model_stops(learned: dict[str, Policy]) -> None:
    strict = SafetyConfig(min_turns=1000, loop=None)
    for seed in range(5):
        trace = synth_trace(seed, random.Random(seed), success=False)
        assert all(
            d.action == "continue" for d in _walk(learned["behavior"], trace, safety=strict, lam=100.0)
        )


def test_safety_nets_win_and_are_never_explored(learned: dict[str, Policy]) -> None:
    capped = SafetyConfig(max_turns=3)
    trace = synth_trace(2, random.Random(2), success=False)
    decisions = _walk(learned["behavior"], trace, safety=capped, lam=0.0, epsilon=0.9, rng=random.Random(0))
    stops = [d for d in decisions if d.turn >= 3]
    assert stops and all(d.action == "stop" and d.safety_net == "max_turns" for d in stops)
    assert all(d.limit == "turns" and d.reason == "budget_exhausted" and d.propensity == 1.0 for d in stops)


def test_epsilon_exploration_turns_model_stops_into_continues(learned: dict[str, Policy]) -> None:
    policy = learned["behavior"]
    rng = random.Random(0)
    model_stops = []
    for seed in range(30):
        trace = synth_trace(seed, random.Random(seed), success=False)
        for d in _walk(policy, trace, lam=100.0, epsilon=0.3, rng=rng, safety=NO_LOOP):
            if d.propensity < 1.0:
                model_stops.append(d)
    assert model_stops
    explored = [d for d in model_stops if d.action == "continue"]
    assert all(d.propensity == pytest.approx(0.3) for d in explored)
    assert all(d.propensity == pytest.approx(0.7) for d in model_stops if d.action == "stop")
    assert 0.1 < len(explored) / len(model_stops) < 0.5


@pytest.mark.parametrize(
    ("rule", "safety", "reason"),
    [
        (HeuristicRule(turn_cap=3, loop=False, quality=False), NO_LOOP, "budget_exhausted"),  # the base rule
        # the loop detector (stopping at its thresholds: these runs' loops rarely outlast the nudges)
        (HeuristicRule(loop=True, quality=False), SafetyConfig(loop=LoopConfig(nudge=0)), "loop_detected"),
    ],
)
def test_exploration_covers_rule_stops_never_a_budget(
    rule: HeuristicRule, safety: SafetyConfig, reason: str
) -> None:
    """Every stop but a budget's is one a retrained model may overrule: it is explored too."""
    policy = TunedHeuristic("h", rule, math.nan, "usd", 0.0).policy(safety)
    stops = []
    rng = random.Random(5)
    for seed in range(40):
        trace = synth_trace(seed, random.Random(seed), success=False)
        stops += [d for d in _walk(policy, trace, epsilon=0.25, rng=rng) if d.propensity < 1.0]
    kept = [d for d in stops if d.action == "stop"]
    explored = [d for d in stops if d.action == "continue"]
    assert kept and explored
    assert all(d.reason == reason and d.propensity == pytest.approx(0.75) and not d.explored for d in kept)
    assert all(d.explored and d.propensity == pytest.approx(0.25) for d in explored)
    assert all((d.message or "").startswith("explored: ") for d in explored)
    # a budget of the same run is never explored: the same cap as a net
    capped = SafetyConfig(max_turns=3, loop=None)
    for seed in range(10):
        trace = synth_trace(seed, random.Random(seed), success=False)
        for d in _walk(Policy.safety_only(capped), trace, epsilon=0.9, rng=rng):
            if d.turn >= 3:
                assert d.action == "stop" and d.safety_net == "max_turns" and d.propensity == 1.0


def test_an_explored_proposal_goes_on_and_says_so() -> None:
    policy = Policy.safety_only()
    state = RunState()
    for ev in synth_trace(1, random.Random(0), success=True).events[:2]:
        state.fold(ev)
    d = policy.decide(state, proposed_stop=True, epsilon=1.0 - 1e-12, rng=random.Random(0))
    assert d.action == "continue" and d.explored and d.proposal == "overruled"
    d = policy.decide(state, proposed_stop=True, epsilon=1e-12, rng=random.Random(0))
    assert d.action == "stop" and d.reason == "information_complete" and d.propensity == pytest.approx(1.0)


def test_safety_only_policy_uses_the_default_nets() -> None:
    policy = Policy.safety_only()
    assert policy.kind == "none" and policy.model_version is None and policy.safety == DEFAULT_SAFETY
    trace = synth_trace(1, random.Random(0), success=True)
    decisions = _walk(policy, trace)
    assert all(d.v_stop is None and d.action == "continue" for d in decisions)
    state = RunState()
    assert policy.decide(state, proposed_stop=True).action == "continue"  # no decision point yet
    for ev in trace.events[:2]:
        state.fold(ev)
    d = policy.decide(state, proposed_stop=True)
    assert d.action == "stop" and d.reason == "information_complete" and d.to_dict()["finalize"] is True


def test_heuristic_directory_stops_by_its_rule(tmp_path: Path) -> None:
    rule = HeuristicRule(turn_cap=2).base_config("usd")
    config = {k: v for k, v in rule.to_dict().items() if k != "min_turns"}
    manifest = {
        "kind": "heuristic",
        "method": "heuristic",
        "base_rule": {"name": "turn_cap", "text": "turn cap 2", "config": config},
    }
    policy = Policy.load(save_model_dir(tmp_path / "h", manifest))
    assert policy.kind == "heuristic"
    decisions = _walk(policy, synth_trace(0, random.Random(0), success=False))
    stop = decisions[1]
    assert stop.action == "stop" and stop.rule == "turn_cap" and stop.safety_net is None
    assert stop.reason == "budget_exhausted" and stop.limit == "turns"


def test_the_continue_margin_overrules_the_base_rule(learned: dict[str, Policy]) -> None:
    base = learned["behavior"]
    rule = HeuristicRule(turn_cap=1).base_config("usd")
    policy = Policy(
        kind="model",
        safety=NO_LOOP,
        manifest=base.manifest.updated(base_rule=BaseRule(config=rule), margins=Margins(continue_=-1e9)),
        rule=rule,
        boosters=base._forest._boosters,  # type: ignore[union-attr]
    )
    trace = synth_trace(3, random.Random(3), success=True)
    # V is always above -1e9: every base stop is overruled, and the model never stops on its own
    assert all(d.action == "continue" for d in _walk(policy, trace, lam=0.0))


def test_a_manifest_cannot_switch_the_default_nets_off(tmp_path: Path) -> None:
    manifest = {
        "kind": "heuristic",
        "safety": {"loop": False, "quality_met": None},
        "format": "stopserve.model/1",
    }
    policy = Policy.load(save_model_dir(tmp_path / "h", manifest))
    state = RunState()
    from stopserve.trace import Event

    loop = LoopConfig()
    for i in range(loop.repeated_action_observation + loop.nudge):  # past the threshold and its nudges
        state.fold(Event(id=f"a{i}", t=float(i), type="tool_use", agent="x", content_ref="same"))
        state.fold(Event(id=f"r{i}", t=float(i), type="return", agent="x", content_ref="out"))
    d = policy.decide(state)
    assert d.action == "stop" and d.safety_net == "loop_detector"


def test_bad_manifests_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelIntegrityError, match="max_turns"):
        Policy.load(save_model_dir(tmp_path / "h", {"kind": "heuristic", "safety": {"max_turns": -3}}))
    with pytest.raises(ModelIntegrityError, match="rule"):
        Policy.load(
            save_model_dir(tmp_path / "r", {"kind": "heuristic", "base_rule": {"config": {"max_turn": 3}}})
        )
    import lightgbm as lgb

    x = np.random.default_rng(0).normal(size=(50, len(FEATURE_NAMES)))
    booster = lgb.train(
        {"objective": "regression", "verbose": -1, "num_leaves": 4},
        lgb.Dataset(x, label=x[:, 0], feature_name=list(FEATURE_NAMES)),
        2,
    )
    text = booster.model_to_string()
    names = {"feature_names": list(FEATURE_NAMES)}
    with pytest.raises(ModelIntegrityError, match="method"):
        Policy.load(
            save_model_dir(tmp_path / "m", {"kind": "model", "method": "magic", **names}, {"g": text})
        )
    with pytest.raises(ModelIntegrityError, match="missing k"):
        Policy.load(
            save_model_dir(tmp_path / "k", {"kind": "model", "method": "behavior", **names}, {"g": text})
        )


def test_raw_batch_needs_a_model() -> None:
    with pytest.raises(ModelIntegrityError, match="learned model"):
        Policy.safety_only().raw_batch(np.zeros((1, len(FEATURE_NAMES))))


def test_a_model_stop_names_the_pattern_the_run_was_repeating(learned: dict[str, Policy]) -> None:
    from stopserve.trace import Event

    base = learned["behavior"]
    policy = Policy(
        kind="model",
        safety=DEFAULT_SAFETY,
        manifest=base.manifest.updated(
            base_rule=None,
            margins=Margins(stop=0.0),
            gates=base.manifest.gates.model_copy(update={"model_min_turns": 1}),
        ),
        boosters=base.boosters,
    )
    state = RunState()
    for i in range(3):
        state.fold(Event(id=f"a{i}", t=float(i), type="tool_use", agent="x", content_ref="same", usd=0.01))
        state.fold(Event(id=f"r{i}", t=float(i), type="return", agent="x", content_ref="out"))
    d = policy.decide(state, objective=Objective(lam=1e6))  # cost weighs so much that the model stops at once
    assert d.action == "stop" and d.reason == "no_progress" and d.safety_net is None
    assert d.pattern == "repeated_action_observation"


# --------------------------------------------------------------------------- nets and rules (issue 27)


def _looping_state(n: int = 8) -> RunState:
    from stopserve.trace import Event

    state = RunState()
    for i in range(n):
        state.fold(Event(id=f"a{i}", t=float(i), type="tool_use", agent="x", content_ref="same"))
        state.fold(Event(id=f"r{i}", t=float(i) + 0.5, type="return", agent="x", content_ref="out"))
    return state


def _keep_going(learned: dict[str, Policy], overrules: list[str] | None) -> Policy:
    base = learned["behavior"]
    manifest = base.manifest.updated(
        margins=Margins(continue_=-1e9), overrules=tuple(LEGACY_OVERRULES if overrules is None else overrules)
    )
    return Policy(
        kind="model",
        safety=DEFAULT_SAFETY,
        manifest=manifest,
        rule=None,
        boosters=base._forest._boosters,  # type: ignore[union-attr]
    )


def test_a_model_may_overrule_the_loop_rule_only_where_its_manifest_says_so(
    learned: dict[str, Policy],
) -> None:
    state = _looping_state()
    d = _keep_going(learned, ["loop", "quality_met", "rule", "proposed"]).decide(
        state, objective=Objective(lam=0.0)
    )
    assert d.action == "continue" and "overruled" in (d.message or "")
    legacy = _keep_going(learned, None).decide(
        state, objective=Objective(lam=0.0)
    )  # a model trained before the split
    assert legacy.action == "stop" and legacy.safety_net == "loop_detector"
    fixed = _keep_going(learned, ["rule", "proposed"]).decide(state, objective=Objective(lam=0.0))
    assert fixed.action == "stop" and fixed.reason == "loop_detected"


def test_budgets_always_win_even_over_a_model_that_overrules_every_rule(learned: dict[str, Policy]) -> None:
    policy = _keep_going(learned, ["loop", "quality_met", "rule", "proposed"])
    state = _looping_state(12)
    d = policy.decide(state, objective=Objective(lam=0.0), safety=SafetyConfig(max_turns=10))
    assert d.action == "stop" and d.safety_net == "max_turns" and d.limit == "turns"
    unbounded = policy.decide(state, objective=Objective(lam=0.0))
    assert unbounded.action == "continue"
    from stopserve.safety import DEFAULT_MAX_TURNS

    many = _looping_state(DEFAULT_MAX_TURNS)  # the default turn limit bounds every run
    d = policy.decide(many, objective=Objective(lam=0.0))
    assert d.action == "stop" and d.safety_net == "max_turns"


def test_the_default_model_does_not_overrule_the_orchestrators_own_loop_verdict() -> None:
    from stopserve.settings import default_model_dir
    from stopserve.trace import Event

    model_dir = default_model_dir()
    if model_dir is None:
        pytest.skip("no shipped default model")
    policy = Policy.load(model_dir)
    stuck, going = RunState(), RunState()
    for i in range(3):
        for state, progress in ((stuck, {"made_progress": False, "in_loop": True}), (going, None)):
            state.fold(Event(id=f"d{i}", t=2.0 * i, type="delegate", agent="orchestrator", to="surfer"))
            state.fold(
                Event.model_validate(
                    {"id": f"r{i}", "t": 2.0 * i + 1, "type": "return", "agent": "s", "progress": progress}
                )
            )
    d = policy.decide(stuck)
    assert d.action == "stop" and d.safety_net == "orchestrator_ledger" and d.reason == "loop_detected"
    assert d.pattern == "in_loop" and "is_in_loop" in (d.message or "")
    assert policy.decide(going).safety_net != "orchestrator_ledger"
