"""StopServeTermination in a real AutoGen team (ReplayChatCompletionClient) against a real server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from nudges import NUDGE_START, Plan, assert_each_nudge_sent_once, assert_stopped_after_nudges
from servers import LiveServer
from sketchkit import similar, traceback_at

pytest.importorskip("autogen_agentchat")

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.base import TaskResult, TerminationCondition
from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
from autogen_agentchat.messages import (
    CodeExecutionEvent,
    HandoffMessage,
    TextMessage,
    ToolCallExecutionEvent,
    ToolCallRequestEvent,
    ToolCallSummaryMessage,
)
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core import FunctionCall
from autogen_core.code_executor import CodeResult
from autogen_core.models import (
    CreateResult,
    FunctionExecutionResult,
    LLMMessage,
    ModelFamily,
    ModelInfo,
    RequestUsage,
    UserMessage,
)
from autogen_ext.models.replay import ReplayChatCompletionClient

from stopserve.integrations._common import RunClock
from stopserve.integrations.autogen import StopServeTermination, events_from_messages
from stopserve.objective import Objective
from stopserve.trace import Trace, read_traces

MODEL_INFO = ModelInfo(
    vision=False,
    function_calling=True,
    json_output=False,
    family=ModelFamily.UNKNOWN,
    structured_output=False,
)


def run_tests(path: str) -> str:
    """Run the test suite at path."""
    return "1 failed" if "broken" in path else "all passed"


def tool_call(i: int) -> CreateResult:
    return CreateResult(
        finish_reason="function_calls",
        content=[FunctionCall(id=f"call{i}", name="run_tests", arguments=f'{{"path": "t{i}"}}')],
        usage=RequestUsage(prompt_tokens=100, completion_tokens=20),
        cached=False,
    )


def make_team(url: str, termination: TerminationCondition, n_steps: int = 20) -> RoundRobinGroupChat:
    model = ReplayChatCompletionClient([tool_call(i) for i in range(n_steps)], model_info=MODEL_INFO)
    coder = AssistantAgent("coder", model_client=model, tools=[run_tests])
    return RoundRobinGroupChat([coder], termination_condition=termination)


def test_message_mapping() -> None:
    clock = RunClock()
    req = ToolCallRequestEvent(
        source="coder",
        content=[
            FunctionCall(id="a", name="ls", arguments="{}"),
            FunctionCall(id="b", name="cat", arguments="{}"),
        ],
        models_usage=RequestUsage(prompt_tokens=7, completion_tokens=3),
    )
    res = ToolCallExecutionEvent(
        source="coder",
        content=[
            FunctionExecutionResult(content="ok", name="ls", call_id="a", is_error=False),
            FunctionExecutionResult(content="boom", name="cat", call_id="b", is_error=True),
        ],
    )
    text = TextMessage(source="user", content="fix the bug")
    handoff = HandoffMessage(source="coder", target="critic", content="please review")
    reply = TextMessage(source="critic", content="looks good")
    summary = ToolCallSummaryMessage(source="coder", content="ok", tool_calls=[], results=[])
    events = events_from_messages([text, req, res, handoff, reply, summary], clock)
    assert [e.type for e in events] == [
        "communicate",  # the task
        "tool_use",
        "tool_use",
        "return",
        "return",
        "delegate",  # the handoff, then the end of the agent's turn
        "return",
        "return",  # a reply: the agent hands its turn back
        "communicate",  # a tool call's summary: its results were the turn
    ]
    assert events[0].role == "human"
    assert [e.tokens for e in events[1:3]] == [10, None]  # usage counted once per model call
    assert [e.tool for e in events[1:5]] == ["ls", "cat", "ls", "cat"]
    assert [e.error for e in events[3:5]] == [False, True]
    assert events[5].to == "critic"
    assert events[6].agent == "coder" and events[6].content_ref is None  # handoff text is boilerplate
    assert events[7].agent == "critic" and events[7].content_ref is not None
    assert events[8].content_ref is None  # a summary repeats results already counted
    assert len({e.id for e in events}) == len(events)
    assert [e.t for e in events] == sorted(e.t for e in events)
    # the same messages again map to the same ids: a retried call is idempotent
    assert [e.id for e in events_from_messages([req], RunClock())] == [e.id for e in events[1:3]]
    # the earlier mapping, on request: replies are communicate, a handoff is a bare delegate
    old = events_from_messages([text, handoff, reply], RunClock(), replies_as_turns=False)
    assert [e.type for e in old] == ["communicate", "delegate", "communicate"]


def test_team_stops_when_the_service_says_so(server: LiveServer) -> None:
    stop = StopServeTermination(server.url, safety={"max_turns": 2}, timeout=2.0, task_id="fix-bug")
    team = make_team(server.url, stop | MaxMessageTermination(50))

    async def main() -> tuple[TaskResult, object]:
        result = await team.run(task="fix the failing test")
        out = await stop.outcome({"team": 1.0})
        await stop.aclose()
        return result, out

    result, out = asyncio.run(main())
    assert result.stop_reason is not None
    assert result.stop_reason.startswith("stopserve: stop (budget_exhausted), safety net max_turns")
    assert "degraded" not in result.stop_reason
    assert stop.last_decision is not None and stop.last_decision.turn == 2
    # two agent turns ran (each a tool call and its result), not the 50 messages of the outer net
    assert sum(isinstance(m, ToolCallExecutionEvent) for m in result.messages) == 2
    assert out is not None
    trace = next(t for t in read_traces(server.log_dir / "traces.jsonl") if t.trace_id == stop.last_run_id)
    assert trace.task_id == "fix-bug" and trace.rewards == {"team": 1.0}
    assert [e.type for e in trace.events].count("return") == 2
    # the task and both tool-call summaries: the last one was held after the last decision
    # point and went with the outcome
    assert [e.type for e in trace.events].count("communicate") == 3
    assert (
        trace.stop is not None and trace.stop.reason == "budget_exhausted" and trace.stop.by == "safety_net"
    )
    assert sum(e.tokens or 0 for e in trace.events) == 2 * 120


def test_other_condition_stops_first_and_run_restarts(server: LiveServer) -> None:
    stop = StopServeTermination(server.url, safety={"max_turns": 50}, timeout=2.0)
    team = make_team(server.url, stop | MaxMessageTermination(3))

    async def main() -> tuple[TaskResult, str | None, TaskResult, str | None]:
        first = await team.run(task="go")
        first_run = stop.last_run_id
        second = await team.run()  # continues the team: a new stopserve run
        return first, first_run, second, stop.last_run_id

    first, run1, second, run2 = asyncio.run(main())
    assert first.stop_reason is not None and "Maximum number of messages" in first.stop_reason
    assert second.stop_reason is not None and "Maximum number of messages" in second.stop_reason
    assert not stop.terminated and run1 != run2


def test_component_config_round_trip() -> None:
    cond = StopServeTermination(
        "http://127.0.0.1:9", safety={"max_usd": 2.0}, objective=Objective(lam=0.1), task_id="t"
    )
    combined = cond | MaxMessageTermination(50)
    loaded = TerminationCondition.load_component(combined.dump_component())
    inner = loaded._conditions[0]  # type: ignore[attr-defined]
    assert isinstance(inner, StopServeTermination)
    assert inner._to_config() == cond._to_config()
    assert inner._to_config().safety == {"max_usd": 2.0}
    assert inner._to_config().objective == {"lambda": 0.1} and inner.client._core.objective == Objective(
        lam=0.1
    )


@pytest.mark.timeout(60)
def test_server_killed_mid_run_team_finishes_on_local_nets(tmp_path: Path) -> None:
    """Kill -9 the sidecar mid-run: the team neither hangs nor crashes; decisions turn degraded."""
    srv = LiveServer(log_dir=tmp_path, no_model=True).start()
    try:
        stop = StopServeTermination(srv.url, safety={"max_turns": 4}, timeout=2.0)
        kill_after = 2
        seen: list[bool] = []

        class KillAfter(MaxMessageTermination):
            """Counts agent turns; kills the server after the second (a crash mid-run)."""

            async def __call__(self, messages):  # type: ignore[no-untyped-def]
                if stop.last_decision is not None:
                    seen.append(stop.last_decision.degraded)
                    if len(seen) == kill_after:
                        srv.kill()
                return await super().__call__(messages)

        team = make_team(srv.url, stop | KillAfter(100))
        result = asyncio.run(team.run(task="go"))
    finally:
        srv.stop()
    assert result.stop_reason is not None and "max_turns" in result.stop_reason
    assert "degraded" in result.stop_reason
    assert stop.last_decision is not None and stop.last_decision.degraded and stop.last_decision.turn == 4
    assert seen[:kill_after] == [False, False]


def test_text_only_team_counts_replies_as_turns(server: LiveServer) -> None:
    def writer(name: str) -> AssistantAgent:
        replies = [f"{name} draft {i}" for i in range(10)]
        return AssistantAgent(name, model_client=ReplayChatCompletionClient(replies))

    turns = StopServeTermination(server.url, safety={"max_turns": 2}, timeout=2.0)  # the default
    plain = StopServeTermination(server.url, safety={"max_turns": 2}, timeout=2.0, replies_as_turns=False)

    async def main(cond: TerminationCondition) -> TaskResult:
        team = RoundRobinGroupChat([writer("writer"), writer("critic")], termination_condition=cond)
        return await team.run(task="write a haiku")

    # the earlier mapping: text messages are communicate, no decision point, max_turns never
    # fires; the outer net does
    result = asyncio.run(main(plain | MaxMessageTermination(6)))
    assert result.stop_reason is not None and "Maximum number of messages" in result.stop_reason
    result = asyncio.run(main(turns | MaxMessageTermination(6)))
    assert result.stop_reason is not None and "max_turns" in result.stop_reason
    assert [m.source for m in result.messages] == ["user", "writer", "critic"]
    events = events_from_messages(result.messages, RunClock())
    assert [e.type for e in events] == ["communicate", "return", "return"]


def calls_to(name: str, arguments: str, n: int) -> list[CreateResult]:
    """``n`` model turns that each call tool ``name`` with the same arguments."""
    return [
        CreateResult(
            finish_reason="function_calls",
            content=[FunctionCall(id=f"{name}{i}", name=name, arguments=arguments)],
            usage=RequestUsage(prompt_tokens=10, completion_tokens=2),
            cached=False,
        )
        for i in range(n)
    ]


def logged_run(server: LiveServer, stop: StopServeTermination, turns: list[CreateResult], tool: Any) -> Trace:
    """One coder's team run with ``tool`` until ``stop`` (or 50 messages): the trace the service logged."""
    model = ReplayChatCompletionClient(turns, model_info=MODEL_INFO)
    coder = AssistantAgent("coder", model_client=model, tools=[tool])
    team = RoundRobinGroupChat([coder], termination_condition=stop | MaxMessageTermination(50))

    async def main() -> None:
        await team.run(task="fix it")
        await stop.outcome({"team": 0.0})
        await stop.aclose()

    asyncio.run(main())
    return next(t for t in read_traces(server.log_dir / "traces.jsonl") if t.trace_id == stop.last_run_id)


def test_the_same_failure_at_another_time_is_one_sketch(server: LiveServer) -> None:
    tries = iter(range(100))

    def migrate(path: str) -> str:
        """Run the migrations at path."""
        return traceback_at(next(tries))

    traces = {}
    for sketch in (True, False):
        stop = StopServeTermination(server.url, safety={"max_turns": 3}, timeout=2.0, sketch=sketch)
        traces[sketch] = logged_run(server, stop, calls_to("migrate", '{"path": "db"}', 6), migrate)
    outs = [e for e in traces[True].events if e.type == "return" and e.tool == "migrate"]
    assert len(outs) == 3 and len({e.content_ref for e in outs}) == 3  # three different texts
    assert similar(outs[0].sketch, outs[1].sketch) == similar(outs[0].sketch, outs[2].sketch) == 1.0
    assert all(e.sketch is None for e in traces[False].events)
    assert StopServeTermination(sketch=False).dump_component().config["sketch"] is False


TOOLS = Path(__file__).parents[1] / "signals" / "data" / "tools"  # real tool output (data/README.md)


def test_tool_and_code_results_carry_progress(server: LiveServer) -> None:
    runs = [(TOOLS / "pytest-q-fail.txt").read_text(), (TOOLS / "pytest-q-pass.txt").read_text()]
    outputs = iter(runs)

    def pytest_q(path: str) -> str:
        """Run pytest -q at path."""
        return next(outputs, "no tests ran in 0.01s")

    traces = {}
    for progress in (True, False):
        outputs = iter(runs)  # pytest 9.0.3: 2 failed, 1 passed, 1 error; then 1 passed
        stop = StopServeTermination(server.url, safety={"max_turns": 2}, timeout=2.0, progress=progress)
        traces[progress] = logged_run(server, stop, calls_to("pytest_q", '{"path": "."}', 4), pytest_q)
    outs = [e.progress for e in traces[True].events if e.type == "return" and e.tool == "pytest_q"]
    assert [(p.tests_passed, p.tests_failed) for p in outs if p is not None] == [(1, 3), (1, 0)]
    assert outs[0] is not None and outs[0].error is not None and outs[1] is not None and outs[1].error is None
    assert all(e.progress is None for e in traces[False].events)
    assert StopServeTermination(progress=False).dump_component().config["progress"] is False
    # a code executor's result: its exit code is known
    ran = CodeExecutionEvent(
        source="coder",
        retry_attempt=0,
        result=CodeResult(exit_code=1, output=(TOOLS / "unittest-fail.txt").read_text()),
    )
    (event,) = events_from_messages([ran], RunClock())
    assert event.progress is not None and (event.progress.exit_code, event.progress.source) == (1, "unittest")
    assert (event.progress.tests_passed, event.progress.tests_failed) == (1, 2)


class Stubborn(ReplayChatCompletionClient):
    """Calls ``run_tests`` as its :class:`~nudges.Plan` says, then answers ``done``; it keeps
    every request it received."""

    def __init__(self, heeds: bool = False) -> None:
        super().__init__([], model_info=MODEL_INFO)
        self.plan = Plan(heeds)
        self.requests: list[list[LLMMessage]] = []

    async def create(self, messages: Any, **kwargs: Any) -> CreateResult:
        self.requests.append(list(messages))
        path = self.plan.next_path(bool(nudges_in(self.requests[-1][-1:])))
        if path is None:
            return CreateResult(finish_reason="stop", content="done", usage=USAGE, cached=False)
        (call,) = calls_to("run_tests", json.dumps({"path": path}), 1)
        return call


USAGE = RequestUsage(prompt_tokens=10, completion_tokens=2)


def nudges_in(messages: list[LLMMessage]) -> list[str]:
    return [str(m.content) for m in messages if isinstance(m, UserMessage) and m.source == "stopserve"]


def nudged_run(server: LiveServer, model: Stubborn, **kwargs: Any) -> tuple[StopServeTermination, TaskResult]:
    stop = StopServeTermination(server.url, safety={"max_turns": 50}, timeout=2.0, **kwargs)
    coder = AssistantAgent("coder", model_client=stop.nudging(model), tools=[run_tests])
    ends = stop | TextMentionTermination("done", sources=["coder"]) | MaxMessageTermination(100)

    async def main() -> TaskResult:
        result = await RoundRobinGroupChat([coder], termination_condition=ends).run(task="fix it")
        await stop.aclose()
        return result

    return stop, asyncio.run(main())


def test_a_repeated_call_is_nudged_then_stopped(server: LiveServer) -> None:
    """The same call and result six times (the default threshold): the next model request
    carries the nudge, once per decision; repeating on, the team stops two repeats later."""
    model = Stubborn()
    stop, result = nudged_run(server, model)
    assert_stopped_after_nudges(stop.last_decision)
    assert result.stop_reason is not None and result.stop_reason.startswith("stopserve: stop (loop_detected)")
    # requests 7 and 8 follow the sixth and seventh results
    assert_each_nudge_sent_once(
        [nudges_in(r) for r in model.requests], [nudges_in(r[-1:]) for r in model.requests]
    )
    # the team's own messages are unchanged: the nudge was only in the request
    assert not any(NUDGE_START in m.to_text() for m in result.messages)


def test_a_model_that_heeds_the_nudge_is_not_stopped(server: LiveServer) -> None:
    model = Stubborn(heeds=True)
    stop, result = nudged_run(server, model)
    assert result.stop_reason is not None and "'done' mentioned" in result.stop_reason
    assert not stop.terminated and len(model.requests) == 10  # three other paths, then its answer
    assert [len(nudges_in(r)) for r in model.requests] == [0] * 6 + [1, 0, 0, 0]
    assert stop.last_decision is not None and stop.last_decision.action == "continue"


def test_nudge_false_delivers_nothing(server: LiveServer) -> None:
    model = Stubborn(heeds=True)
    stop, result = nudged_run(server, model, nudge=False)
    assert_stopped_after_nudges(stop.last_decision)  # it never heard
    assert result.stop_reason is not None and result.stop_reason.startswith("stopserve: stop (loop_detected)")
    assert len(model.requests) == 8 and not any(nudges_in(r) for r in model.requests)
    assert StopServeTermination(nudge=False).dump_component().config["nudge"] is False
