"""Helpers shared by the framework integrations: client set-up, clocks, stop texts."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final, TypeVar

from stopserve.api import DecideResponse
from stopserve.client import AsyncStopClient, StopClient
from stopserve.extras import install_hint
from stopserve.objective import Objective
from stopserve.trace import Event, Stop, Topology, is_decision_point

__all__ = [
    "EXTRA_HINT",
    "Outbox",
    "RunClock",
    "integration_client",
    "missing_extra",
    "new_run_id",
    "stop_of",
    "stop_text",
]

ClientT = TypeVar("ClientT", StopClient, AsyncStopClient)

EXTRA_HINT: Final = install_hint("integrations")


def missing_extra(module: str, package: str, exc: ImportError) -> ImportError:
    """The ImportError to raise when a framework is not installed."""
    err = ImportError(f"{module} needs {package}, which is not installed: {EXTRA_HINT} ({exc})")
    err.name = exc.name
    return err


def new_run_id(prefix: str) -> str:
    """A fresh run id (unique across processes)."""
    return f"{prefix}{uuid.uuid4().hex}"


class RunClock:
    """Seconds since a run started, never going backwards (format v1 wants ordered ``t``)."""

    __slots__ = ("_last", "_start_mono", "_start_wall")

    def __init__(self) -> None:
        self._start_mono = time.monotonic()
        self._start_wall: float | None = None
        self._last = 0.0

    def now(self) -> float:
        """Time of an event happening now."""
        return self._clamp(time.monotonic() - self._start_mono)

    def at(self, when: datetime | None) -> float:
        """Time of an event stamped ``when`` (wall clock); the first stamp is t=0."""
        if when is None:
            return self.now()
        stamp = when.timestamp()
        if self._start_wall is None:
            self._start_wall = stamp
        return self._clamp(stamp - self._start_wall)

    def _clamp(self, t: float) -> float:
        t = max(self._last, round(max(t, 0.0), 6))
        self._last = t
        return t


def stop_of(reason: str | None, safety_net: str | None, limit: str | None) -> Stop | None:
    """The trace's ``stop`` record for a decision that said stop."""
    if reason is None:
        return None
    return Stop.model_validate(
        {"reason": reason, "by": "safety_net" if safety_net else "service", "limit": limit}
    )


def integration_client(
    cls: type[ClientT],
    url: str,
    *,
    timeout: float,
    budget: Mapping[str, Any] | None,
    objective: Objective | None,
    safety: Mapping[str, Any] | None,
    topology: Topology | None,
) -> ClientT:
    """The client an integration talks through.

    Without ``safety`` nothing is sent, so the service applies its own nets (the one
    default, :data:`~stopserve.safety.DEFAULT_SAFETY`, plus what its model adds) and the
    local fallback applies ``DEFAULT_SAFETY``. A 4xx answer is logged and decided
    locally instead of raised: a framework run is never crashed by its sidecar.
    """
    return cls(
        url,
        timeout=timeout,
        budget=budget,
        objective=objective,
        safety=safety,
        topology=topology,
        raise_on_client_error=False,
    )


def stop_text(decision: DecideResponse) -> str:
    """One line saying why stopserve stopped a run (what each framework shows as the reason).

    >>> d = DecideResponse(run_id="r", action="stop", reason="loop_detected", turn=4, finalize=True,
    ...                    propensity=1.0, safety_net="loop_detector", pattern="repeated_reply")
    >>> stop_text(d)
    'stopserve: stop (loop_detected), safety net loop_detector (repeated_reply), at turn 4'
    >>> stop_text(d.model_copy(update={"reason": "no_progress", "safety_net": None}))
    'stopserve: stop (no_progress), in a loop (repeated_reply), at turn 4'
    """
    text = f"stopserve: stop ({decision.reason or 'unknown'})"
    if decision.safety_net:
        text += f", safety net {decision.safety_net}"
        if decision.limit:
            text += f" ({decision.limit})"
        if decision.pattern:
            text += f" ({decision.pattern})"
    elif decision.rule:
        text += f", rule {decision.rule}"
    if decision.pattern and not decision.safety_net:
        text += f", in a loop ({decision.pattern})"  # a model stop while a loop is in progress
    text += f", at turn {decision.turn}"
    if decision.degraded:
        text += " [degraded: service unavailable, decided locally]"
    return text


class Outbox:
    """Holds a run's events until a decision point: the service is asked only there.

    A framework's hook often fires a little after a decision point: LangGraph's router
    runs once the model has already asked for the next tool, AutoGen's condition after
    a tool call's summary. The model was trained on states right at decision points
    (``stopserve.trace.is_decision_point``), so :meth:`ready` hands over the events up
    to and including the last decision point and keeps the rest for the next call;
    with no decision point among them there is nothing to ask yet. What is still held
    when the run ends goes with its outcome (:meth:`drain`).

    >>> box = Outbox()
    >>> box.ready([Event(id="1", t=0, type="tool_use", agent="a")]) is None
    True
    >>> [e.id for e in box.ready([Event(id="2", t=1, type="return", agent="a"),
    ...                           Event(id="3", t=2, type="tool_use", agent="a")])]
    ['1', '2']
    >>> [e.id for e in box.drain()]
    ['3']
    """

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: list[Event] = []

    def ready(self, events: Sequence[Event]) -> list[Event] | None:
        """The events to send with a decision now, or ``None`` (no decision point yet)."""
        held = [*self._held, *events]
        last = next((i for i in range(len(held) - 1, -1, -1) if is_decision_point(held[i])), -1)
        self._held = held[last + 1 :]
        return held[: last + 1] if last >= 0 else None

    def drain(self) -> list[Event]:
        """The events still held (and forget them)."""
        out, self._held = self._held, []
        return out
