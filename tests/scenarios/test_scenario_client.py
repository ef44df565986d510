"""The scenarios through the Python client (sync and async), with the service up and down.

Up: the default model answers. Down (a URL nobody listens on): the client's local fallback
answers from the same default nets, marked ``degraded``, and must decide the same way.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from scenario_runs import (
    PRODUCTIVE_TURNS,
    QUALITY_AT,
    QUALITY_WITHIN,
    Turn,
    assert_loop_stop,
    drive,
    productive_run,
    quality_run,
    stuck_loop,
    summary,
)
from servers import LiveServer

from stopserve.api import DecideResponse
from stopserve.client import AsyncStopClient, StopClient
from stopserve.trace import Event

Scenario = Callable[[], Iterator[Turn]]
SCENARIOS: dict[str, tuple[Scenario, int]] = {
    "loop": (stuck_loop, 40),
    "quality": (quality_run, 40),
    "quality-no-channel": (lambda: quality_run(channel=None), 40),
    "productive": (productive_run, PRODUCTIVE_TURNS),
    "productive-no-reward": (lambda: productive_run(with_reward=False), PRODUCTIVE_TURNS),
}


def run_sync(url: str, name: str) -> list[DecideResponse]:
    scenario, limit = SCENARIOS[name]
    run_id = f"sync-{name}-{uuid.uuid4().hex[:8]}"  # a fresh run each time: ids are per run
    with StopClient(url, timeout=5.0) as client:  # no budget, no lambda, no safety: the defaults
        return drive(scenario(), lambda events: client.decide(run_id, events), limit)


def run_async(url: str, name: str) -> list[DecideResponse]:
    scenario, limit = SCENARIOS[name]

    async def main() -> list[DecideResponse]:
        client = AsyncStopClient(url, timeout=5.0)
        run_id = f"async-{name}-{uuid.uuid4().hex[:8]}"
        turns, answers = scenario(), []
        try:
            for _ in range(limit):
                answers.append(await client.decide(run_id, next(turns)))
                if answers[-1].action == "stop":
                    break
        finally:
            await client.aclose()
        return answers

    return asyncio.run(main())


RUNNERS = {"sync": run_sync, "async": run_async}


def check(name: str, answers: Sequence[DecideResponse], degraded: bool) -> None:
    assert all(a.degraded is degraded for a in answers), summary(answers)
    last = answers[-1]
    if name == "loop":
        assert_loop_stop(answers)
        assert last.pattern == "repeated_action_observation"
        assert last.safety_net == "loop_detector" or last.reason == "no_progress"
    elif name.startswith("quality"):
        reached = 2 * QUALITY_AT
        assert last.action == "stop" and last.reason == "quality_met", summary(answers)
        assert reached <= last.turn <= reached + QUALITY_WITHIN, summary(answers)
    else:
        assert len(answers) == PRODUCTIVE_TURNS, summary(answers)
        assert all(a.action == "continue" for a in answers), summary(answers)


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("mode", list(RUNNERS))
def test_service_up(default_server: LiveServer, mode: str, name: str) -> None:
    check(name, RUNNERS[mode](default_server.url, name), degraded=False)


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("mode", list(RUNNERS))
def test_service_down(down_url: str, mode: str, name: str) -> None:
    check(name, RUNNERS[mode](down_url, name), degraded=True)


def _key(answers: Sequence[DecideResponse]) -> tuple[Any, ...]:
    last = answers[-1]
    return len(answers), last.action, last.turn, last.reason, last.safety_net, last.pattern


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_fallback_decides_like_the_service(default_server: LiveServer, down_url: str, name: str) -> None:
    """Same nets on both sides: the same turn, reason, net and pattern, up or down.

    On the loop the model may stop the run before the nets do (``no_progress``, naming the
    pattern in progress); the fallback, with the nets alone, stops it at the loop detector's
    threshold: never later than the nets, and naming the same pattern.
    """
    up, down = run_sync(default_server.url, name), run_sync(down_url, name)
    if name == "loop" and up[-1].safety_net is None:
        assert up[-1].reason == "no_progress" and down[-1].safety_net == "loop_detector"
        assert len(up) <= len(down) and up[-1].pattern == down[-1].pattern, (
            f"up:\n{summary(up)}\ndown:\n{summary(down)}"
        )
        return
    assert _key(up) == _key(down), f"up:\n{summary(up)}\ndown:\n{summary(down)}"


def test_events_are_what_the_scenarios_say() -> None:
    # the scripted runs themselves: a loop repeats, a productive run never does
    loop, productive = stuck_loop(), productive_run()
    a, b = next(loop), next(loop)
    assert [(e.type, e.content_ref) for e in a] == [(e.type, e.content_ref) for e in b]
    p1, p2 = next(productive), next(productive)
    refs: list[Event] = [*p1, *p2]
    assert len({e.content_ref for e in refs if e.type != "reward"}) == 4
    assert [e.value for e in refs if e.type == "reward"] == [0.05, 0.07]
