"""The success floor by default (issue 34): no policy trades success for pennies.

On these synthetic runs the best learned policy gives up ~2 points of success in
cross-validation. At λ 0.5 what it saves is worth less than that: the default floor
refuses it, the heuristic chosen inside the floor ships, and the card and the summary say
why. At λ 2 what it saves pays for the loss twice over (it would still beat the logged runs
were cost worth half as much): the objective asked for that trade, and it ships.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fit_data import synth_traces

from stopserve.objective import Objective
from stopserve.trace import Trace
from stopserve.training.fit import PolicyLearner
from stopserve.training.tuning import DEFAULT_SUCCESS_FLOOR, Floors, floor_losses

ROOT = Path(__file__).resolve().parents[2]
FAST: dict[str, Any] = {"folds": 3, "max_rounds": 40, "n_boot": 200, "method": "behavior"}
#: where the learned policy's saving is worth less than the success it loses, and where more
CHEAP, DEAR = 0.5, 2.0


@pytest.fixture(scope="module")
def traces() -> list[Trace]:
    return synth_traces(160, seed=3)


def _fit(traces: list[Trace], lam: float, **kw: Any) -> PolicyLearner:
    return PolicyLearner(objective=Objective(lam=lam), **FAST, **kw).fit(traces)


@pytest.fixture(scope="module")
def cheap_unfloored(traces: list[Trace]) -> PolicyLearner:
    return _fit(traces, CHEAP, floors=None)


@pytest.fixture(scope="module")
def cheap(traces: list[Trace]) -> PolicyLearner:
    return _fit(traces, CHEAP)


@pytest.fixture(scope="module")
def dear(traces: list[Trace]) -> PolicyLearner:
    return _fit(traces, DEAR)


def _losses(learner: PolicyLearner, name: str = "learned") -> dict[str, float]:
    got = floor_losses(learner.dp_, learner.cv_replays_[name], learner.cv_["lambda"])
    return {what: loss for what, (loss, _) in got.items()}


def test_the_learned_policy_loses_success_for_less_than_it_is_worth(cheap_unfloored: PolicyLearner) -> None:
    """The premise: these runs tempt a learner; were they not, the next test would prove nothing."""
    loss = _losses(cheap_unfloored)
    assert loss["success"] > DEFAULT_SUCCESS_FLOOR
    assert -loss["value"] < loss["success"]  # the value gained does not pay for it twice over
    assert loss["unpaid"] == loss["success"]
    assert cheap_unfloored.guard_["success_floor"] is None


def test_the_default_floor_refuses_it_and_ships_a_policy_inside(cheap: PolicyLearner) -> None:
    guard = cheap.guard_
    assert guard["success_floor"] == DEFAULT_SUCCESS_FLOOR
    assert guard["learned_within_floors"] is False
    assert guard["learned_success_loss"] > DEFAULT_SUCCESS_FLOOR
    assert cheap.manifest_.kind == "heuristic"
    assert any("does not ship" in n and "success by" in n for n in cheap.notes_), cheap.notes_
    # what ships keeps the floor on the figures it was chosen by
    assert guard["heuristic_within_floors"] is True
    assert guard["heuristic_success_loss"] <= DEFAULT_SUCCESS_FLOOR + 1e-9
    assert cheap.cv_["best_heuristic"] in cheap.cv_["family_ranking"]["values"]


def test_a_loss_the_saving_pays_for_twice_over_ships(dear: PolicyLearner) -> None:
    loss = _losses(dear)
    assert loss["success"] > DEFAULT_SUCCESS_FLOOR  # more than the floor ...
    assert -loss["value"] >= loss["success"]  # ... bought with at least as much value
    assert dear.guard_["learned_within_floors"] is True
    assert dear.manifest_.kind == "model", dear.notes_


def test_a_loose_floor_lets_the_refused_model_in(traces: list[Trace]) -> None:
    loose = _fit(traces, CHEAP, floors=Floors(success=0.5))
    assert loose.guard_["learned_within_floors"] is True


def test_the_card_and_the_command_say_what_the_floor_did(traces: list[Trace], tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(t.model_dump_json(exclude_none=True) + "\n" for t in traces))
    common = ["--lambda", "0.25", "--folds", "3", "--method", "behavior", "--no-progress"]

    def train(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "stopserve", "train", str(path), "-o", str(out), *common, *extra]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)

    # a floor of 0.1 point: on these runs the learned model loses more, whatever the input order
    done = train(tmp_path / "floored", "--max-success-loss", "0.001")
    assert done.returncode == 0, done.stderr
    assert "floors (--max-success-loss, --max-value-loss): success 0.001" in done.stderr
    assert "outside: refused" in done.stderr
    card = (tmp_path / "floored" / "MODEL_CARD.md").read_text()
    assert "## Success floor" in card and "**outside: refused**" in card
    assert json.loads((tmp_path / "floored" / "manifest.json").read_text())["kind"] == "heuristic"

    off = train(tmp_path / "off", "--max-success-loss", "0")
    assert off.returncode == 0, off.stderr
    assert json.loads((tmp_path / "off" / "manifest.json").read_text())["guard"]["success_floor"] is None
    assert "Off (`--max-success-loss 0`)" in (tmp_path / "off" / "MODEL_CARD.md").read_text()


def test_on_run_to_cap_logs_the_floor_is_kept_against_the_behaviors_own_stop() -> None:
    """A run-to-cap log goes on past where its logging policy stopped; the floor is kept against
    that stop (``metrics.behavior_stop_index``), what the logging policy got, not the cap's."""
    import numpy as np

    from stopserve.training.labels import build_decision_points
    from stopserve.training.simulate import simulate

    capped = [Trace.model_validate(t) for t in simulate(60, seed=4, run_to_cap=True, optimal_lambda=0.1)]
    logged = [Trace.model_validate(t) for t in simulate(60, seed=4)]  # the same runs, cut at that stop
    dp = build_decision_points(capped)
    own = build_decision_points(logged)
    assert not np.array_equal(dp.trace_q_behavior, dp.trace_q_final)  # the cap changed outcomes
    np.testing.assert_allclose(dp.trace_q_behavior, own.trace_q_final)
    np.testing.assert_allclose(dp.trace_c_behavior, own.trace_c_final)
    # a log without the annotation: its own end is the behavior's stop
    np.testing.assert_array_equal(own.trace_q_behavior, own.trace_q_final)
    np.testing.assert_array_equal(own.trace_c_behavior, own.trace_c_final)


def test_a_strict_floor_refuses_even_a_loss_the_saving_pays_for(
    traces: list[Trace], dear: PolicyLearner
) -> None:
    """``--strict-floor``: the trade the last test let ship is refused, whatever it saves."""
    strict = _fit(traces, DEAR, floors=Floors(success=DEFAULT_SUCCESS_FLOOR, paid=False))
    loss = _losses(strict)
    assert loss["success"] > DEFAULT_SUCCESS_FLOOR  # the same temptation as without it
    assert strict.guard_["success_floor_strict"] is True and dear.guard_["success_floor_strict"] is False
    assert strict.guard_["learned_within_floors"] is False
    assert strict.manifest_.kind == "heuristic"
    assert any("success 0.01 strict" in n for n in strict.notes_), strict.notes_
    # what ships keeps the floor outright, not paid for
    assert strict.guard_["heuristic_success_loss"] <= DEFAULT_SUCCESS_FLOOR + 1e-9
    assert not strict.guard_["heuristic_success_paid"]
