"""The success floor by default (issue 34): no policy that loses more than a point of success ships.

On these synthetic runs at λ 2 the best learned policy buys value with ~2 points of success
in cross-validation: without a floor it ships; with the default floor it is refused, the
heuristic chosen inside the floor ships, and the card and the summary say why.
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


@pytest.fixture(scope="module")
def traces() -> list[Trace]:
    return synth_traces(160, seed=3)


@pytest.fixture(scope="module")
def unfloored(traces: list[Trace]) -> PolicyLearner:
    return PolicyLearner(objective=Objective(lam=2.0), floors=None, **FAST).fit(traces)


@pytest.fixture(scope="module")
def floored(traces: list[Trace]) -> PolicyLearner:
    return PolicyLearner(objective=Objective(lam=2.0), **FAST).fit(traces)


def _success_loss(learner: PolicyLearner, name: str) -> float:
    return floor_losses(learner.dp_, learner.cv_replays_[name], learner.cv_["lambda"])["success"][0]


def test_without_a_floor_the_learned_policy_trades_success_for_cost(unfloored: PolicyLearner) -> None:
    """The premise: these runs tempt a learner; were they not, the next test would prove nothing."""
    assert unfloored.manifest_.kind == "model", unfloored.notes_
    assert _success_loss(unfloored, "learned") > DEFAULT_SUCCESS_FLOOR
    assert unfloored.guard_["success_floor"] is None


def test_the_default_floor_refuses_it_and_ships_a_policy_inside(floored: PolicyLearner) -> None:
    guard = floored.guard_
    assert guard["success_floor"] == DEFAULT_SUCCESS_FLOOR
    assert guard["learned_within_floors"] is False
    assert guard["learned_success_loss"] > DEFAULT_SUCCESS_FLOOR
    assert floored.manifest_.kind == "heuristic"
    assert any("does not ship" in n and "success by" in n for n in floored.notes_), floored.notes_
    # what ships keeps the floor on the figures it was chosen by
    assert guard["heuristic_within_floors"] is True
    assert guard["heuristic_success_loss"] <= DEFAULT_SUCCESS_FLOOR + 1e-9
    assert floored.cv_["best_heuristic"] in floored.cv_["family_ranking"]["values"]


def test_a_loose_floor_lets_the_same_model_ship(traces: list[Trace]) -> None:
    loose = PolicyLearner(objective=Objective(lam=2.0), floors=Floors(success=0.5), **FAST).fit(traces)
    assert loose.manifest_.kind == "model", loose.notes_
    assert loose.guard_["learned_within_floors"] is True


def test_the_card_and_the_command_say_what_the_floor_did(traces: list[Trace], tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(t.model_dump_json(exclude_none=True) + "\n" for t in traces))
    common = ["--lambda", "2", "--folds", "3", "--method", "behavior", "--no-progress"]

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
    assert json.loads((tmp_path / "off" / "manifest.json").read_text())["kind"] == "model"
    assert "Off (`--max-success-loss 0`)" in (tmp_path / "off" / "MODEL_CARD.md").read_text()
