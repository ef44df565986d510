"""Replays batch-predict the learned boosters and still answer exactly as ``decide`` alone.

The trainer's and ``stopserve evaluate``'s replays pass each decision point's row of one
batch prediction to ``Policy.decide(raw=...)``; a row whose live features differ from the
decision points' matrix is scored by ``decide`` itself. Checked on the shipped default
model over real MINT runs (``examples/mint-sample``, Apache-2.0) and on learned policies
of every method over synthetic runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fit_data import synth_traces

from stopserve.importers import IMPORTERS
from stopserve.inference import Forest
from stopserve.objective import Objective
from stopserve.policy import Policy
from stopserve.trace import Trace
from stopserve.training.evaluate import _Fixed
from stopserve.training.fit import PolicyLearner
from stopserve.training.labels import build_decision_points
from stopserve.training.replay import replay_decide, replay_stops

ROOT = Path(__file__).resolve().parents[2]
FAST: dict[str, Any] = {"folds": 3, "max_rounds": 40, "n_boot": 200}


@pytest.fixture(scope="module")
def mint() -> list[Trace]:
    traces = list(IMPORTERS["mint"](ROOT / "examples" / "mint-sample"))
    assert len(traces) >= 30
    return traces


@pytest.fixture(scope="module")
def default_model() -> Policy:
    return Policy.load(ROOT / "models" / "default", engine="lightgbm")


@pytest.fixture(scope="module")
def learned() -> dict[str, Policy]:
    traces = synth_traces(160, seed=3)
    out = {}
    for method in ("behavior", "optimal"):
        # no success floor: these tests need a learned model to replay, whatever it trades
        learner = PolicyLearner(objective=Objective(lam=2.0), method=method, floors=None, **FAST).fit(traces)
        assert learner.manifest_.kind == "model", learner.notes_
        out[method] = learner.policy()
    return out


class _Counting:
    """Counts single-row predictions (``Forest.raw_one``) while installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        original = Forest.raw_one

        def counted(forest: Forest, x: Any) -> Any:
            self.calls += 1
            return original(forest, x)

        monkeypatch.setattr(Forest, "raw_one", counted)


def test_batch_scores_are_the_single_row_scores_bit_for_bit(
    default_model: Policy, learned: dict[str, Policy], mint: list[Trace]
) -> None:
    for policy, traces in ((default_model, mint), *((p, synth_traces(20, seed=5)) for p in learned.values())):
        X = build_decision_points(traces).X
        batch = policy.raw_rows(X)
        single = np.array([policy._forest.raw_one(x) for x in policy.columns(X)])  # type: ignore[union-attr]
        assert batch.shape == single.shape
        assert batch.tobytes() == single.tobytes()


def test_the_default_model_replays_the_same_stops_without_a_single_row_predict(
    default_model: Policy, mint: list[Trace], monkeypatch: pytest.MonkeyPatch
) -> None:
    dp = build_decision_points(mint, cost_unit=default_model.cost_unit)
    counting = _Counting(monkeypatch)
    pf = [_Fixed(default_model, Objective(cost_share=share)) for share in (0.05, 0.3, 1.0, 3.0)]
    alone = replay_stops(mint, dp.offsets, lambda i: pf)
    by_decide = counting.calls
    batched = replay_decide(mint, dp, lambda i: pf)
    assert by_decide > len(mint)
    assert counting.calls == by_decide  # the batched replay predicted no single row
    np.testing.assert_array_equal(batched, alone)
    assert (alone >= 0).any() and (alone < 0).any()  # stops and runs to the end: not a trivial check


def test_learned_policies_of_every_method_replay_the_same_stops(
    learned: dict[str, Policy], monkeypatch: pytest.MonkeyPatch
) -> None:
    traces = synth_traces(60, seed=21)
    dp = build_decision_points(traces)
    # a different policy per trace, as the folds' replays: each scores only its own traces' rows
    policies = list(learned.values())

    def pf(i: int) -> list[Any]:
        return [policies[i % 2]]

    counting = _Counting(monkeypatch)
    for lam in (0.0, 0.5, 2.0, 8.0):
        alone = replay_stops(traces, dp.offsets, pf, objective=Objective(lam=lam))
        by_decide = counting.calls
        batched = replay_decide(traces, dp, pf, objective=Objective(lam=lam))
        assert counting.calls == by_decide > 0
        np.testing.assert_array_equal(batched, alone)


def test_a_row_whose_features_differ_is_scored_by_decide(
    learned: dict[str, Policy], monkeypatch: pytest.MonkeyPatch
) -> None:
    traces = synth_traces(40, seed=8)
    dp = build_decision_points(traces)
    policy = learned["behavior"]
    alone = replay_stops(traces, dp.offsets, lambda i: [policy], objective=Objective(lam=2.0))
    # a matrix that is wrong on every other row: those rows must not take the batch's scores
    wrong = dp.X.copy()
    wrong[::2] += 1.0
    counting = _Counting(monkeypatch)
    got = replay_stops(traces, dp.offsets, lambda i: [policy], objective=Objective(lam=2.0), X=wrong)
    np.testing.assert_array_equal(got, alone)
    ends = np.where(alone[0] >= 0, alone[0], dp.offsets[1:] - 1)
    even = sum(int(np.sum(np.arange(a, b + 1) % 2 == 0)) for a, b in zip(dp.offsets[:-1], ends, strict=True))
    # the odd rows took the batch's scores, the even ones were scored by decide (less a net's stops)
    assert even - len(traces) <= counting.calls <= even
    assert counting.calls > 0
