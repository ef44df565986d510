"""The helpers the integrations share: the outbox, the stop text, the client set-up."""

from __future__ import annotations

import random

import pytest

from stopserve.api import DecideResponse
from stopserve.client import AsyncStopClient, StopClient
from stopserve.integrations._common import Outbox, integration_client, stop_text
from stopserve.safety import DEFAULT_SAFETY
from stopserve.trace import EVENT_TYPES, Event, is_decision_point

DEAD = "http://127.0.0.1:9"


def test_outbox_sends_up_to_the_last_decision_point_and_loses_nothing() -> None:
    rng = random.Random(7)
    types = [t for t in EVENT_TYPES if t != "stop"]
    for _ in range(200):
        box, sent, n = Outbox(), [], 0
        for _ in range(rng.randint(1, 8)):
            batch = []
            for _ in range(rng.randint(0, 4)):
                n += 1
                kind = rng.choice(types)
                value = 0.5 if kind == "reward" else None
                batch.append(Event(id=str(n), t=float(n), type=kind, agent="a", value=value))
            ready = box.ready(batch)
            if ready is None:
                continue
            assert ready and is_decision_point(ready[-1])  # asked only right at a decision point
            sent += ready
        rest = box.drain()
        assert not any(is_decision_point(e) for e in rest)
        assert [e.id for e in sent + rest] == [str(i) for i in range(1, n + 1)]  # in order, once each
        assert box.drain() == []


def decision(**fields: object) -> DecideResponse:
    data = {"run_id": "r", "action": "stop", "turn": 4, "finalize": True, "propensity": 1.0, **fields}
    return DecideResponse.model_validate(data)


def test_stop_text() -> None:
    loop = decision(reason="loop_detected", safety_net="loop_detector", pattern="repeated_reply")
    assert (
        stop_text(loop)
        == "stopserve: stop (loop_detected), safety net loop_detector (repeated_reply), at turn 4"
    )
    budget = decision(reason="budget_exhausted", safety_net="max_turns", limit="turns", degraded=True)
    assert stop_text(budget) == (
        "stopserve: stop (budget_exhausted), safety net max_turns (turns), at turn 4"
        " [degraded: service unavailable, decided locally]"
    )
    rule = decision(reason="quality_met", rule="reward_threshold")
    assert stop_text(rule) == "stopserve: stop (quality_met), rule reward_threshold, at turn 4"
    assert stop_text(decision(reason="no_progress")) == "stopserve: stop (no_progress), at turn 4"


@pytest.mark.parametrize("cls", [StopClient, AsyncStopClient])
def test_integration_client_defaults_come_from_the_one_source(
    cls: type[StopClient] | type[AsyncStopClient],
) -> None:
    client = integration_client(
        cls, DEAD, timeout=0.5, budget=None, objective=None, safety=None, topology=None
    )
    core = client._core
    assert core.safety_given is None  # nothing sent: the service applies its own nets
    assert core.safety == DEFAULT_SAFETY  # the local fallback applies the one default
    assert core.raise_on_client_error is False  # a framework run is never crashed by its sidecar


def test_each_integration_uses_the_defaults_when_given_nothing() -> None:
    for module in ("autogen_agentchat", "langgraph", "agents"):
        pytest.importorskip(module)
    from stopserve.integrations.autogen import StopServeTermination
    from stopserve.integrations.langgraph import StopServeRouter
    from stopserve.integrations.openai_agents import StopServeHooks

    for client in (
        StopServeTermination(DEAD).client,
        StopServeRouter(DEAD).client,
        StopServeHooks(DEAD).client,
    ):
        assert client._core.safety_given is None and client._core.safety == DEFAULT_SAFETY
