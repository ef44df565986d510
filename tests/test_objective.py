"""What a unit of cost is worth: one type, checked once, the default defined once."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stopserve.errors import ConfigError
from stopserve.features import RunState
from stopserve.objective import (
    DEFAULT_COST_SHARE,
    DEFAULT_OBJECTIVE,
    Objective,
    cost_budget,
    cost_so_far,
    event_cost,
)
from stopserve.trace import Event


@pytest.mark.parametrize(
    ("kw", "path", "words"),
    [
        ({"lam": 0.1, "cost_share": 0.3}, "lambda", "not both"),
        ({}, "lambda", "give lambda or a cost share"),
        ({"lam": -1.0}, "lambda", ">= 0"),
        ({"cost_share": math.inf}, "cost_share", "finite"),
        ({"cost_share": math.nan}, "cost_share", "finite"),
        ({"lam": "0.1"}, "lambda", "a number"),
        ({"lam": 0.1, "unit": "tokens"}, "unit", "is not one of"),
    ],
)
def test_a_bad_objective_says_which_field_in_library_words(
    kw: dict[str, object], path: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        Objective(**kw)  # type: ignore[arg-type]
    issue = caught.value.issues[0]
    assert issue.path == path and words in issue.message
    assert "--" not in str(caught.value)  # no command-line flag in a library message


def test_of_is_none_without_either_and_equal_objectives_are_one() -> None:
    assert Objective.of(None, None) is None
    assert Objective.of(1, None) == Objective(lam=1.0) and hash(Objective(lam=1)) == hash(Objective(lam=1.0))
    assert Objective(cost_share=DEFAULT_COST_SHARE) == DEFAULT_OBJECTIVE and DEFAULT_COST_SHARE == 0.3
    with pytest.raises(ConfigError, match="not both"):
        Objective.of(0.1, 0.3)


def test_json_and_wire_forms() -> None:
    lam = Objective(lam=0.2, unit="usd")
    assert Objective.from_dict(lam.to_dict()) == lam and lam.to_dict() == {"lambda": 0.2, "unit": "usd"}
    assert lam.to_wire() == {"lambda": 0.2} and Objective(cost_share=0.5).to_wire() == {"cost_share": 0.5}
    with pytest.raises(ConfigError, match="lamda: unknown field"):
        Objective.from_dict({"lamda": 0.2})
    with pytest.raises(ConfigError, match=r"m\.json: .*lambda"):
        Objective.from_dict({"lambda": "x"}, source="m.json")


def test_a_unit_is_kept_or_refused() -> None:
    assert Objective(cost_share=0.3).in_unit("usd").unit == "usd"
    assert Objective(lam=0.1, unit="usd").in_unit("usd").unit == "usd"
    with pytest.raises(ConfigError, match="per usd, but the costs are counted in ktokens"):
        Objective(lam=0.1, unit="usd").in_unit("ktokens")


def test_a_share_resolves_to_lambda_with_a_mean_cost() -> None:
    assert Objective(cost_share=0.3).lam_at(10.0) == pytest.approx(0.03)
    assert Objective(cost_share=0.3).lam_at(0.0) == 0.0
    assert Objective(lam=0.7).lam_at(10.0) == 0.7


def test_the_weight_rises_with_what_cost_is_worth() -> None:
    k, turn, cost = np.array([0.0, 2.0, 9.0]), np.array([1, 3, 4]), np.array([1.0, 6.0, 8.0])
    for mean in (None, 5.0):
        low, _ = Objective(cost_share=0.1).weight(k, turn, cost, mean_cost=mean)
        high, _ = Objective(cost_share=0.9).weight(k, turn, cost, mean_cost=mean)
        assert np.all(high >= low)
    w, ctg = Objective(lam=2.0).weight(9.0, 4, 8.0, mean_cost=None)
    assert (w, ctg) == (36.0, 18.0)


def test_cost_by_unit_is_dispatched_in_one_place() -> None:
    state = RunState()
    state.fold(Event(id="a", t=0.0, type="tool_use", agent="x", tokens=2500, usd=0.25))
    state.fold(Event(id="b", t=4.0, type="return", agent="x"))
    assert [cost_so_far(state, u) for u in ("ktokens", "usd", "seconds")] == [2.5, 0.25, 4.0]
    assert event_cost("ktokens", tokens=1500, usd=0.1, seconds=3.0) == 1.5
    assert event_cost("seconds", tokens=1500, usd=0.1, seconds=3.0) == 3.0
    assert cost_budget("ktokens", 1.2) == ("max_tokens", 1200) and cost_budget("usd", 2.0) == ("max_usd", 2.0)
    with pytest.raises(ConfigError, match="cost unit"):
        cost_so_far(state, "tokens")
