"""One StopDecision, one mapping to the wire and one to the trace."""

from __future__ import annotations

import dataclasses
import math

from stopserve.api import DecideResponse
from stopserve.decision import StopDecision, to_trace, to_wire
from stopserve.trace import Decision

FULL = StopDecision(
    action="stop",
    reason="no_progress",
    v_stop=-0.25,
    q_continue=0.5,
    q_stop=0.75,
    cost_to_go=3.0,
    turn=9,
    safety_net=None,
    pattern="repeated_action_observation",
    finalize=True,
    model_version="m-1",
    propensity=0.8,
    rule="loop_detector",
    message="the value of going on -0.25 < minus the stop margin 0.1",
    proposal="refused",
)


def test_the_wire_form_is_every_field_of_the_answer() -> None:
    wire = to_wire(FULL)
    # every DecideResponse field but what the request gives (run id, event counts), and every decision field
    answer_only = set(DecideResponse.model_fields) - {"run_id", "events_accepted", "events_ignored"}
    assert set(wire) == answer_only == {f.name for f in dataclasses.fields(StopDecision)}
    back = DecideResponse.model_validate({"run_id": "r", **wire})
    assert {k: getattr(back, k) for k in wire} == wire
    odd = to_wire(dataclasses.replace(FULL, v_stop=math.inf, cost_to_go=math.nan))
    assert odd["v_stop"] is None and odd["cost_to_go"] is None  # JSON has no infinity


def test_the_trace_form_is_a_format_v1_decision_and_only_what_is_set() -> None:
    record = to_trace(FULL)
    assert record == {
        "action": "stop",
        "propensity": 0.8,
        "reason": "no_progress",
        "v_stop": -0.25,
        "model_version": "m-1",
    }
    assert Decision.model_validate(record).v_stop == -0.25
    explored = to_trace(dataclasses.replace(FULL, action="continue", reason=None, explored=True, v_stop=None))
    assert explored == {"action": "continue", "propensity": 0.8, "explored": True, "model_version": "m-1"}
    # the service's answer maps the same way (the client's spool records it)
    answer = DecideResponse.model_validate({"run_id": "r", **to_wire(FULL)})
    assert to_trace(answer) == record
