"""The stuck loop through LangGraph, with a StopServeRouter given nothing but the URL.

A ReAct graph whose model calls the same tool with the same result every turn, and a
text-only graph of two agent nodes (coder, critic) where both agents repeat themselves. Both
must end at the router's stop node with the loop named, service up or down.
"""

from __future__ import annotations

from typing import Any

import pytest
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


def react_graph(router: StopServeRouter) -> Any:
    calls = [
        AIMessage(
            content="",
            tool_calls=[{"name": "run_tests", "args": {"path": "tests/test_utils.py"}, "id": f"call{i}"}],
            usage_metadata=USAGE,
        )
        for i in range(STEPS)
    ]
    model = FakeMessagesListChatModel(responses=[*calls, AIMessage(content="gave up")])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([run_tests]))
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
