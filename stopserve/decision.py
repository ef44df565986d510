"""One continue-or-stop answer, :class:`StopDecision`, and its two outward forms.

Every answer is made as a :class:`StopDecision` (by :meth:`stopserve.policy.Policy.decide`)
and leaves the core in one of two forms, each made by one function here:

* :func:`to_wire`: the fields of :class:`stopserve.api.DecideResponse` (the HTTP answer,
  also the decision log line): every field, non-finite numbers as ``null``;
* :func:`to_trace`: a format-v1 :class:`stopserve.trace.Decision` (what a logged trace
  records on the event it followed): the action, its propensity, and what is known of why.

A field added to a decision (say a ``nudge``) is added to :class:`StopDecision` and to
these two functions, and nowhere else. The client's spool maps the service's answers with
:func:`to_trace` too (a :class:`~stopserve.api.DecideResponse` has the fields it reads).

>>> d = StopDecision("stop", "loop_detected", None, None, None, None, 7, safety_net="loop_detector")
>>> to_trace(d)
{'action': 'stop', 'propensity': 1.0, 'reason': 'loop_detected', 'safety_net': 'loop_detector'}
>>> to_wire(d)["finalize"], to_wire(d)["turn"]
(False, 7)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

__all__ = ["StopDecision", "TraceDecisionFields", "to_trace", "to_wire"]

Proposal = Literal["accepted", "overruled", "vetoed", "refused"]


@dataclass(frozen=True, slots=True)
class StopDecision:
    """One continue-or-stop answer.

    ``propensity`` is the probability with which ``action`` was chosen (below 1 only
    under ε-exploration; ``explored``: exploration made a stop this continue),
    ``safety_net`` names the part of the safety config that
    fired (a budget, the loop detector, ``quality_met``; its ``limit``/``pattern`` when
    relevant), ``rule`` the policy's base rule that stopped the run, ``message`` says in
    words what fired (or what a model overruled), ``proposal`` what became of a proposed stop
    (``accepted``: the run stops; ``overruled``: a model keeps it going, its value of going on
    clearing its margin; ``vetoed``: before the veto's ``min_turns``; ``refused``: this policy
    does not take proposed stops, its rules and its value decide), ``degraded`` is True when
    the model could not be evaluated and only the nets and the rules decided. ``v_stop`` is the
    value of continuing V (quality units), ``cost_to_go`` the expected cost still to
    come (cost units).
    """

    action: Literal["continue", "stop"]
    reason: str | None
    v_stop: float | None
    q_continue: float | None
    q_stop: float | None
    cost_to_go: float | None
    turn: int
    safety_net: str | None = None
    limit: str | None = None
    pattern: str | None = None
    finalize: bool = False
    model_version: str | None = None
    propensity: float = 1.0
    degraded: bool = False
    rule: str | None = None
    message: str | None = None
    proposal: Proposal | None = None
    explored: bool = False
    nudge: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every field, as plain data (numbers as they are)."""
        return asdict(self)


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def to_wire(d: StopDecision) -> dict[str, Any]:
    """The :class:`~stopserve.api.DecideResponse` fields of ``d`` (all but ``run_id`` and the
    ``events_*`` counts, which the request gives), JSON-ready: a non-finite number is ``null``.

    A plain dict, not the pydantic model: the service answers thousands a second.
    """
    return {
        "action": d.action,
        "reason": d.reason,
        "v_stop": _finite(d.v_stop),
        "q_continue": _finite(d.q_continue),
        "q_stop": _finite(d.q_stop),
        "cost_to_go": _finite(d.cost_to_go),
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
        "nudge": d.nudge,
    }


class TraceDecisionFields(Protocol):
    """What :func:`to_trace` reads: a :class:`StopDecision`, or the service's answer to one."""

    @property
    def action(self) -> Literal["continue", "stop"]: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def v_stop(self) -> float | None: ...
    @property
    def propensity(self) -> float: ...
    @property
    def explored(self) -> bool: ...
    @property
    def model_version(self) -> str | None: ...
    @property
    def safety_net(self) -> str | None: ...


def to_trace(d: TraceDecisionFields) -> dict[str, Any]:
    """The format-v1 ``decision`` of an event (:class:`stopserve.trace.Decision`) for ``d``.

    Only what is set is written (``explored`` and ``safety_net`` are the format's extra
    fields a retrain reads); the JSON of the dict validates as a ``trace.Decision``.
    """
    out: dict[str, Any] = {"action": d.action, "propensity": d.propensity}
    if d.explored:
        out["explored"] = True
    if d.reason is not None:
        out["reason"] = d.reason
    v = _finite(d.v_stop)
    if v is not None:
        out["v_stop"] = d.v_stop
    if d.model_version is not None:
        out["model_version"] = d.model_version
    if d.safety_net is not None:
        out["safety_net"] = d.safety_net
    return out
