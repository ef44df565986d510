from __future__ import annotations

import random
import sys
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "training"))
from fit_data import synth_trace, synth_traces

from stopserve.artifacts import save_model_dir
from stopserve.errors import ModelIntegrityError
from stopserve.features import FEATURE_NAMES, RunState
from stopserve.policy import CompiledForest, Policy, StopDecision
from stopserve.safety import SafetyConfig
from stopserve.trace import is_decision_point
from stopserve.training.fit import fit_policy
from stopserve.training.labels import build_decision_points

NO_LOOP = SafetyConfig.from_dict({"loop": False})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dp = build_decision_points(synth_traces(160, seed=1))
    result = fit_policy(dp, lam=2.0, folds=3, max_rounds=30, early_stopping=5)
    assert result.manifest["kind"] == "model", result.warnings
    return result.save(tmp_path_factory.mktemp("policy") / "model")


def _fold_to_decision_points(policy: Policy, seed: int, **kw: object) -> list[tuple[RunState, StopDecision]]:
    trace = synth_trace(999, random.Random(seed), success=False)
    state = RunState()
    out = []
    for ev in trace.events:
        state.fold(ev)
        if is_decision_point(ev):
            out.append((state, policy.decide(state, **kw)))  # type: ignore[arg-type]
    return out


def test_compiled_forest_matches_lightgbm_including_nan() -> None:
    rng = np.random.default_rng(0)
    X = rng.random((600, 6))
    X[rng.random(X.shape) < 0.15] = np.nan
    X[:, 2] = np.where(rng.random(600) < 0.3, 0.0, X[:, 2])
    y = (np.nan_to_num(X[:, 0], nan=0.9) + np.nan_to_num(X[:, 2]) > 0.8).astype(float)
    common = {"verbose": -1, "num_threads": 1, "num_leaves": 15, "max_depth": 5}
    b1 = lgb.train({**common, "objective": "cross_entropy"}, lgb.Dataset(X, y), 25)
    b2 = lgb.train({**common, "objective": "regression"}, lgb.Dataset(X, X[:, 1] * 3), 25)
    forest = CompiledForest({"a": b1.dump_model(), "b": b2.dump_model()}, 6)
    Xt = rng.random((200, 6))
    Xt[rng.random(Xt.shape) < 0.25] = np.nan
    Xt[:, 2] = np.where(rng.random(200) < 0.3, 0.0, Xt[:, 2])
    ref = np.c_[b1.predict(Xt, raw_score=True), b2.predict(Xt, raw_score=True)]
    np.testing.assert_allclose(forest.raw_batch(Xt, chunk=64), ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.array([forest.raw_one(x) for x in Xt]), ref, rtol=0, atol=1e-12)


def test_decide_agrees_with_predict_batch(model_dir: Path) -> None:
    policy = Policy.load(model_dir)
    assert policy.kind == "model" and policy.model_version
    points = []
    trace = synth_trace(7, random.Random(3), success=False)
    state = RunState()
    for ev in trace.events:
        state.fold(ev)
        if is_decision_point(ev):
            points.append((state.features(), policy.decide(state, lam=2.0, safety=NO_LOOP)))
    X = np.vstack([x for x, _ in points])
    batch = policy.predict_batch(X, 2.0)
    for i, (_, d) in enumerate(points):
        assert d.safety_net is None and not d.degraded
        assert d.v_stop == pytest.approx(batch["v_stop"][i], abs=1e-9)
        assert d.q_continue == pytest.approx(batch["q_continue"][i], abs=1e-9)
        assert d.cost_to_go == pytest.approx(batch["cost_to_go"][i], abs=1e-9)
        if d.turn >= 2:
            assert (d.action == "stop") == bool(batch["stop"][i])
    # a doomed, looping run is stopped by the model, for lack of progress
    assert any(d.action == "stop" and d.reason == "no_progress" for _, d in points)


def test_min_turns_vetoes_model_stops(model_dir: Path) -> None:
    policy = Policy.load(model_dir)
    strict = SafetyConfig(min_turns=1000)
    for _, d in _fold_to_decision_points(policy, 1, safety=strict, lam=100.0):
        assert d.action == "continue"


def test_safety_nets_win_and_are_never_explored(model_dir: Path) -> None:
    policy = Policy.load(model_dir)
    capped = SafetyConfig(max_turns=3)
    decisions = _fold_to_decision_points(policy, 2, safety=capped, lam=0.0, epsilon=0.9, rng=random.Random(0))
    stops = [d for _, d in decisions if d.turn >= 3]
    assert stops and all(d.action == "stop" and d.safety_net == "max_turns" for d in stops)
    assert all(d.limit == "turns" and d.reason == "budget_exhausted" and d.propensity == 1.0 for d in stops)
    assert all(d.finalize for d in stops)


def test_epsilon_exploration_turns_model_stops_into_continues(model_dir: Path) -> None:
    policy = Policy.load(model_dir)
    rng = random.Random(0)
    decisions = [
        d
        for seed in range(20)
        for _, d in _fold_to_decision_points(policy, seed, lam=100.0, epsilon=0.3, rng=rng, safety=NO_LOOP)
        if d.v_stop is not None and d.turn >= 2 and d.v_stop < -policy.tau(100.0)
    ]
    assert decisions
    explored = [d for d in decisions if d.action == "continue"]
    stopped = [d for d in decisions if d.action == "stop"]
    assert all(d.propensity == pytest.approx(0.3) for d in explored)
    assert all(d.propensity == pytest.approx(0.7) for d in stopped)
    assert 0.15 < len(explored) / len(decisions) < 0.45


def test_lambda_is_a_dial(model_dir: Path) -> None:
    policy = Policy.load(model_dir)
    cheap = _fold_to_decision_points(policy, 5, lam=0.0, safety=NO_LOOP)
    dear = _fold_to_decision_points(policy, 5, lam=1000.0, safety=NO_LOOP)
    first = lambda ds: next((d.turn for _, d in ds if d.action == "stop"), 10**6)  # noqa: E731
    assert first(dear) <= first(cheap)
    assert first(dear) < 10**6


def test_safety_only_policy() -> None:
    policy = Policy.safety_only(SafetyConfig(max_turns=4))
    assert policy.kind == "none" and policy.model_version is None
    decisions = _fold_to_decision_points(policy, 0)
    assert all(d.v_stop is None for _, d in decisions)
    assert [d.action for _, d in decisions if d.turn < 4] == ["continue"] * 3
    state = RunState()
    trace = synth_trace(1, random.Random(0), success=True)
    state.fold(trace.events[0])
    state.fold(trace.events[1])
    assert policy.decide(state, proposed_stop=True).action == "continue"  # before min_turns
    state.fold(trace.events[2])
    state.fold(trace.events[3])
    d = policy.decide(state, proposed_stop=True)
    assert d.action == "stop" and d.reason == "information_complete" and d.to_dict()["finalize"] is True


def test_heuristic_directory_decides_with_its_nets(tmp_path: Path) -> None:
    manifest = {
        "kind": "heuristic",
        "method": "heuristic",
        "feature_names": list(FEATURE_NAMES),
        "default_lambda": 0.2,
        "safety": SafetyConfig(max_turns=2).to_dict(),
    }
    policy = Policy.load(save_model_dir(tmp_path / "h", manifest))
    assert policy.kind == "heuristic"
    decisions = _fold_to_decision_points(policy, 0)
    assert decisions[1][1].action == "stop" and decisions[1][1].safety_net == "max_turns"


def test_bad_safety_in_manifest_is_refused(tmp_path: Path) -> None:
    manifest = {"kind": "heuristic", "feature_names": list(FEATURE_NAMES), "safety": {"max_turns": -3}}
    with pytest.raises(ModelIntegrityError, match="max_turns"):
        Policy.load(save_model_dir(tmp_path / "h", manifest))


def test_predict_batch_checks_shape(model_dir: Path) -> None:
    policy = Policy.load(model_dir)
    with pytest.raises(ModelIntegrityError, match="shape"):
        policy.predict_batch(np.zeros((3, 2)), 0.2)
    with pytest.raises(ModelIntegrityError, match="learned model"):
        Policy.safety_only().predict_batch(np.zeros((1, len(FEATURE_NAMES))), 0.2)


def test_tau_grid_interpolates(model_dir: Path) -> None:
    policy = Policy.load(model_dir)
    grid = policy.manifest["tau_grid"]
    lams, taus = grid["lambda"], grid["tau"]
    for lam, tau in zip(lams, taus, strict=True):
        expected = float("inf") if tau is None else tau
        assert policy.tau(lam) == pytest.approx(expected)
    assert policy.tau(policy.default_lambda) == pytest.approx(
        float("inf") if policy.manifest["tau"] is None else policy.manifest["tau"]
    )


def test_scalar_interpolation_matches_numpy() -> None:
    from stopserve.policy import _interp1

    rng = np.random.default_rng(3)
    xs = np.sort(rng.random(12))
    xs[5] = xs[4]  # isotonic knots repeat
    ys = np.sort(rng.random(12))
    for x in [-1.0, 2.0, *rng.random(200).tolist(), float(xs[4])]:
        assert _interp1(x, xs.tolist(), ys.tolist()) == pytest.approx(float(np.interp(x, xs, ys)))
