"""The stuck loop through AutoGen, with StopServeTermination given nothing but the URL.

Two teams: one agent calling the same tool with the same result every turn, and the docs'
own text-only ``RoundRobinGroupChat([coder, critic], ...)`` where the coder resubmits its
draft and the critic gives the same reply every time. Both must end with "loop" in
``TaskResult.stop_reason``, service up (default model) or down (local fallback).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from nudges import NUDGE_START, Plan
from scenario_runs import LOOP_TURNS, TEXT_LOOP_TURNS, TOKENS_PER_TURN, Service

pytest.importorskip("autogen_agentchat")

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.base import TaskResult
from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core import FunctionCall
from autogen_core.models import CreateResult, LLMMessage, ModelFamily, ModelInfo, RequestUsage, UserMessage
from autogen_ext.models.replay import ReplayChatCompletionClient

from stopserve.integrations.autogen import StopServeTermination

MODEL_INFO = ModelInfo(
    vision=False,
    function_calling=True,
    json_output=False,
    family=ModelFamily.UNKNOWN,
    structured_output=False,
)
USAGE = RequestUsage(prompt_tokens=TOKENS_PER_TURN - 300, completion_tokens=300)
OUTER_NET = 100  # messages: reached only if stopserve never stops the team


def run_tests(path: str) -> str:
    """Run the test suite at path."""
    return f"FAILED {path}::test_parse - AssertionError"


def same_call(i: int, path: str = "tests/test_utils.py") -> CreateResult:
    return CreateResult(
        finish_reason="function_calls",
        content=[FunctionCall(id=f"call{i}", name="run_tests", arguments=json.dumps({"path": path}))],
        usage=USAGE,
        cached=False,
    )


def text(content: str) -> CreateResult:
    return CreateResult(finish_reason="stop", content=content, usage=USAGE, cached=False)


def run(team: RoundRobinGroupChat, stop: StopServeTermination) -> TaskResult:
    async def main() -> TaskResult:
        try:
            return await team.run(task="Fix the failing test in utils.py")
        finally:
            await stop.aclose()

    return asyncio.run(main())


def check(result: TaskResult, stop: StopServeTermination, service: Service, within: int = LOOP_TURNS) -> None:
    decision = stop.last_decision
    assert result.stop_reason is not None and "loop" in result.stop_reason, (
        f"not stopped as a loop: {result.stop_reason!r}; last decision {decision}"
    )
    assert decision is not None and decision.action == "stop" and decision.pattern is not None
    assert decision.reason in ("loop_detected", "no_progress")
    assert decision.turn <= within, decision
    assert decision.degraded is service.down, decision
    print(f"\n{result.stop_reason}")


def test_tool_loop(service: Service) -> None:
    model = ReplayChatCompletionClient([same_call(i) for i in range(60)], model_info=MODEL_INFO)
    coder = AssistantAgent("coder", model_client=model, tools=[run_tests])
    stop = StopServeTermination(service.url)  # nothing but the URL
    team = RoundRobinGroupChat([coder], termination_condition=stop | MaxMessageTermination(OUTER_NET))
    result = run(team, stop)
    check(result, stop, service)


def test_text_only_team_where_the_critic_repeats_itself(service: Service) -> None:
    # the coder resubmits its draft: nothing new comes (a critic repeating itself while the coder
    # brings new drafts is no loop)
    coder_model = ReplayChatCompletionClient([text("def parse(s):  # draft 1") for _ in range(60)])
    critic_model = ReplayChatCompletionClient([text("Please handle the empty string.") for _ in range(60)])
    coder = AssistantAgent("coder", model_client=coder_model)
    critic = AssistantAgent("critic", model_client=critic_model)
    stop = StopServeTermination(service.url)  # nothing but the URL
    team = RoundRobinGroupChat([coder, critic], termination_condition=stop | MaxMessageTermination(OUTER_NET))
    result = run(team, stop)
    check(result, stop, service, within=TEXT_LOOP_TURNS)
    assert stop.last_decision is not None
    assert stop.last_decision.pattern in ("repeated_reply", "repeated_cycle")
    # the exchange stopped at the critic's reply that completed its sixth repeat
    assert [m.source for m in result.messages][-1] == "critic"


class Heeding(ReplayChatCompletionClient):
    """Stuck on one call until a nudge ends its request; then it tries three other paths and
    answers ``done`` (:class:`nudges.Plan`). It keeps every request it received."""

    def __init__(self) -> None:
        super().__init__([], model_info=MODEL_INFO)
        self.plan = Plan(heeds=True)
        self.requests: list[list[LLMMessage]] = []

    async def create(self, messages: Any, **kwargs: Any) -> CreateResult:
        self.requests.append(list(messages))
        path = self.plan.next_path(is_nudge(messages[-1]))
        return text("done") if path is None else same_call(len(self.requests), path)


def is_nudge(message: LLMMessage) -> bool:
    return isinstance(message, UserMessage) and str(message.content).startswith(NUDGE_START)


def test_a_model_that_heeds_the_nudge_goes_on(service: Service) -> None:
    """Nothing but the URL: the sixth identical result brings the nudge into the model's next
    request (``stop.nudging``); the model tries something else and the team is not stopped."""
    model = Heeding()
    stop = StopServeTermination(service.url)
    coder = AssistantAgent("coder", model_client=stop.nudging(model), tools=[run_tests])
    ends = stop | TextMentionTermination("done", sources=["coder"]) | MaxMessageTermination(OUTER_NET)
    result = run(RoundRobinGroupChat([coder], termination_condition=ends), stop)
    assert result.stop_reason is not None and "'done' mentioned" in result.stop_reason, stop.last_decision
    assert not stop.terminated and stop.last_decision is not None
    assert stop.last_decision.degraded is service.down, stop.last_decision
    nudged = [i for i, r in enumerate(model.requests, 1) if is_nudge(r[-1])]
    assert nudged == [7] and len(model.requests) == 10, nudged  # after the sixth result
