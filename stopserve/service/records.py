"""The decision-log line of one call: :func:`decision_record`.

The decision's own fields come from the one mapping of a
:class:`~stopserve.decision.StopDecision` to the wire (:func:`stopserve.decision.to_wire`),
the run's trace keeps :func:`stopserve.decision.to_trace`.
"""

from __future__ import annotations

import time
from typing import Any

from stopserve.service.shadow import Challengers, ShadowCall

__all__ = ["decision_record"]


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
