"""StopServeHooks in a real OpenAI Agents SDK run, driven by a scripted Model, against a real server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nudges import NUDGE_START, Plan, assert_each_nudge_sent_once, assert_stopped_after_nudges
from servers import LiveServer
from sketchkit import similar, traceback_at

pytest.importorskip("agents")

from agents import Agent, ModelResponse, RunConfig, RunHooks, Runner, Usage, function_tool
from agents.exceptions import MaxTurnsExceeded, UserError
from agents.models.interface import Model
from agents.testing import assistant_message, function_call

from stopserve.integrations.openai_agents import StopServeHooks
from stopserve.trace import read_traces


class ScriptedModel(Model):
    """A model that calls ``run_tests`` ``n`` times, then answers in text."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.calls += 1
        if self.calls <= self.n:
            item = function_call("run_tests", {"path": f"t{self.calls}"}, call_id=f"call{self.calls}")
        else:
            item = assistant_message("the fix is done")
        usage = Usage(requests=1, input_tokens=100, output_tokens=20, total_tokens=120)
        return ModelResponse(output=[item], usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("not streamed in these tests")


@function_tool
def run_tests(path: str) -> str:
    """Run the test suite at path."""
    return f"{path}: 1 failed"


def make_agent(model: Model) -> Agent[Any]:
    return Agent(name="coder", instructions="fix the bug", tools=[run_tests], model=model)


RUN_CONFIG = RunConfig(tracing_disabled=True)


def test_run_ends_cleanly_with_final_output_on_stop(server: LiveServer) -> None:
    hooks = StopServeHooks(server.url, safety={"max_turns": 2}, timeout=2.0, task_id="fix-bug")
    model = ScriptedModel(n=20)
    agent = hooks.attach(make_agent(model))

    async def main() -> Any:
        result = await Runner.run(agent, "fix it", hooks=hooks, max_turns=30, run_config=RUN_CONFIG)
        out = await hooks.outcome({"team": 1.0})
        await hooks.aclose()
        return result, out

    result, out = asyncio.run(main())
    assert result.final_output.startswith("stopserve: stop (budget_exhausted), safety net max_turns")
    assert result.final_output.endswith("t2: 1 failed")  # the best answer so far goes with it
    assert model.calls == 2  # no model call after the stop
    assert hooks.stop_decision is not None and hooks.stop_decision.turn == 2
    assert out is not None
    trace = next(t for t in read_traces(server.log_dir / "traces.jsonl") if t.trace_id == hooks.last_run_id)
    assert trace.task_id == "fix-bug"
    assert [e.type for e in trace.events] == ["tool_use", "return", "tool_use", "return"]
    assert trace.stop is not None and trace.stop.reason == "budget_exhausted"
    assert sum(e.tokens or 0 for e in trace.events) == 240


def test_attach_keeps_the_agents_own_behaviour_when_continuing(server: LiveServer) -> None:
    hooks = StopServeHooks(server.url, safety={"max_turns": 50}, timeout=2.0)
    agent = hooks.attach(make_agent(ScriptedModel(n=2)))
    result = asyncio.run(Runner.run(agent, "fix it", hooks=hooks, run_config=RUN_CONFIG))
    assert result.final_output == "the fix is done"
    assert hooks.stop_decision is None and hooks.run_id is None  # run over: the next one gets a new id

    stop_first = hooks.attach(make_agent(ScriptedModel(n=5)).clone(tool_use_behavior="stop_on_first_tool"))
    result = asyncio.run(Runner.run(stop_first, "fix it", hooks=hooks, run_config=RUN_CONFIG))
    assert result.final_output == "t1: 1 failed"


def test_typed_final_output(server: LiveServer) -> None:
    hooks = StopServeHooks(
        server.url,
        safety={"max_turns": 1},
        timeout=2.0,
        final_output=lambda decision, results: f"{decision.reason}|{len(results)}",
    )
    agent = hooks.attach(make_agent(ScriptedModel(n=5)))
    result = asyncio.run(Runner.run(agent, "x", hooks=hooks, run_config=RUN_CONFIG))
    assert result.final_output == "budget_exhausted|1"


def test_without_stopserve_the_sdk_raises_max_turns(server: LiveServer) -> None:
    # what the clean stop replaces: the SDK's own cap is an exception
    with pytest.raises(MaxTurnsExceeded):
        asyncio.run(Runner.run(make_agent(ScriptedModel(n=20)), "x", max_turns=3, run_config=RUN_CONFIG))


@pytest.mark.timeout(60)
def test_server_killed_mid_run(tmp_path: Path) -> None:
    """Kill -9 the sidecar mid-run: the run neither hangs nor crashes; decisions turn degraded."""
    srv = LiveServer(log_dir=tmp_path, no_model=True).start()
    try:
        hooks = StopServeHooks(srv.url, safety={"max_turns": 4}, timeout=0.2)

        @function_tool
        def run_tests(path: str) -> str:
            """Run the test suite at path."""
            if path == "t2":
                srv.kill()  # the sidecar dies in the middle of the run
            return f"{path}: 1 failed"

        agent = hooks.attach(Agent(name="coder", tools=[run_tests], model=ScriptedModel(n=20)))
        result = asyncio.run(Runner.run(agent, "x", hooks=hooks, max_turns=30, run_config=RUN_CONFIG))
    finally:
        srv.stop()
    assert "max_turns" in result.final_output and "degraded" in result.final_output
    assert hooks.stop_decision is not None and hooks.stop_decision.degraded
    assert hooks.stop_decision.turn == 4


def test_raising_in_a_hook_is_not_a_clean_stop() -> None:
    # why the hooks end runs through tool_use_behavior: an exception in a hook escapes
    # Runner.run (wrapped as "Error running tool ...")
    class Raising(RunHooks[Any]):
        async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: object) -> None:
            raise RuntimeError("stop now")

    with pytest.raises(UserError, match="stop now"):
        asyncio.run(Runner.run(make_agent(ScriptedModel(n=5)), "x", hooks=Raising(), run_config=RUN_CONFIG))


class Handing(Model):
    """Hands off to ``to`` while that handoff is offered, else answers ``answer``."""

    def __init__(self, to: str | None, answer: str, text: str = "") -> None:
        self.to, self.answer, self.text = to, answer, text
        self.calls = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.calls += 1
        offered = [h.tool_name for h in kwargs.get("handoffs") or []]
        usage = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)
        if self.to is not None and self.to in offered:
            items = [assistant_message(self.text)] if self.text else []
            output = [*items, function_call(self.to, {}, call_id=f"{self.to}-{self.calls}")]
        else:
            output = [assistant_message(self.answer)]
        return ModelResponse(output=output, usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("not streamed in these tests")


def test_every_model_response_is_a_decision_point(server: LiveServer) -> None:
    """A bare handoff, then a text answer: each response ends with a ``return``."""
    hooks = StopServeHooks(server.url, safety={"max_turns": 50}, timeout=2.0)
    coder = Agent(name="coder", model=Handing(None, "fixed"))
    triage = hooks.attach(Agent(name="triage", model=Handing("transfer_to_coder", "?"), handoffs=[coder]))

    async def main() -> Any:
        result = await Runner.run(triage, "x", hooks=hooks, run_config=RUN_CONFIG)
        await hooks.outcome({"team": 1.0})
        return result

    result = asyncio.run(main())
    assert result.final_output == "fixed"
    assert hooks.last_decision is not None and hooks.last_decision.turn == 2
    trace = next(t for t in read_traces(server.log_dir / "traces.jsonl") if t.trace_id == hooks.last_run_id)
    assert [(e.type, e.agent, e.to) for e in trace.events] == [
        ("delegate", "triage", "coder"),
        ("return", "triage", None),  # a bare handoff: no content (it is the same every time)
        ("return", "coder", None),  # the answer: the agent hands its turn back
    ]
    assert trace.events[1].content_ref is None and trace.events[2].content_ref is not None


def test_a_stop_disables_handoffs_so_the_run_ends_cleanly(server: LiveServer) -> None:
    """Two agents handing the task back and forth forever: after the stop the next one answers."""
    hooks = StopServeHooks(server.url, safety={"max_turns": 3}, timeout=2.0)
    a = Agent(name="a", model=Handing("transfer_to_b", "a answers", text="over to b"))
    b = Agent(name="b", model=Handing("transfer_to_a", "b answers", text="over to a"))
    a.handoffs, b.handoffs = [b], [a]
    result = asyncio.run(Runner.run(hooks.attach(a), "x", hooks=hooks, max_turns=20, run_config=RUN_CONFIG))
    assert hooks.stop_decision is not None and hooks.stop_decision.safety_net == "max_turns"
    assert hooks.stop_decision.turn == 3
    assert result.final_output == "b answers"  # a, b, a handed off; b could not: it answered
    # without attach the same agents run into the SDK's own cap, an exception
    with pytest.raises(MaxTurnsExceeded):
        asyncio.run(Runner.run(a, "x", max_turns=5, run_config=RUN_CONFIG))


_TRIES = iter(range(10**6))


@function_tool
def run_tests_again(path: str) -> str:
    """Run the test suite at path (it fails the same way each time, at another time)."""
    return traceback_at(next(_TRIES))


class SameCallModel(ScriptedModel):
    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.calls += 1
        item = function_call("run_tests_again", {"path": "tests"}, call_id=f"again{self.calls}")
        usage = Usage(requests=1, input_tokens=10, output_tokens=2, total_tokens=12)
        return ModelResponse(output=[item], usage=usage, response_id=None)


def logged_run(server: LiveServer, hooks: StopServeHooks, agent: Agent[Any]) -> Any:
    """One run of ``agent`` (attached to ``hooks``): the trace the service logged."""
    attached = hooks.attach(agent)

    async def main() -> None:
        await Runner.run(attached, "fix it", hooks=hooks, max_turns=30, run_config=RUN_CONFIG)
        await hooks.outcome({"team": 0.0})
        await hooks.aclose()

    asyncio.run(main())
    return next(t for t in read_traces(server.log_dir / "traces.jsonl") if t.trace_id == hooks.last_run_id)


def test_the_same_failure_at_another_time_is_one_sketch(server: LiveServer) -> None:
    traces = {}
    for sketch in (True, False):
        hooks = StopServeHooks(server.url, safety={"max_turns": 3}, timeout=2.0, sketch=sketch)
        agent = Agent(name="coder", tools=[run_tests_again], model=SameCallModel(n=0))
        traces[sketch] = logged_run(server, hooks, agent)
    outs = [e for e in traces[True].events if e.type == "return"]
    calls = [e for e in traces[True].events if e.type == "tool_use"]
    assert len(outs) == 3 and len({e.content_ref for e in outs}) == 3  # three different texts
    assert similar(outs[0].sketch, outs[1].sketch) == similar(outs[0].sketch, outs[2].sketch) == 1.0
    assert similar(calls[0].sketch, calls[2].sketch) == 1.0 and similar(calls[0].sketch, outs[0].sketch) < 0.2
    assert all(e.sketch is None for e in traces[False].events)


TOOLS = Path(__file__).parents[1] / "signals" / "data" / "tools"  # real tool output (data/README.md)
_JEST: list[str] = []


@function_tool
def jest(path: str) -> str:
    """Run jest at path."""
    return _JEST.pop(0)


class JestModel(ScriptedModel):
    """Calls ``jest`` ``n`` times, then answers in text."""

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.calls += 1
        if self.calls <= self.n:
            item = function_call("jest", {"path": "."}, call_id=f"jest{self.calls}")
        else:
            item = assistant_message("jest passes")
        usage = Usage(requests=1, input_tokens=10, output_tokens=2, total_tokens=12)
        return ModelResponse(output=[item], usage=usage, response_id=None)


def test_tool_results_carry_progress(server: LiveServer) -> None:
    traces = {}
    for progress in (True, False):
        _JEST[:] = [(TOOLS / "jest-fail.txt").read_text(), (TOOLS / "jest-pass.txt").read_text()]
        hooks = StopServeHooks(server.url, safety={"max_turns": 50}, timeout=2.0, progress=progress)
        traces[progress] = logged_run(server, hooks, Agent(name="coder", tools=[jest], model=JestModel(n=2)))
    outs = [e.progress for e in traces[True].events if e.type == "return" and e.tool == "jest"]
    assert [(p.tests_passed, p.tests_failed, p.source) for p in outs if p is not None] == [
        (2, 1, "jest"),
        (3, 0, "jest"),
    ]
    assert outs[0] is not None and outs[0].error is not None  # the failing test, signed
    assert all(e.progress is None for e in traces[False].events)


class Stubborn(ScriptedModel):
    """Calls ``run_tests`` as its :class:`~nudges.Plan` says, then answers ``done``; it keeps
    the input of every request."""

    def __init__(self, heeds: bool = False) -> None:
        super().__init__(n=0)
        self.plan = Plan(heeds)
        self.inputs: list[list[Any]] = []

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.calls += 1
        items = kwargs["input"]
        self.inputs.append(list(items) if isinstance(items, list) else [items])
        path = self.plan.next_path(bool(nudges_in(self.inputs[-1][-1:])))
        if path is None:
            item = assistant_message("done")
        else:
            item = function_call("run_tests", {"path": path}, call_id=f"call{self.calls}")
        usage = Usage(requests=1, input_tokens=10, output_tokens=2, total_tokens=12)
        return ModelResponse(output=[item], usage=usage, response_id=None)


def nudges_in(items: list[Any]) -> list[str]:
    return [
        i["content"]
        for i in items
        if isinstance(i, dict) and i.get("role") == "user" and str(i.get("content")).startswith(NUDGE_START)
    ]


def nudged_run(server: LiveServer, model: Stubborn, **kwargs: Any) -> tuple[StopServeHooks, Any]:
    hooks = StopServeHooks(server.url, safety={"max_turns": 50}, timeout=2.0, **kwargs)
    agent = hooks.attach(make_agent(model))

    async def main() -> Any:
        run_config = hooks.run_config(RUN_CONFIG)
        result = await Runner.run(agent, "fix it", hooks=hooks, max_turns=30, run_config=run_config)
        await hooks.aclose()
        return result

    return hooks, asyncio.run(main())


def test_a_repeated_call_is_nudged_then_stopped(server: LiveServer) -> None:
    """The same call and result six times (the default threshold): the next model request
    carries the nudge, once per decision; repeating on, the run stops two repeats later."""
    model = Stubborn()
    hooks, result = nudged_run(server, model)
    assert_stopped_after_nudges(hooks.stop_decision)
    assert result.final_output.startswith("stopserve: stop (loop_detected)")
    assert model.calls == 8
    # requests 7 and 8 follow the sixth and seventh results
    assert_each_nudge_sent_once(
        [nudges_in(r) for r in model.inputs], [nudges_in(r[-1:]) for r in model.inputs]
    )


def test_a_model_that_heeds_the_nudge_is_not_stopped(server: LiveServer) -> None:
    model = Stubborn(heeds=True)
    hooks, result = nudged_run(server, model)
    assert result.final_output == "done"  # its own answer, after three other paths
    assert hooks.stop_decision is None and model.calls == 10
    assert [len(nudges_in(i)) for i in model.inputs] == [0] * 6 + [1, 0, 0, 0]


def test_nudge_false_delivers_nothing(server: LiveServer) -> None:
    model = Stubborn(heeds=True)
    hooks, result = nudged_run(server, model, nudge=False)
    assert_stopped_after_nudges(hooks.stop_decision)
    assert model.calls == 8 and not any(nudges_in(i) for i in model.inputs)
    assert result.final_output.startswith("stopserve: stop (loop_detected)")  # it never heard


def test_run_config_keeps_the_filter_it_had(server: LiveServer) -> None:
    seen: list[int] = []

    def count(data: Any) -> Any:
        seen.append(len(data.model_data.input))
        return data.model_data

    hooks = StopServeHooks(server.url, safety={"max_turns": 2}, timeout=2.0)
    config = hooks.run_config(RunConfig(tracing_disabled=True, call_model_input_filter=count))
    agent = hooks.attach(make_agent(ScriptedModel(n=5)))
    asyncio.run(Runner.run(agent, "x", hooks=hooks, run_config=config))
    assert seen == [1, 3]  # the task; then the task, the call and its result
