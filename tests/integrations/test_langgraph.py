"""StopServeRouter in a real LangGraph ReAct graph, driven by a fake chat model, against a real server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from nudges import Plan, assert_nudge_texts, assert_stopped_after_nudges
from servers import LiveServer
from sketchkit import similar, traceback_at

pytest.importorskip("langgraph")

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from stopserve.api import DecideResponse
from stopserve.integrations._common import RunClock
from stopserve.integrations.langgraph import StopServeRouter, events_from_messages
from stopserve.trace import read_traces


@tool
def run_tests(path: str) -> str:
    """Run the test suite at path."""
    return "1 failed"


def scripted(n: int) -> FakeMessagesListChatModel:
    replies = [
        AIMessage(
            content="",
            tool_calls=[{"name": "run_tests", "args": {"path": f"t{i}"}, "id": f"call{i}"}],
            usage_metadata={"input_tokens": 100, "output_tokens": 20, "total_tokens": 120},
        )
        for i in range(n)
    ]
    replies.append(AIMessage(content="done"))
    return FakeMessagesListChatModel(responses=replies)


def build(
    router: StopServeRouter,
    n: int = 20,
    with_stop_node: bool = False,
    model: Any = None,
    tool: Any = None,
    nudging: bool = False,
) -> Any:
    model = model or scripted(n)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    tools = ToolNode([tool or run_tests])
    builder.add_node("tools", router.nudging(tools) if nudging else tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", router)
    builder.add_edge("tools", "agent")
    if with_stop_node:
        builder.add_node("stopserve", router.stop_node)
        builder.add_edge("stopserve", END)
    return builder.compile()


def test_message_mapping() -> None:
    messages = [
        HumanMessage(content="fix it", id="h"),
        AIMessage(
            content="",
            id="a",
            tool_calls=[
                {"name": "ls", "args": {}, "id": "c1"},
                {"name": "cat", "args": {"f": "x"}, "id": "c2"},
            ],
            usage_metadata={"input_tokens": 5, "output_tokens": 2, "total_tokens": 7},
        ),
        ToolMessage(content="a.py", tool_call_id="c1", name="ls", id="t1"),
        ToolMessage(content="no such file", tool_call_id="c2", name="cat", id="t2", status="error"),
    ]
    seen: set[str] = set()
    events = events_from_messages(messages, RunClock(), seen)
    assert [e.type for e in events] == ["communicate", "tool_use", "tool_use", "return", "return"]
    assert events[0].role == "human"
    assert [e.tokens for e in events[1:3]] == [7, None]
    assert [e.tool for e in events[1:]] == ["ls", "cat", "ls", "cat"]
    assert [e.error for e in events[3:]] == [False, True]
    assert events_from_messages(messages, RunClock(), seen) == []  # only new messages are mapped
    # a reply without tool calls: its node hands the turn back (a decision point)
    answer = AIMessage(content="fixed", id="z", name="coder")
    assert [(e.type, e.agent) for e in events_from_messages([answer], RunClock())] == [("return", "coder")]
    old = events_from_messages([answer], RunClock(), replies_as_turns=False)
    assert [e.type for e in old] == ["communicate"]  # the earlier mapping, on request


def test_graph_ends_when_the_service_says_stop(server: LiveServer) -> None:
    router = StopServeRouter(server.url, safety={"max_turns": 2}, timeout=2.0, on_stop="stopserve")
    graph = build(router, with_stop_node=True)
    config = {"configurable": {"thread_id": "lg-1"}, "recursion_limit": 2 * 2 + 5}
    state = graph.invoke({"messages": [HumanMessage(content="fix the failing test")]}, config)
    last = state["messages"][-1]
    assert isinstance(last, AIMessage) and last.name == "stopserve"
    assert last.content.startswith("stopserve: stop (budget_exhausted), safety net max_turns")
    assert last.response_metadata["stopserve"]["turn"] == 2
    assert sum(isinstance(m, ToolMessage) for m in state["messages"]) == 2
    out = router.outcome({"team": 1.0}, config=config)
    router.close()
    assert out is not None
    trace = next(t for t in read_traces(server.log_dir / "traces.jsonl") if t.trace_id == "langgraph-lg-1")
    assert [e.type for e in trace.events].count("return") == 2
    assert trace.stop is not None and trace.stop.reason == "budget_exhausted"
    assert sum(e.tokens or 0 for e in trace.events) == 3 * 120


def test_router_defers_to_tools_condition_when_continuing(server: LiveServer) -> None:
    router = StopServeRouter(server.url, safety={"max_turns": 50}, timeout=2.0)
    graph = build(router, n=3)
    state = graph.invoke({"messages": [HumanMessage(content="go")]})  # no thread id: first message id
    assert state["messages"][-1].content == "done"  # the model's own answer ended the run
    decision = router.decision(state)
    # three tool results and the final answer (the agent node hands its turn back)
    assert decision is not None and decision.action == "continue" and decision.turn == 4


def test_async_graph(server: LiveServer) -> None:
    router = StopServeRouter(server.url, safety={"max_turns": 1}, timeout=2.0)
    graph = build(router)
    config = {"configurable": {"thread_id": "lg-async"}}
    state = asyncio.run(graph.ainvoke({"messages": [HumanMessage(content="go")]}, config))
    assert sum(isinstance(m, ToolMessage) for m in state["messages"]) == 1
    d = router.decision(config=config)
    assert d is not None and d.action == "stop" and d.safety_net == "max_turns"


@pytest.mark.timeout(60)
def test_server_killed_mid_run(tmp_path: Path) -> None:
    """Kill -9 the sidecar mid-run: the graph neither hangs nor crashes; decisions turn degraded."""
    srv = LiveServer(log_dir=tmp_path, no_model=True).start()
    try:
        router = StopServeRouter(srv.url, safety={"max_turns": 4}, timeout=0.2, on_stop="stopserve")
        graph = build(router, with_stop_node=True)
        config = {"configurable": {"thread_id": "lg-kill"}, "recursion_limit": 40}
        degraded: list[bool] = []
        for chunk in graph.stream({"messages": [HumanMessage(content="go")]}, config, stream_mode="updates"):
            d = router.decision(config=config)
            if "agent" in chunk and d is not None:
                degraded.append(d.degraded)
            if "tools" in chunk and len(degraded) == 2:
                srv.kill()
            final = chunk
    finally:
        srv.stop()
    message = final["stopserve"]["messages"][-1]
    assert "max_turns" in message.content and "degraded" in message.content
    assert message.response_metadata["stopserve"]["degraded"] is True


def test_router_asks_only_at_decision_points(server: LiveServer) -> None:
    """The first routing (task + first tool call) asks nothing; later ones ask at the tool
    result, holding the next tool call back; the outcome delivers what is still held."""
    router = StopServeRouter(server.url, safety={"max_turns": 2}, timeout=2.0)
    alone = {"configurable": {"thread_id": "lg-first-call"}}
    first = {"messages": [HumanMessage(content="go", id="h"), scripted(1).invoke([])]}
    assert router(first, alone) == "tools"
    assert router.decision(config=alone) is None  # no decision point yet: nothing asked
    config = {"configurable": {"thread_id": "lg-points"}, "recursion_limit": 20}
    state = build(router).invoke({"messages": [HumanMessage(content="go")]}, config)
    d = router.decision(config=config)
    assert d is not None and d.action == "stop" and d.turn == 2
    assert state["messages"][-1].tool_calls  # the held request was never run
    assert router.outcome({"team": 0.0}, config=config) is not None
    trace = next(
        t for t in read_traces(server.log_dir / "traces.jsonl") if t.trace_id == "langgraph-lg-points"
    )
    types = [e.type for e in trace.events]
    assert types.count("return") == 2 and types[-1] == "tool_use"  # the held call, sent with the outcome


def test_stop_at_the_final_answer_keeps_it_last(server: LiveServer) -> None:
    router = StopServeRouter(server.url, safety={"max_turns": 1}, timeout=2.0, on_stop="stopserve")
    graph = build(router, n=0, with_stop_node=True)  # the model answers at once
    config = {"configurable": {"thread_id": "lg-final"}}
    state = graph.invoke({"messages": [HumanMessage(content="hi")]}, config)
    d = router.decision(config=config)
    assert d is not None and d.action == "stop" and d.turn == 1  # the answer was a turn
    assert state["messages"][-1].content == "done"  # the graph ended on its own answer


_TRIES = iter(range(10**6))


@tool
def migrate(path: str) -> str:
    """Run the migrations at path."""
    return traceback_at(next(_TRIES))


def calls_to(name: str, args: dict[str, Any], n: int, answer: str) -> FakeMessagesListChatModel:
    """A model that calls tool ``name`` ``n`` times with the same ``args``, then says ``answer``."""
    calls = [
        AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"{name}{i}"}]) for i in range(n)
    ]
    return FakeMessagesListChatModel(responses=[*calls, AIMessage(content=answer)])


def logged_run(server: LiveServer, router: StopServeRouter, model: Any, tool: Any, thread: str) -> Any:
    """One graph run of ``model`` and ``tool`` under ``router``: the trace the service logged."""
    graph = build(router, model=model, tool=tool)
    config = {"configurable": {"thread_id": thread}}
    graph.invoke({"messages": [HumanMessage(content="fix it")]}, config)
    router.outcome({"team": 0.0}, config=config)
    router.close()
    return next(
        t for t in read_traces(server.log_dir / "traces.jsonl") if t.trace_id == f"langgraph-{thread}"
    )


def test_the_same_failure_at_another_time_is_one_sketch(server: LiveServer) -> None:
    traces = {}
    for sketch in (True, False):
        router = StopServeRouter(server.url, safety={"max_turns": 50}, timeout=2.0, sketch=sketch)
        model = calls_to("migrate", {"path": "db"}, 3, "giving up")
        traces[sketch] = logged_run(server, router, model, migrate, f"lg-sketch-{sketch}")
    outs = [e for e in traces[True].events if e.type == "return" and e.tool == "migrate"]
    assert len(outs) == 3 and len({e.content_ref for e in outs}) == 3  # three different texts
    assert similar(outs[0].sketch, outs[1].sketch) == similar(outs[1].sketch, outs[2].sketch) == 1.0
    calls = [e for e in traces[True].events if e.type == "tool_use"]
    assert len(calls) == 3 and similar(calls[0].sketch, outs[0].sketch) < 0.2
    assert all(e.sketch is None for e in traces[False].events)


TOOLS = Path(__file__).parents[1] / "signals" / "data" / "tools"  # real tool output (data/README.md)
_RUNS: list[str] = []


@tool
def go_test(pkg: str) -> str:
    """Run go test on a package."""
    return _RUNS.pop(0)


def test_tool_results_carry_progress(server: LiveServer) -> None:
    # a tool's text in LangChain's list form, and a failed call (status "error") whose text is an exception
    (listed, failed) = events_from_messages(
        [
            ToolMessage(
                content=[{"type": "text", "text": (TOOLS / "cargo-fail.txt").read_text()}],
                name="cargo",
                tool_call_id="c1",
            ),
            ToolMessage(
                content="Error: KeyError('path')\n Please fix your mistakes.",
                name="read",
                tool_call_id="c2",
                status="error",
            ),
        ],
        RunClock(),
    )
    assert listed.progress is not None and listed.progress.source == "cargo"
    assert (listed.progress.tests_passed, listed.progress.tests_failed) == (1, 1)
    assert failed.progress is not None and failed.progress.error is not None
    traces = {}
    for progress in (True, False):
        _RUNS[:] = [(TOOLS / "go-fail-v.txt").read_text(), (TOOLS / "go-pass-v.txt").read_text()]
        router = StopServeRouter(server.url, safety={"max_turns": 50}, timeout=2.0, progress=progress)
        model = calls_to("go_test", {"pkg": "./..."}, 2, "the tests pass")
        traces[progress] = logged_run(server, router, model, go_test, f"lg-progress-{progress}")
    outs = [e.progress for e in traces[True].events if e.type == "return" and e.tool == "go_test"]
    assert [(p.tests_passed, p.tests_failed, p.source) for p in outs if p is not None] == [
        (1, 2, "go"),
        (3, 0, "go"),
    ]
    assert all(e.progress is None for e in traces[False].events)


class Stubborn:
    """A scripted model that calls ``run_tests`` as its :class:`~nudges.Plan` says, then answers
    ``done``; it keeps every request it received."""

    def __init__(self, heeds: bool = False) -> None:
        self.plan = Plan(heeds)
        self.requests: list[list[Any]] = []

    def invoke(self, messages: list[Any]) -> AIMessage:
        self.requests.append(list(messages))
        i = len(self.requests)
        path = self.plan.next_path(bool(nudges_in(messages[-1:])))
        if path is None:
            return AIMessage(content="done", id=f"answer{i}")
        call = {"name": "run_tests", "args": {"path": path}, "id": f"call{i}"}
        return AIMessage(content="", tool_calls=[call], id=f"call{i}")


def nudged_graph(router: StopServeRouter, model: Stubborn) -> Any:
    return build(router, with_stop_node=True, model=model, nudging=True)


def nudges_in(request: list[Any]) -> list[str]:
    return [m.content for m in request if isinstance(m, HumanMessage) and m.name == "stopserve"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_repeated_call_is_nudged_then_stopped(server: LiveServer, mode: str) -> None:
    """The same call and result six times (the default threshold): the model's next request
    carries the nudge, once per decision; repeating on, the run stops two repeats later."""
    router = StopServeRouter(server.url, safety={"max_turns": 50}, timeout=2.0, on_stop="stopserve")
    model = Stubborn()
    config = {"configurable": {"thread_id": f"lg-nudge-{mode}"}, "recursion_limit": 60}
    task = {"messages": [HumanMessage(content="fix it")]}
    graph = nudged_graph(router, model)
    state = graph.invoke(task, config) if mode == "sync" else asyncio.run(graph.ainvoke(task, config))
    assert_stopped_after_nudges(router.decision(config=config))
    # requests 1-7 carry no nudge; request 8 follows the sixth result, request 9 the seventh
    assert [len(nudges_in(r)) for r in model.requests] == [0] * 7 + [1, 2]
    first, second = nudges_in(model.requests[-1])
    assert_nudge_texts(first, second)
    assert model.requests[7][-1].content == first  # right after the tool result: read next
    assert isinstance(model.requests[7][-2], ToolMessage)
    assert state["messages"][-1].name == "stopserve" and "loop_detected" in state["messages"][-1].content


def test_a_model_that_heeds_the_nudge_is_not_stopped(server: LiveServer) -> None:
    router = StopServeRouter(server.url, safety={"max_turns": 50}, timeout=2.0, on_stop="stopserve")
    model = Stubborn(heeds=True)
    config = {"configurable": {"thread_id": "lg-nudge-heeded"}, "recursion_limit": 60}
    state = nudged_graph(router, model).invoke({"messages": [HumanMessage(content="fix it")]}, config)
    assert state["messages"][-1].content == "done"  # its own answer ended the run
    d = router.decision(config=config)
    assert d is not None and d.action == "continue" and d.reason is None and d.turn == 11
    # the nudge after the sixth result turned it (request 8); the one after the seventh came
    # with the first other path's result; none after
    assert len(model.requests) == 11 and len(nudges_in(model.requests[-1])) == 2
    router.outcome({"team": 1.0}, config=config)
    trace = next(
        t for t in read_traces(server.log_dir / "traces.jsonl") if t.trace_id == "langgraph-lg-nudge-heeded"
    )
    # the nudge is stopserve's, not the run's: no event for it
    assert [e.type for e in trace.events].count("communicate") == 1  # the task


def test_nudge_false_delivers_nothing(server: LiveServer) -> None:
    router = StopServeRouter(
        server.url, safety={"max_turns": 50}, timeout=2.0, on_stop="stopserve", nudge=False
    )
    model = Stubborn(heeds=True)
    config = {"configurable": {"thread_id": "lg-nudge-off"}, "recursion_limit": 60}
    nudged_graph(router, model).invoke({"messages": [HumanMessage(content="fix it")]}, config)
    assert_stopped_after_nudges(router.decision(config=config))  # it never heard
    assert all(not nudges_in(r) for r in model.requests) and len(model.requests) == 9


class Nudges:
    """A client whose every answer is continue, with a nudge."""

    def decide(self, run_id: str, events: Any, **kwargs: Any) -> DecideResponse:
        return DecideResponse(
            run_id=run_id, action="continue", turn=1, finalize=False, propensity=1.0, nudge="try another path"
        )


def test_nudging_wraps_a_function_node_and_a_list_state() -> None:
    router = StopServeRouter(client=Nudges())  # type: ignore[arg-type]
    call = {"name": "run_tests", "args": {}, "id": "c"}
    messages = [
        HumanMessage(content="go", id="h"),
        AIMessage(content="", tool_calls=[call], id="a"),
        ToolMessage(content="1 failed", tool_call_id="c", id="t"),
        AIMessage(content="", tool_calls=[call], id="b"),
    ]
    config = {"configurable": {"thread_id": "fn"}}

    def reply(state: Any) -> dict[str, Any]:
        return {"messages": [AIMessage(content="my turn", id="r")]}

    node = router.nudging(reply)
    assert node.invoke({"messages": messages}, config) == {"messages": [AIMessage(content="my turn", id="r")]}
    router({"messages": messages}, config)  # a decision at the tool result: it nudges
    out = node.invoke({"messages": messages}, config)["messages"]
    assert [(type(m), m.content, m.name) for m in out] == [
        (AIMessage, "my turn", None),
        (HumanMessage, "try another path", "stopserve"),
    ]
    assert len(node.invoke({"messages": messages}, config)["messages"]) == 1  # once per decision
    router(messages, {"configurable": {"thread_id": "list"}})  # a graph whose state is the list
    listed = router.nudging(lambda state: [AIMessage(content="x", id="x")])
    assert [m.content for m in listed.invoke(messages, {"configurable": {"thread_id": "list"}})] == [
        "x",
        "try another path",
    ]
