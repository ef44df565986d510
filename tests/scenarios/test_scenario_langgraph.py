"""The stuck loop through LangGraph, with a StopServeRouter given nothing but the URL.

A ReAct graph whose model calls the same tool with the same result every turn, and a
text-only graph of two agent nodes (coder, critic) where both agents repeat themselves. Both
must end at the router's stop node with the loop named, service up or down.
"""

from __future__ import annotations

from typing import Any

import pytest
from nudges import Plan
from scenario_runs import LOOP_TURNS, TEXT_LOOP_TURNS, TOKENS_PER_TURN, Service

pytest.importorskip("langgraph")

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from stopserve.integrations.langgraph import StopServeRouter

USAGE = {"input_tokens": TOKENS_PER_TURN - 300, "output_tokens": 300, "total_tokens": TOKENS_PER_TURN}
STEPS = 40  # scripted turns: the graph ends on its own after them if stopserve never stops it


@tool
def run_tests(path: str) -> str:
    """Run the test suite at path."""
    return f"FAILED {path}::test_parse - AssertionError"


def react_graph(router: StopServeRouter, model: Any = None) -> Any:
    """The ReAct graph as docs/integrations.md builds it (its tool node hands on the nudges)."""
    calls = [
        AIMessage(
            content="",
            tool_calls=[{"name": "run_tests", "args": {"path": "tests/test_utils.py"}, "id": f"call{i}"}],
            usage_metadata=USAGE,
        )
        for i in range(STEPS)
    ]
    model = model or FakeMessagesListChatModel(responses=[*calls, AIMessage(content="gave up")])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", router.nudging(ToolNode([run_tests])))
    builder.add_node("stopserve", router.stop_node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", router)
    builder.add_edge("tools", "agent")
    builder.add_edge("stopserve", END)
    return builder.compile()


def text_graph(router: StopServeRouter) -> Any:
    def speaker(name: str, replies: list[str]) -> Any:
        model = FakeMessagesListChatModel(
            responses=[AIMessage(content=r, name=name, usage_metadata=USAGE) for r in replies]
        )

        def node(state: MessagesState) -> dict[str, Any]:
            return {"messages": [model.invoke(state["messages"])]}

        return node

    builder = StateGraph(MessagesState)
    builder.add_node("coder", speaker("coder", ["def parse(s):  # draft 1"] * STEPS))  # stuck on one draft
    builder.add_node("critic", speaker("critic", ["Please handle the empty string."] * STEPS))
    builder.add_node("stopserve", router.stop_node)
    builder.add_edge(START, "coder")
    builder.add_conditional_edges("coder", router, ["critic", "stopserve", END])
    builder.add_conditional_edges("critic", router, ["coder", "stopserve", END])
    builder.add_edge("stopserve", END)
    return builder.compile()


def next_speaker(state: MessagesState) -> str:
    last = state["messages"][-1]
    if len(state["messages"]) > 2 * STEPS:
        return END
    return "critic" if last.name == "coder" else "coder"


def check(state: dict[str, Any], service: Service, within: int = LOOP_TURNS) -> dict[str, Any]:
    last = state["messages"][-1]
    assert isinstance(last, AIMessage) and last.name == "stopserve", f"not stopped by stopserve: {last!r}"
    decision: dict[str, Any] = last.response_metadata["stopserve"]
    assert "loop" in last.content and decision["reason"] in ("loop_detected", "no_progress"), (
        f"{last.content}; {decision}"
    )
    assert decision["pattern"], decision
    assert decision["turn"] <= within and decision["degraded"] is service.down, decision
    print(f"\n{last.content}")
    return decision


def test_tool_loop(service: Service) -> None:
    router = StopServeRouter(service.url, on_stop="stopserve")  # nothing else: the defaults
    config = {"configurable": {"thread_id": f"react-{service.down}"}, "recursion_limit": 2 * STEPS + 10}
    try:
        state = react_graph(router).invoke(
            {"messages": [HumanMessage(content="Fix the failing test")]}, config
        )
    finally:
        router.close()
    check(state, service)


def test_text_only_graph_where_the_critic_repeats_itself(service: Service) -> None:
    router = StopServeRouter(service.url, then=next_speaker, on_stop="stopserve")
    config = {"configurable": {"thread_id": f"text-{service.down}"}, "recursion_limit": 2 * STEPS + 10}
    try:
        state = text_graph(router).invoke({"messages": [HumanMessage(content="Write parse()")]}, config)
    finally:
        router.close()
    decision = check(state, service, within=TEXT_LOOP_TURNS)
    assert decision["pattern"] in ("repeated_reply", "repeated_cycle")
    assert state["messages"][-2].name == "critic"  # its reply completed the repeat


class Heeding:
    """A model stuck on one call until a nudge ends its request; then it tries three other
    paths and answers (:class:`nudges.Plan`). It keeps every request it received."""

    def __init__(self) -> None:
        self.plan = Plan(heeds=True)
        self.requests: list[list[Any]] = []

    def invoke(self, messages: list[Any]) -> AIMessage:
        self.requests.append(list(messages))
        last = messages[-1]
        path = self.plan.next_path(isinstance(last, HumanMessage) and last.name == "stopserve")
        if path is None:
            return AIMessage(content="done", usage_metadata=USAGE)
        call = {"name": "run_tests", "args": {"path": path}, "id": f"call{len(self.requests)}"}
        return AIMessage(content="", tool_calls=[call], usage_metadata=USAGE)


def test_a_model_that_heeds_the_nudge_goes_on(service: Service) -> None:
    """Nothing but the URL: the sixth identical result brings the nudge into the model's next
    request; the model tries something else and the run is not stopped."""
    router = StopServeRouter(service.url, on_stop="stopserve")
    model = Heeding()
    config = {"configurable": {"thread_id": f"heeds-{service.down}"}, "recursion_limit": 2 * STEPS + 10}
    try:
        state = react_graph(router, model).invoke({"messages": [HumanMessage(content="Fix it")]}, config)
    finally:
        router.close()
    d = router.decision(config=config)
    assert state["messages"][-1].content == "done", d
    assert d is not None and d.action == "continue" and d.degraded is service.down, d
    nudged = [i for i, r in enumerate(model.requests, 1) if r[-1].name == "stopserve"]
    assert nudged[0] == 8 and len(model.requests) == 11, nudged  # after the sixth result
