"""The scenarios through the Python client (sync and async), with the service up and down.

Up: the default model answers. Down (a URL nobody listens on): the client's local fallback
answers from the same default nets and rules, marked ``degraded``, and must get every
scenario right too.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import pytest
from scenario_runs import SCENARIOS, check, drive, summary
from servers import LiveServer

from stopserve.api import DecideResponse
from stopserve.client import AsyncStopClient, StopClient
from stopserve.safety import SafetyConfig


def run_sync(url: str, name: str, safety: SafetyConfig | None = None) -> list[DecideResponse]:
    scenario = SCENARIOS[name]
    run_id = f"sync-{name}-{uuid.uuid4().hex[:8]}"  # a fresh run each time: ids are per run
    with StopClient(url, timeout=5.0, safety=safety) as client:  # no budget, no lambda: the defaults
        return drive(scenario.steps(), lambda events: client.decide(run_id, events), scenario.limit)


def run_async(url: str, name: str) -> list[DecideResponse]:
    scenario = SCENARIOS[name]

    async def main() -> list[DecideResponse]:
        client = AsyncStopClient(url, timeout=5.0)
        run_id = f"async-{name}-{uuid.uuid4().hex[:8]}"
        steps, answers = scenario.steps(), []
        try:
            for _ in range(scenario.limit):
                answers.append(await client.decide(run_id, next(steps)))
                if answers[-1].action == "stop":
                    break
        finally:
            await client.aclose()
        return answers

    return asyncio.run(main())


RUNNERS = {"sync": run_sync, "async": run_async}


def _check(name: str, answers: Sequence[DecideResponse], degraded: bool) -> None:
    assert all(a.degraded is degraded for a in answers), summary(answers)
    check(SCENARIOS[name], answers)


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("mode", list(RUNNERS))
def test_service_up(default_server: LiveServer, mode: str, name: str) -> None:
    _check(name, RUNNERS[mode](default_server.url, name), degraded=False)


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("mode", list(RUNNERS))
def test_service_down(down_url: str, mode: str, name: str) -> None:
    _check(name, RUNNERS[mode](down_url, name), degraded=True)


def test_a_turn_is_an_agent_step_with_the_service_down(down_url: str) -> None:
    answers = run_sync(down_url, "rising_reward_03", safety=SafetyConfig(max_turns=10))
    assert [a.turn for a in answers] == list(range(1, 11)), summary(answers)
    assert answers[-1].safety_net == "max_turns", summary(answers)


@pytest.mark.parametrize("where", ["up", "down"])
def test_a_loop_is_nudged_before_it_is_stopped(default_server: LiveServer, down_url: str, where: str) -> None:
    """At the threshold the answer goes on with a nudge for the agent; the stop comes two repeats later."""
    url = default_server.url if where == "up" else down_url
    bumps = run_sync(url, "recoverable_bumps")
    assert [i for i, a in enumerate(bumps, 1) if a.nudge] == [6], summary(bumps)
    assert "try something different" in (bumps[5].nudge or "") and bumps[5].action == "continue"
    search = run_sync(url, "rephrased_search")
    assert [i for i, a in enumerate(search, 1) if a.nudge] == [6, 7], summary(search)
    assert search[-1].action == "stop" and search[-1].pattern == "near_repeat", summary(search)
    assert "still repeated after 2 nudges" in (search[-1].message or ""), summary(search)
