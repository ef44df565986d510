"""The scenarios through raw HTTP (httpx), against the default model with no configuration."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from scenario_runs import SCENARIOS, check, drive, summary
from servers import LiveServer

from stopserve.safety import DEFAULT_MAX_SECONDS, DEFAULT_MAX_TURNS
from stopserve.trace import Event


def http_decide(server: LiveServer, run_id: str, **extra: Any) -> Any:
    """A ``decide`` that POSTs the events and nothing else (no budget, no lambda, no safety)."""
    client = httpx.Client(base_url=server.url, timeout=10.0)
    run_id = f"{run_id}-{uuid.uuid4().hex[:8]}"  # a fresh run each time: event ids are per run

    def decide(events: Sequence[Event]) -> dict[str, Any]:
        body = {"events": [e.dump() for e in events], **extra}
        response = client.post(f"/v1/runs/{run_id}/decide", json=body)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    return decide


def test_the_default_model_is_served_with_the_default_nets_and_rules(default_server: LiveServer) -> None:
    info = httpx.get(default_server.url + "/v1/model", timeout=10.0).json()
    nets = info["safety"]
    assert nets["max_turns"] == DEFAULT_MAX_TURNS and nets["max_seconds"] == DEFAULT_MAX_SECONDS
    assert nets["loop"]["enabled"] is True and nets["loop"]["repeated_action_observation"] >= 2
    assert nets["quality_met"] == 1.0 and nets.get("quality_channel", "quality") == "quality"
    manifest = info["manifest"]
    # no hidden quality target: the base rule holds no reward threshold below 1.0
    assert manifest["base_rule"]["config"].get("quality_met") is None, manifest["base_rule"]["text"]
    # the default may not overrule the loop detector or quality_met, and stops on evidence only
    assert set(manifest["overrules"]) <= {"rule", "proposed"} and manifest["stop_on"] == "evidence"


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(default_server: LiveServer, name: str) -> None:
    scenario = SCENARIOS[name]
    answers = drive(scenario.steps(), http_decide(default_server, f"http-{name}"), scenario.limit)
    check(scenario, answers)
    assert all(a["degraded"] is False for a in answers), summary(answers)


def test_a_turn_is_an_agent_step_and_a_reward_is_not(default_server: LiveServer) -> None:
    """``max_turns: 10`` with a reward after every step fires at step 10, not 5; a decide call
    carrying only a reward is no step."""
    decide = http_decide(default_server, "http-turns", safety={"max_turns": 10})
    scenario = SCENARIOS["rising_reward_03"]
    answers = drive(scenario.steps(), decide, 30)
    assert [a["turn"] for a in answers] == list(range(1, len(answers) + 1)), summary(answers)
    last = answers[-1]
    assert len(answers) == 10 and last["safety_net"] == "max_turns" and last["limit"] == "turns", summary(
        answers
    )
    only_reward = http_decide(default_server, "http-reward-only")
    first = only_reward(
        [Event(id="a", t=0.0, type="tool_use", agent="x"), Event(id="b", t=1.0, type="return", agent="x")]
    )
    second = only_reward([Event(id="c", t=2.0, type="reward", agent="verifier", value=0.2)])
    assert first["turn"] == second["turn"] == 1
