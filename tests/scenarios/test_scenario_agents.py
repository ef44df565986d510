"""The stuck loop through the OpenAI Agents SDK, with StopServeHooks given nothing but the URL.

An agent whose model calls the same tool with the same result every turn, and two text-only
agents handing the task back and forth (the critic repeating itself). Both must end cleanly
(no exception, no ``MaxTurnsExceeded``) with the loop named, service up or down.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from nudges import NUDGE_START, Plan
from scenario_runs import LOOP_TURNS, TEXT_LOOP_TURNS, TOKENS_PER_TURN, Service

pytest.importorskip("agents")

from agents import Agent, ModelResponse, RunConfig, Runner, Usage, function_tool
from agents.models.interface import Model
from agents.testing import assistant_message, function_call

from stopserve.integrations.openai_agents import StopServeHooks

RUN_CONFIG = RunConfig(tracing_disabled=True)
OUTER_NET = 60  # the SDK's max_turns: reached only if stopserve never stops the run


class Scripted(Model):
    """A model whose i-th response is ``script(i, handoff tool names offered)``; it keeps the
    input of every request."""

    def __init__(self, script: Callable[[int, list[str]], list[Any]]) -> None:
        self.script = script
        self.calls = 0
        self.inputs: list[Any] = []

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.calls += 1
        self.inputs.append(kwargs.get("input"))
        offered = [h.tool_name for h in kwargs.get("handoffs") or []]
        usage = Usage(
            requests=1, input_tokens=TOKENS_PER_TURN - 300, output_tokens=300, total_tokens=TOKENS_PER_TURN
        )
        return ModelResponse(output=self.script(self.calls, offered), usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("not streamed in these tests")


@function_tool
def run_tests(path: str) -> str:
    """Run the test suite at path."""
    return f"FAILED {path}::test_parse - AssertionError"


def run(agent: Agent[Any], hooks: StopServeHooks) -> Any:
    async def main() -> Any:
        try:
            config = hooks.run_config(RUN_CONFIG)  # as docs/integrations.md runs it: nudges on
            return await Runner.run(agent, "Fix parse()", hooks=hooks, max_turns=OUTER_NET, run_config=config)
        finally:
            await hooks.aclose()

    return asyncio.run(main())


def check(hooks: StopServeHooks, service: Service, within: int = LOOP_TURNS) -> Any:
    decision = hooks.stop_decision
    assert decision is not None, f"never stopped; last decision {hooks.last_decision}"
    assert decision.reason in ("loop_detected", "no_progress") and decision.pattern, decision
    assert decision.turn <= within and decision.degraded is service.down, decision
    return decision


def test_tool_loop(service: Service) -> None:
    model = Scripted(
        lambda i, _: [function_call("run_tests", {"path": "tests/test_utils.py"}, call_id=f"c{i}")]
    )
    hooks = StopServeHooks(service.url)  # nothing else: the defaults
    agent = hooks.attach(Agent(name="coder", tools=[run_tests], model=model))
    result = run(agent, hooks)
    check(hooks, service)
    assert result.final_output.startswith("stopserve: stop (") and "loop" in result.final_output, (
        result.final_output
    )
    assert model.calls <= LOOP_TURNS
    print(f"\n{result.final_output.splitlines()[0]}")


def test_text_only_agents_handing_off_where_the_critic_repeats_itself(service: Service) -> None:
    def speaker(name: str, text: Callable[[int], str], to: str) -> Scripted:
        def script(i: int, offered: list[str]) -> list[Any]:
            if to not in offered:  # handoffs disabled (stopserve said stop): answer instead
                return [assistant_message(f"{name}: final answer")]
            return [assistant_message(text(i)), function_call(to, {}, call_id=f"{name}{i}")]

        return Scripted(script)

    coder = Agent(
        name="coder", model=speaker("coder", lambda i: "def parse(s):  # draft 1", "transfer_to_critic")
    )
    critic = Agent(name="critic", model=speaker("critic", lambda i: "Please handle ''.", "transfer_to_coder"))
    coder.handoffs = [critic]
    critic.handoffs = [coder]
    hooks = StopServeHooks(service.url)
    result = run(hooks.attach(coder), hooks)
    decision = check(hooks, service, within=TEXT_LOOP_TURNS)
    assert decision.pattern in ("repeated_reply", "repeated_cycle"), decision
    # the agent the stop was handed to answered instead of handing off again
    assert result.final_output == f"{result.last_agent.name}: final answer"
    print(f"\nstopserve: stop ({decision.reason}, {decision.pattern}) at turn {decision.turn}")


def is_nudge(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and item.get("role") == "user"
        and str(item.get("content")).startswith(NUDGE_START)
    )


def test_a_model_that_heeds_the_nudge_goes_on(service: Service) -> None:
    """Nothing but the URL: the sixth identical result brings the nudge into the model's next
    request; the model tries something else (:class:`nudges.Plan`) and the run is not stopped."""
    plan = Plan(heeds=True)

    def script(i: int, _: list[str]) -> list[Any]:
        path = plan.next_path(is_nudge(model.inputs[-1][-1]))
        if path is None:
            return [assistant_message("done")]
        return [function_call("run_tests", {"path": path}, call_id=f"c{i}")]

    model = Scripted(script)
    hooks = StopServeHooks(service.url)
    result = run(hooks.attach(Agent(name="coder", tools=[run_tests], model=model)), hooks)
    assert result.final_output == "done", hooks.last_decision
    assert hooks.stop_decision is None and hooks.last_decision is not None
    assert hooks.last_decision.degraded is service.down, hooks.last_decision
    nudged = [i for i, items in enumerate(model.inputs, 1) if is_nudge(items[-1])]
    assert nudged == [7] and model.calls == 10, nudged  # after the sixth result
