"""The scenarios through raw HTTP (httpx), against the default model with no configuration."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from scenario_runs import (
    PRODUCTIVE_TURNS,
    QUALITY_AT,
    QUALITY_WITHIN,
    assert_loop_stop,
    drive,
    productive_reward,
    productive_run,
    quality_run,
    served_reward_thresholds,
    stuck_loop,
    summary,
)
from servers import LiveServer

from stopserve.trace import Event


def http_decide(server: LiveServer, run_id: str) -> Any:
    """A ``decide`` that POSTs the events and nothing else: no budget, no lambda, no safety."""
    client = httpx.Client(base_url=server.url, timeout=10.0)
    run_id = f"{run_id}-{uuid.uuid4().hex[:8]}"  # a fresh run each time: event ids are per run

    def decide(events: Sequence[Event]) -> dict[str, Any]:
        response = client.post(f"/v1/runs/{run_id}/decide", json={"events": [e.dump() for e in events]})
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    return decide


def test_the_default_model_is_served_with_the_default_nets(default_server: LiveServer) -> None:
    info = httpx.get(default_server.url + "/v1/model", timeout=10.0).json()
    nets = info["safety"]
    assert nets["loop"]["enabled"] is True and nets["loop"]["repeated_action_observation"] >= 2
    assert nets["quality_met"] == 1.0 and nets.get("quality_channel", "quality") == "quality"


def test_productive_run_stays_below_the_served_rule(default_server: LiveServer) -> None:
    """The productive run is shaped to stay under the served rule's reward threshold (see
    ``scenario_runs.productive_run``); if a retrained model's rule moved below it, say so here."""
    manifest = httpx.get(default_server.url + "/v1/model", timeout=10.0).json()["manifest"]
    thresholds = served_reward_thresholds(manifest.get("rule"))
    top = productive_reward(PRODUCTIVE_TURNS)
    assert all(top < t for t in thresholds), (
        f"the productive run reaches reward {top} by turn {PRODUCTIVE_TURNS}, at or above the served "
        f"rule's threshold {min(thresholds)} ({manifest.get('rule_text')}): the rule would rightly stop it"
    )


def test_stuck_loop_stops_with_the_loop_pattern(default_server: LiveServer) -> None:
    answers = drive(stuck_loop(), http_decide(default_server, "http-loop"), 40)
    last = assert_loop_stop(answers)
    assert last["safety_net"] == "loop_detector" or last["reason"] == "no_progress"
    assert last["degraded"] is False
    assert last["pattern"] == "repeated_action_observation", summary(answers)


@pytest.mark.parametrize("channel", ["quality", None])
def test_quality_reaching_one_stops_within_two_decision_points(
    default_server: LiveServer, channel: str | None
) -> None:
    answers = drive(quality_run(channel), http_decide(default_server, f"http-quality-{channel}"), 40)
    last = answers[-1]
    assert last["action"] == "stop", summary(answers)
    reached = 2 * QUALITY_AT  # two decision points a turn: the result, then the reward
    assert len(answers) >= QUALITY_AT, f"stopped before the reward reached 1.0:\n{summary(answers)}"
    assert reached <= last["turn"] <= reached + QUALITY_WITHIN, summary(answers)
    assert last["reason"] == "quality_met", summary(answers)


@pytest.mark.parametrize("with_reward", [True, False], ids=["rising-reward", "no-reward"])
def test_productive_run_is_not_stopped_before_turn_20(default_server: LiveServer, with_reward: bool) -> None:
    """New content every turn, no error, 1,500 tokens a turn; the reward (if any) rises from
    0.05 by 0.02 a turn, 0.43 at turn 20: under the default model's base rule, which stops a
    run whose reward reaches its threshold (``GET /v1/model`` ``rule``, "reward >= 0.4545"
    when written; ``test_productive_run_stays_below_the_served_rule`` checks it). So only a
    premature stop by something else (the learned value, a net) can fail this test."""
    run_id = f"http-productive-{with_reward}"
    answers = drive(
        productive_run(with_reward=with_reward), http_decide(default_server, run_id), PRODUCTIVE_TURNS
    )
    assert len(answers) == PRODUCTIVE_TURNS, summary(answers)
    assert all(a["action"] == "continue" for a in answers), summary(answers)
