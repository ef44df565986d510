"""Tests of the one featurizer (stopserve.features)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from stopserve.errors import TraceValidationError
from stopserve.features import FEATURE_NAMES, RunState
from stopserve.trace import Budget, Event


def ev(i: int, kind: str, **kw: Any) -> Event:
    data: dict[str, Any] = {"id": f"e{i}", "t": float(kw.pop("t", i)), "type": kind, "agent": "a"}
    data.update(kw)
    return Event.model_validate(data)


def feat(state: RunState, name: str) -> float:
    return float(state.features()[FEATURE_NAMES.index(name)])


def test_names_unique_and_vector_length() -> None:
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES)
    s = RunState()
    x = s.features()
    assert x.dtype == np.float64 and x.shape == (len(FEATURE_NAMES),)


def test_basic_progress_and_spend() -> None:
    s = RunState(topology="harness", budget=Budget(max_turns=10, max_tokens=1000))
    s.fold(ev(0, "tool_use", tokens=100, usd=0.5))
    s.fold(ev(1, "return", error=True))
    s.fold(ev(2, "tool_use", tokens=300))
    s.fold(ev(3, "return"))
    assert s.turn == 2 and s.n_events == 4 and s.tokens == 400 and s.usd == 0.5
    assert feat(s, "budget_share_turns") == pytest.approx(0.2)
    assert feat(s, "budget_share_tokens") == pytest.approx(0.4)
    assert math.isnan(feat(s, "budget_share_usd"))
    assert feat(s, "tokens_last_turn") == 300
    assert feat(s, "errors_total") == 1 and feat(s, "errors_consecutive") == 0
    assert feat(s, "topology_harness") == 1.0 and feat(s, "topology_debate") == 0.0


def test_retried_event_ids_are_skipped() -> None:
    s = RunState()
    assert s.fold(ev(0, "return", tokens=5))
    assert not s.fold(ev(0, "return", tokens=5))
    assert s.seen("e0") and not s.seen("e1")
    assert s.n_events == 1 and s.tokens == 5


def test_time_going_backwards_is_rejected_before_any_change() -> None:
    s = RunState()
    s.fold(ev(0, "return", t=5))
    with pytest.raises(TraceValidationError, match="cannot be folded") as info:
        s.fold(ev(1, "return", t=4))
    assert "time goes backwards" in str(info.value) and "e1" in str(info.value)
    assert s.n_events == 1 and not s.seen("e1")
