"""What a decision becomes: the answer's fields, the decision-log line, the trace's decision.

The two mappings from :class:`~stopserve.policy.StopDecision` live here, and only here:
:func:`decision_fields` (the answer, ``DecideResponse``'s decision fields, also written
into the decision log) and :func:`trace_decision` (``trace.Decision``, kept with the run
for its trace). :func:`decision_record` is the log line of one call.
"""

from __future__ import annotations

import math
import time
from typing import Any

from stopserve.policy import StopDecision
from stopserve.service.shadow import Challengers, ShadowCall

__all__ = ["decision_fields", "decision_record", "finite", "trace_decision"]


def decision_fields(d: StopDecision) -> dict[str, Any]:
    """The decision's fields of the answer (``DecideResponse``) and of its log line."""
    return {
        "action": d.action,
        "reason": d.reason,
        "v_stop": finite(d.v_stop),
        "q_continue": finite(d.q_continue),
        "q_stop": finite(d.q_stop),
        "cost_to_go": finite(d.cost_to_go),
        "turn": d.turn,
        "safety_net": d.safety_net,
        "limit": d.limit,
        "pattern": d.pattern,
        "finalize": d.finalize,
        "model_version": d.model_version,
        "propensity": d.propensity,
        "explored": d.explored,
        "degraded": d.degraded,
        "rule": d.rule,
        "message": d.message,
        "proposal": d.proposal,
    }


def trace_decision(d: StopDecision) -> dict[str, Any]:
    """The decision as the run's trace keeps it (``trace.Decision``, the fields a retrain reads)."""
    out: dict[str, Any] = {"action": d.action, "propensity": d.propensity}
    if d.explored:
        out["explored"] = True
    if d.reason is not None:
        out["reason"] = d.reason
    if finite(d.v_stop) is not None:
        out["v_stop"] = d.v_stop
    if d.model_version is not None:
        out["model_version"] = d.model_version
    if d.safety_net is not None:
        out["safety_net"] = d.safety_net
    return out


def finite(x: float | None) -> float | None:
    """``x`` as a float, or None where it is missing or not finite (JSON has no inf or NaN)."""
    return None if x is None or not math.isfinite(x) else float(x)


def decision_record(
    run_id: str | None,
    before: dict[str, Any],
    fields: dict[str, Any],
    after: dict[str, Any],
    shadow: list[ShadowCall],
) -> dict[str, Any]:
    """One decision-log line: kind, time and run, ``before`` (seq, event, counts), the decision's
    ``fields``, ``after`` (λ or cost share in force, the proposal), and the challengers' answers."""
    record = {"kind": "decision", "ts": time.time(), "run_id": run_id, **before, **fields, **after}
    if shadow:
        record["challengers"] = Challengers.record(shadow)
    return record
