"""The sequential gate's confidence sequence (``stopserve.training.sequential``): valid over rounds.

The differences are a stop rule's per-run true value differences on simulator runs (what the
gate's DR figure equals on runs read exactly from the log), shifted to the mean a test needs,
so the shapes are those a deployment shows: a third of the runs alike, a skewed tail.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from logged_runs import rule_dir, true_value

from stopserve.model_store import ModelStore
from stopserve.policy import Policy
from stopserve.training.sequential import ALPHA, Evidence, describe, e_value, lower_bound
from stopserve.training.simulate import simulate

LAM = 0.2
FLOOR = 1.0 + LAM * 3.2  # 1 + lam · the largest final cost of these runs (3.13 ktokens)


@pytest.fixture(scope="module")
def differences(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """Per-run differences of a rule stopping at reward 0.4 against one stopping at 0.5, centred at 0."""
    root = tmp_path_factory.mktemp("seq")
    champion = Policy.load(rule_dir(root / "champion", "rule-0.5", 0.5))
    candidate = Policy.load(rule_dir(root / "candidate", "rule-0.4", 0.4))
    twins = simulate(1500, seed=7, topology="centralized", run_to_cap=True, optimal_lambda=0.1)
    d = np.array([true_value(candidate, t, lam=LAM) - true_value(champion, t, lam=LAM) for t in twins])
    assert d.min() > -FLOOR + 0.1 and 0.05 < d.std() < 0.2 and (d == 0).mean() > 0.2
    return d - d.mean()


def _sequences(d: np.ndarray, mean: float, *, seeds: int, rounds: int, per_round: int) -> list[Evidence]:
    """``seeds`` deployments, each ``rounds`` rounds of ``per_round`` runs drawn from ``d + mean``."""
    rng = np.random.default_rng(2023)
    out = []
    for s in range(seeds):
        ev = Evidence.start("champion", "candidate")
        for r in range(rounds):
            x = rng.choice(d, size=per_round) + mean
            ev.add([f"{s}-{r}-{i}" for i in range(per_round)], x, floor=FLOOR)
            if ev.passed:
                break
        out.append(ev)
    return out


def test_a_challenger_no_better_is_promoted_at_most_alpha_of_the_time_over_all_rounds(
    differences: np.ndarray,
) -> None:
    """Type-I error over 30 rounds, looked at after every one: at most alpha (Ville), not 30 · alpha."""
    at_zero = _sequences(differences, 0.0, seeds=400, rounds=30, per_round=50)
    rate = np.mean([ev.passed for ev in at_zero])
    assert rate <= ALPHA
    # a naive gate, a fresh one-sided 95% bound on each round's runs, passes far more often
    rng = np.random.default_rng(5)
    naive = np.mean(
        [
            any(
                (x := rng.choice(differences, size=50)).mean() - 1.645 * x.std(ddof=1) / math.sqrt(50) > 0
                for _ in range(30)
            )
            for _ in range(400)
        ]
    )
    assert naive > 3 * ALPHA
    worse = _sequences(differences, -0.005, seeds=200, rounds=30, per_round=50)
    assert not any(ev.passed for ev in worse)
    # and the lower bound, read after every round, stays below the truth (the running intersection)
    assert all(ev.lower is not None and ev.lower <= -0.005 for ev in worse)


def test_a_small_gain_is_found_as_the_rounds_add_up(differences: np.ndarray) -> None:
    sd = float(differences.std())
    gain = 0.015
    # too small for a round of 50: its one-sided 95% bound is about gain − 1.645 · sd / √50 < 0
    assert gain < 1.645 * sd / math.sqrt(50)
    found = _sequences(differences, gain, seeds=40, rounds=60, per_round=50)
    assert np.mean([ev.passed for ev in found]) > 0.9
    rounds = [ev.rounds for ev in found if ev.passed]
    assert 3 <= np.median(rounds) <= 40
    for ev in found:
        if ev.passed:
            lower = ev.lower
            assert lower is not None and 0 < lower < gain + 0.01  # promoted: its lower bound above 0


def test_the_lower_bound_and_the_e_value_agree() -> None:
    rng = np.random.default_rng(1)
    for mean in (-0.05, 0.0, 0.02, 0.1):
        x = np.clip(rng.normal(mean, 0.1, size=800), -1.0, None)
        assert (e_value(x, floor=1.0) >= 1 / ALPHA) == (lower_bound(x, floor=1.0) > 0)
    assert lower_bound([], floor=1.0) == -1.0 and e_value([], floor=1.0) == 1.0


def test_runs_already_counted_are_not_counted_twice() -> None:
    ev = Evidence.start("champion-v1", "candidate-v2")
    assert ev.add(["r1", "r2", "r1"], [0.1, -0.05, 0.3], floor=1.5) == 2  # r1 once, its first figure
    assert ev.add(["r2", "r3"], [9.0, 0.2], floor=99.0) == 1  # r2 was counted; the floor is kept
    assert ev.run_ids == ["r1", "r2", "r3"] and ev.differences == [0.1, -0.05, 0.2] and ev.floor == 1.5
    assert ev.rounds == 2
    assert ev.add(["r3", "r1"], [0.0, 0.0], floor=1.5) == 0 and ev.rounds == 2  # no new run: no round
    # below the floor: clipped up to it, and counted as clipped
    assert ev.add(["r4"], [-4.0], floor=1.5) == 1 and ev.differences[-1] == -1.5 and ev.clipped == 1


def test_the_evidence_is_kept_in_the_store_and_reset_by_a_promotion(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    assert store.sequential() is None
    ev = Evidence.start("champion-v1", "candidate-v2")
    ev.add(["r1", "r2"], [0.1, 0.2], floor=1.5)
    store.save_sequential(ev.to_dict())
    back = Evidence.from_dict(store.sequential() or {})
    assert back == ev and back.matches("champion-v1", "candidate-v2")
    assert not back.matches("champion-v2", "candidate-v2") and not back.matches("champion-v1", "other")
    assert not list((tmp_path / "store").glob(".sequential*"))  # written beside, renamed: nothing left over
    summary = {**back.summary(), "added": 2, "supported": True}
    assert summary["runs"] == 2 and summary["rounds"] == 1 and summary["needed"] == pytest.approx(20.0)
    assert "2 held-out runs over 1 round," in describe(summary) and "e-value" in describe(summary)
    # unreadable or foreign: none
    (tmp_path / "store" / "sequential.json").write_text("[1, 2]")
    assert store.sequential() is None
    assert Evidence.from_dict({"run_ids": ["a"], "differences": []}) is None
    store.save_sequential(ev.to_dict())
    model = rule_dir(tmp_path / "model", "rule-0.3", 0.3)
    store.promote(model, version="rule-0.3", previous=None, evidence={})
    assert store.sequential() is None  # another champion: the evidence was about the one before
