"""Magentic-One through StopServeTermination: the orchestrator's own progress ledger stops a stuck run.

A real ``MagenticOneGroupChat`` (autogen-agentchat) with scripted models
(``ReplayChatCompletionClient``, no network) against a real ``stopserve serve`` on loopback
(no model: the default safety config, whose ``orchestrator_ledger`` rule is on).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from servers import LiveServer

pytest.importorskip("autogen_agentchat")

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.base import TaskResult
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import MagenticOneGroupChat
from autogen_core.models import ModelFamily, ModelInfo
from autogen_ext.models.replay import ReplayChatCompletionClient

from stopserve.integrations.autogen import StopServeTermination

INFO = ModelInfo(
    vision=False,
    function_calling=False,
    json_output=False,
    family=ModelFamily.UNKNOWN,
    structured_output=False,
)


def ledger(*, progress: bool, loop: bool, satisfied: bool = False) -> str:
    """A progress ledger as Magentic-One's orchestrator asks its model for it."""
    return json.dumps(
        {
            "is_request_satisfied": {"reason": "not yet", "answer": satisfied},
            "is_progress_being_made": {"reason": "r", "answer": progress},
            "is_in_loop": {"reason": "r", "answer": loop},
            "instruction_or_question": {"reason": "r", "answer": "search the docs for the flag"},
            "next_speaker": {"reason": "r", "answer": "surfer"},
        }
    )


def orchestrator_script(ledgers: list[str], *, replans: bool = False) -> list[str]:
    # the outer loop (facts, plan), then a ledger a round; a re-plan (after three stalls) asks for
    # facts and a plan again: with ``replans``, those follow every ledger so the script never runs short
    out = ["facts", "plan"]
    for entry in ledgers:
        out += [entry, "facts again", "plan again"] if replans else [entry]
    return [*out, "the final answer"]


def run(
    url: str, ledgers: list[str], replies: list[str], *, replans: bool = False
) -> tuple[TaskResult, StopServeTermination]:
    stop = StopServeTermination(url)
    script = orchestrator_script(ledgers, replans=replans)
    orchestrator = stop.read_ledger(ReplayChatCompletionClient(script, model_info=INFO))
    surfer = AssistantAgent("surfer", model_client=ReplayChatCompletionClient(replies, model_info=INFO))
    team = MagenticOneGroupChat(
        [surfer],
        model_client=orchestrator,
        termination_condition=stop | MaxMessageTermination(len(replies) - 2),
        max_stalls=3,
    )

    async def go() -> TaskResult:
        try:
            return await team.run(task="find the flag that turns off telemetry")
        finally:
            await stop.aclose()

    return asyncio.run(go()), stop


def test_a_run_stuck_by_its_own_ledger_is_stopped_within_four_ledger_turns(server: LiveServer) -> None:
    # the surfer says new things every turn (no repeat for the loop detector to see): only the
    # orchestrator's own verdict says the run is stuck
    replies = [f"I searched page {i} and found nothing about it" for i in range(12)]
    result, stop = run(server.url, [ledger(progress=False, loop=True)] * 12, replies, replans=True)
    assert result.stop_reason is not None and "orchestrator" in result.stop_reason
    d = stop.last_decision
    assert d is not None and d.action == "stop"
    assert d.safety_net == "orchestrator_ledger" and d.pattern == "in_loop"
    assert "is_in_loop" in (d.message or "")
    # stopped at the third ledger, before Magentic-One's own re-plan: two surfer turns
    assert stop._n_ledgers <= 4
    assert len([m for m in result.messages if m.source == "surfer"]) <= 3


def test_a_run_its_ledger_says_progresses_is_not_stopped_by_it(server: LiveServer) -> None:
    replies = [f"I searched page {i}; the flag is documented on page {i + 1}" for i in range(8)]
    ledgers: list[str] = [ledger(progress=True, loop=False)] * 20
    result, stop = run(server.url, ledgers, replies)
    assert result.stop_reason is not None and "Maximum number of messages" in result.stop_reason
    d = stop.last_decision
    assert d is not None and d.action == "continue"
    assert len([m for m in result.messages if m.source == "surfer"]) >= 5


def test_a_ledger_reaches_the_service_as_the_orchestrators_progress(server: LiveServer) -> None:
    replies = [f"page {i}" for i in range(6)]
    seen: list[dict[str, Any]] = []
    stop = StopServeTermination(server.url)
    original = stop.client.decide

    async def spy(run_id: str, events: Any, **kw: Any) -> Any:
        seen.extend(e.dump() for e in events)
        return await original(run_id, events, **kw)

    stop.client.decide = spy  # type: ignore[method-assign]
    orchestrator = stop.read_ledger(
        ReplayChatCompletionClient(
            orchestrator_script([ledger(progress=True, loop=False)] * 10), model_info=INFO
        )
    )
    surfer = AssistantAgent("surfer", model_client=ReplayChatCompletionClient(replies, model_info=INFO))
    team = MagenticOneGroupChat(
        [surfer], model_client=orchestrator, termination_condition=stop | MaxMessageTermination(3)
    )

    async def go() -> None:
        try:
            await team.run(task="t")
        finally:
            await stop.aclose()

    asyncio.run(go())
    ledgers = [e for e in seen if e.get("progress")]
    assert ledgers, seen
    first = ledgers[0]
    assert first["agent"] == "MagenticOneOrchestrator" and first["type"] == "aggregate"
    assert first["progress"] == {"made_progress": True, "in_loop": False, "source": "magentic_one"}
    # the ledger comes before the reply it led to
    assert seen.index(first) < next(i for i, e in enumerate(seen) if e["agent"] == "surfer")
