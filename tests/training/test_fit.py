from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from fit_data import synth_trace, synth_traces

from stopserve.artifacts import load_model_dir
from stopserve.cli import main
from stopserve.errors import TrainingError
from stopserve.policy import Policy
from stopserve.trace import Trace, write_traces
from stopserve.training.fit import _ipw, _next_stop_value, fit_policy
from stopserve.training.heuristics import replay
from stopserve.training.labels import build_decision_points

FAST = {"folds": 3, "max_rounds": 30, "early_stopping": 5}


@pytest.fixture(scope="module")
def dp():  # type: ignore[no-untyped-def]
    return build_decision_points(synth_traces(160, seed=2))


@pytest.fixture(scope="module")
def fitted(dp):  # type: ignore[no-untyped-def]
    return fit_policy(dp, lam=2.0, **FAST)


def test_learned_policy_beats_heuristics_on_a_learnable_signal(dp, fitted) -> None:  # type: ignore[no-untyped-def]
    result = fitted
    pol = result.cv["policies"]
    assert result.manifest["kind"] == "model" and result.chosen == "learned"
    assert pol["learned"]["value"] > pol["behavior"]["value"]
    assert pol["learned"]["value"] > pol[result.cv["best_heuristic"]]["value"]
    assert pol["learned"]["value"] <= pol["oracle"]["value"] + 1e-12
    assert set(result.models) == {"q", "s", "k", "d"}
    assert result.cv["q_auc"] > 0.8  # failing runs show their errors and repetitions
    # repetition / error features carry the signal
    top = list(result.importance)[:10]
    assert any(("error" in n or "ident" in n or "ref" in n or "same" in n) for n in top), top
    m = result.manifest
    assert m["training_data"]["n_traces"] == 160 and len(m["training_data"]["sha256"]) == 64
    assert m["guard"]["shipped"] == "learned model"
    assert m["models"]["q"]["calibration"] is not None  # binary outcome: calibrated
    assert result.timings["lightgbm_train_s"] > 0


def test_cv_value_is_honest_replay(dp, fitted) -> None:  # type: ignore[no-untyped-def]
    # the reported behavior value is the replay of "never stop", the oracle the hindsight best
    result = fitted
    never = replay(dp, np.zeros(dp.n_rows, dtype=bool), 2.0)
    assert result.cv["policies"]["behavior"]["value"] == pytest.approx(never.mean_value)
    best = np.maximum.reduceat(dp.r_stop(2.0), dp.offsets[:-1]).mean()
    assert result.cv["policies"]["oracle"]["value"] == pytest.approx(best)


def test_saved_model_round_trips(dp, fitted, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = fitted
    out = result.save(tmp_path / "m")
    art = load_model_dir(out)
    assert art.manifest["default_lambda"] == 2.0 and art.manifest["method"] == "behavior"
    policy = Policy.load(out)
    batch = policy.predict_batch(dp.X, 2.0)
    assert batch["v_stop"].shape == (dp.n_rows,)
    assert (
        "CV" in (out / "MODEL_CARD.md").read_text()
        or "Cross-validated" in (out / "MODEL_CARD.md").read_text()
    )


def test_optimal_method_fits_c_and_serves_it(dp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = fit_policy(dp, lam=2.0, method="optimal", **FAST)
    assert result.manifest["kind"] == "model", result.warnings
    assert "c" in result.models and result.manifest["optimal"]["lambda"] == 2.0
    pol = result.cv["policies"]
    assert pol["learned"]["value"] > pol["behavior"]["value"]
    policy = Policy.load(result.save(tmp_path / "opt"))
    at_opt = policy.predict_batch(dp.X[:50], 2.0)
    other = policy.predict_batch(dp.X[:50], 1.0)
    # at the fitted lambda V = C - S; elsewhere the D - lambda K dial
    assert not np.allclose(at_opt["v_stop"], at_opt["gain"] - 2.0 * at_opt["cost_to_go"])
    np.testing.assert_allclose(other["v_stop"], other["gain"] - other["cost_to_go"])


def test_next_stop_value_matches_brute_force(dp) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    stop = rng.random(dp.n_rows) < 0.2
    got = _next_stop_value(dp, stop, 0.5)
    for i in range(dp.n_traces):
        a, b = dp.offsets[i], dp.offsets[i + 1]
        for t in range(a, b):
            later = [j for j in range(t + 1, b) if stop[j]]
            want = dp.q[later[0]] - 0.5 * dp.c[later[0]] if later else dp.q_final[t] - 0.5 * dp.c_final[t]
            assert got[t] == pytest.approx(want)


def test_all_failures_ship_the_heuristic() -> None:
    # nothing to gain by continuing: stopping at once is best, which a turn cap does exactly;
    # the learned policy cannot beat it, so the guard ships the heuristic and says so
    traces = synth_traces(60, seed=3, success=False)
    result = fit_policy(build_decision_points(traces), lam=1.0, **FAST)
    assert result.manifest["kind"] == "heuristic" and result.models == {}
    assert any("same outcome" in w for w in result.warnings)
    assert any("SHIPPING THE HEURISTIC" in w for w in result.warnings)
    assert result.manifest["safety"]["max_turns"] is not None or result.manifest["safety"].get("max_usd")


def test_all_successes_train() -> None:
    traces = synth_traces(60, seed=4, success=True)
    result = fit_policy(build_decision_points(traces), lam=0.5, **FAST)
    assert any("same outcome" in w for w in result.warnings)
    assert result.manifest["kind"] in ("model", "heuristic")


def test_single_task_falls_back_to_folds_over_traces() -> None:
    rng = random.Random(0)
    traces = [synth_trace(i, rng, task="only__task") for i in range(40)]
    result = fit_policy(build_decision_points(traces), lam=2.0, **FAST)
    assert any("only one group" in w for w in result.warnings)
    assert result.cv["folds"] == 3


def test_too_little_data_is_refused() -> None:
    one = build_decision_points(synth_traces(1))
    with pytest.raises(TrainingError, match="at least 2 traces"):
        fit_policy(one, lam=1.0)
    with pytest.raises(TrainingError, match="folds"):
        fit_policy(build_decision_points(synth_traces(10)), folds=1)
    with pytest.raises(TrainingError, match="method"):
        fit_policy(build_decision_points(synth_traces(10)), method="magic")


def test_missing_costs_fall_back_to_tokens() -> None:
    rng = random.Random(5)
    traces = [synth_trace(i, rng, usd=i % 2 == 0) for i in range(60)]
    dp = build_decision_points(traces)
    assert dp.cost_unit == "ktokens"
    result = fit_policy(dp, **FAST)
    assert result.manifest["default_lambda"] == pytest.approx(0.002)
    assert result.manifest["cost_unit"] == "ktokens"


def test_propensities_below_one_weight_rows() -> None:
    rng = random.Random(6)
    traces = [synth_trace(i, rng, propensity=0.25 if i % 3 == 0 else None) for i in range(60)]
    dp = build_decision_points(traces)
    w = _ipw(dp)
    explored = dp.propensity < 1
    assert explored.any() and w.mean() == pytest.approx(1.0)
    # rows at and after an explored continue weigh 4x the rows before it in the same trace
    i = int(np.flatnonzero(explored)[0])
    assert w[i] == pytest.approx(4 * w[i - 1])
    result = fit_policy(dp, lam=2.0, **FAST)
    assert any("inverse-propensity" in n for n in result.warnings)


def _write(tmp_path: Path, traces: list[Trace], name: str = "runs.jsonl") -> Path:
    path = tmp_path / name
    write_traces(path, traces)
    return path


def test_train_command_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, synth_traces(80, seed=7))
    out = tmp_path / "model"
    code = main(["train", str(path), "-o", str(out), "--lambda", "2", "--folds", "3", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "chosen policy" in err and "best heuristic" in err and "top features" in err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["cv"]["folds"] == 3
    Policy.load(out)


def test_train_command_min_turns_reaches_the_shipped_safety(tmp_path: Path) -> None:
    path = _write(tmp_path, synth_traces(60, seed=7))
    out = tmp_path / "model"
    argv = ["train", str(path), "-o", str(out), "--lambda", "2", "--folds", "3", "--no-progress"]
    assert main([*argv, "--min-turns", "1"]) == 0
    assert Policy.load(out).safety.min_turns == 1


def test_train_command_refuses_traces_without_outcome(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = synth_traces(1)[0].model_copy(update={"rewards": {}})
    path = _write(tmp_path, [trace, *synth_traces(3, seed=1)])
    code = main(["train", str(path), "-o", str(tmp_path / "m"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "no outcome" in err and "Traceback" not in err


def test_tau_tuning_matches_brute_force(dp) -> None:  # type: ignore[no-untyped-def]
    from stopserve.training import fit

    rng = np.random.default_rng(1)
    v = rng.normal(size=dp.n_rows)
    allowed = dp.turn >= 2
    extra = rng.random(dp.n_rows) < 0.02
    tau, value = fit._tune_tau(dp, v, allowed, extra, 0.7)
    base = replay(dp, extra, 0.7).value
    best_score, best_value = 0.0, float(base.mean())
    for h in np.unique(v):
        values = replay(dp, ((v < h + 1e-9) & allowed) | extra, 0.7).value
        gain = values - base
        score = gain.mean() - fit.PESSIMISM * gain.std() / np.sqrt(gain.size)
        if score > best_score + 1e-12:
            best_score, best_value = score, float(values.mean())
    assert value == pytest.approx(best_value)
    if np.isfinite(tau):
        got = replay(dp, ((v < -tau) & allowed) | extra, 0.7).mean_value
        assert got == pytest.approx(value)


def test_traces_without_decision_points_train() -> None:
    # only actions, no returns: each trace gets one row at its last event (labels), and fitting works
    traces = []
    for t in synth_traces(40, seed=8):
        events = [e for e in t.events if e.type != "return"]
        traces.append(t.model_copy(update={"events": events}))
    dp = build_decision_points(traces)
    assert dp.n_rows == 40
    result = fit_policy(dp, lam=1.0, **FAST)
    assert result.manifest["kind"] in ("model", "heuristic")


def test_optimal_tau_per_topology_is_served(dp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from stopserve.artifacts import save_model_dir
    from stopserve.features import FEATURE_NAMES, RunState
    from stopserve.policy import MODEL_STOP_REASON
    from stopserve.trace import is_decision_point

    result = fit_policy(dp, lam=2.0, method="optimal", **FAST)
    manifest = {k: v for k, v in result.manifest.items() if k not in ("format", "files")}
    # debate runs get a tau so high the model never stops them; others keep the pooled tau
    manifest["optimal"] = {**manifest["optimal"], "tau_by_topology": {"debate": 1e9}}
    policy = Policy.load(save_model_dir(tmp_path / "m", manifest, result.models))
    model_stops = {"debate": 0, None: 0}
    for tr in synth_traces(30, seed=4):
        for topo in model_stops:
            state = RunState(topology=topo)
            for ev in tr.events:
                state.fold(ev)
                if is_decision_point(ev) and policy.decide(state, lam=2.0).reason == MODEL_STOP_REASON:
                    model_stops[topo] += 1
    assert model_stops[None] > 0 and model_stops["debate"] == 0
    X = dp.X[:200].copy()
    X[:, FEATURE_NAMES.index("topology_debate")] = 1.0
    assert not policy.predict_batch(X, 2.0)["stop"].any()
