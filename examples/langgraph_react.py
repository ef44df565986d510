"""A LangGraph ReAct graph routed by stopserve (docs/integrations.md, "LangGraph").

Start the service first (``stopserve serve``: port 8080, or set ``STOPSERVE_URL``), then
``python examples/langgraph_react.py``. Offline: the model is langchain-core's
``FakeMessagesListChatModel``, which answers with a scripted list of messages (no API key,
no network). It calls the same failing test every turn: stopserve's loop detector ends the
run, and ``router.stop_node`` puts the reason in the graph's last message.
"""

from __future__ import annotations

import os
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from stopserve.integrations.langgraph import StopServeRouter

URL = os.environ.get("STOPSERVE_URL", "http://127.0.0.1:8080")


@tool
def run_tests(path: str) -> str:
    """Run the test suite at path."""
    return f"{path}: 1 failed (test_parse: ValueError: empty string)"


tools = [run_tests]
# a scripted, offline model stuck on one call
model = FakeMessagesListChatModel(
    responses=[
        AIMessage(content="", tool_calls=[{"name": "run_tests", "args": {"path": "tests/"}, "id": f"call{i}"}])
        for i in range(100)
    ]
)


def call_model(state: MessagesState) -> dict[str, Any]:
    """The agent node: your model with your tools bound."""
    return {"messages": [model.invoke(state["messages"])]}


def main() -> None:
    router = StopServeRouter(URL, on_stop="stopserve")  # replaces tools_condition
    builder = StateGraph(MessagesState)
    builder.add_node("agent", call_model); builder.add_node("tools", router.nudging(ToolNode(tools)))  # fmt: skip
    builder.add_node("stopserve", router.stop_node); builder.add_edge("stopserve", END)  # fmt: skip
    builder.add_edge(START, "agent"); builder.add_conditional_edges("agent", router); builder.add_edge("tools", "agent")  # fmt: skip
    config = {"configurable": {"thread_id": "run-42"}, "recursion_limit": 2 * 40 + 5}
    state = builder.compile().invoke({"messages": [("user", "Fix the failing test")]}, config)
    router.outcome({"team": 1.0}, config=config)
    print(state["messages"][-1].content)  # the stop's reason, by the "stopserve" node


if __name__ == "__main__":
    main()
