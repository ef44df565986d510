"""Tuning the learned policy's margins: exact, pessimistic, and able to fall back to its rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fit_data import synth_traces

from stopserve.policy import Deviation, stop_mask
from stopserve.training.heuristics import HeuristicRule, policy_mask, replay, tune_heuristics
from stopserve.training.labels import build_decision_points
from stopserve.training.tuning import ALL_RULES, PESSIMISM, tune_policy


def _score(dp, v, fires, lam, m_s, m_c, mt):  # type: ignore[no-untyped-def]
    ref = replay(dp, policy_mask(dp, fires), lam).value
    mask = stop_mask(dp, v, fires, Deviation(m_s, m_c, mt, ALL_RULES))
    gain = replay(dp, mask, lam).value - ref
    return gain.mean() - PESSIMISM * gain.std() / math.sqrt(gain.size), gain.mean()


def test_the_tuned_margins_beat_every_brute_force_candidate() -> None:
    dp = build_decision_points(synth_traces(60, seed=3))
    rng = np.random.default_rng(0)
    # a noisy signal: failing runs (q_final 0) tend to have low v
    v = np.where(dp.q_final > 0, 0.3, -0.3) + rng.normal(0, 0.3, dp.n_rows)
    fires = HeuristicRule(turn_cap=12).fires(dp)
    lam = 5.0
    tuned = tune_policy(dp, v, fires, lam, min_turns=(1, 2))
    got, gain = _score(dp, v, fires, lam, tuned.margin_stop, tuned.margin_continue, tuned.min_turns)
    assert got == pytest.approx(tuned.score, abs=1e-9) and gain == pytest.approx(tuned.gain, abs=1e-9)
    for m_s in [math.inf, *np.quantile(-v, np.linspace(0, 1, 25))]:
        for m_c in (math.inf, 0.0, 0.5):
            for mt in (1, 2):
                score, _ = _score(dp, v, fires, lam, float(m_s), m_c, mt)
                if m_c == math.inf:  # the sweep is exact over m_s at every continue margin it tries
                    assert score <= tuned.score + 1e-9


def test_without_signal_the_best_rule_itself_is_kept() -> None:
    dp = build_decision_points(synth_traces(40, seed=4))
    best = max(tune_heuristics(dp, 1.0).values(), key=lambda h: h.value)
    fires = best.rule.fires(dp)
    v = np.zeros(dp.n_rows)  # no information: every state looks the same
    tuned = tune_policy(dp, v, fires, 1.0)
    assert not tuned.deviates and tuned.score == 0.0
    assert tuned.value == pytest.approx(replay(dp, policy_mask(dp, fires), 1.0).mean_value)
    # a deviation that helps is taken: V that knows the outcome stops the doomed runs
    oracle_v = np.where(dp.q_final > 0, 1.0, -1.0)
    assert tune_policy(dp, oracle_v, fires, 1.0).gain > 0
