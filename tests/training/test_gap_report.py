"""stopserve.training.gap_report: exact per-topology gap closed on run-to-cap simulator traces."""

from __future__ import annotations

import pytest

from stopserve.errors import TrainingError
from stopserve.policy import Policy
from stopserve.safety import SafetyConfig
from stopserve.trace import Trace, is_decision_point
from stopserve.training.gap_report import gap_report
from stopserve.training.simulate import simulate

LAM = 0.1


def _traces(**kw: object) -> list[Trace]:
    return [Trace.model_validate(t) for t in simulate(24, seed=5, optimal_lambda=LAM, **kw)]  # type: ignore[arg-type]


def test_stop_at_first_decision_point_is_valued_by_truncation() -> None:
    traces = _traces(run_to_cap=True)
    report = gap_report(Policy.safety_only(SafetyConfig(max_turns=1)), traces, LAM)
    pooled = report["pooled"]
    assert pooled["n"] == len(traces)
    expected_opt = sum(float(t.metrics["optimal_value"]) for t in traces) / len(traces)
    assert pooled["optimal"] == pytest.approx(expected_opt)
    # stopping at the first decision point: no answer yet (q = 0), cost = tokens so far
    first = []
    for t in traces:
        tokens = 0
        for ev in t.events:
            tokens += ev.tokens or 0
            if is_decision_point(ev):
                break
        first.append(-LAM * tokens / 1000.0)
    assert pooled["learned"] == pytest.approx(sum(first) / len(first))
    assert set(report) - {"pooled"} <= {t.topology for t in traces}
    # the optimum is never beaten on average by stopping at once
    assert pooled["learned"] <= pooled["optimal"] + 1e-9


def test_refuses_behavior_logged_traces() -> None:
    with pytest.raises(TrainingError, match="run-to-cap"):
        gap_report(Policy.safety_only(), _traces(), LAM)
