"""LangGraph: a router for ``add_conditional_edges`` that returns ``END`` when stopserve says stop.

A drop-in replacement for ``tools_condition`` in a ReAct-style graph::

    router = StopServeRouter("http://127.0.0.1:8080")           # then= tools_condition
    builder.add_conditional_edges("agent", router)               # "tools" or END
    graph = builder.compile()
    state = graph.invoke({"messages": [...]}, {"recursion_limit": 60})
    router.outcome({"team": 1.0}, state=state)                   # the service logs the trace

When the service says continue the router defers to ``then`` (default:
``langgraph.prebuilt.tools_condition``); on stop it returns ``on_stop`` (default
``END``). To see the reason in the graph's own result, add
:meth:`StopServeRouter.stop_node` as a node and route to it: it appends an
``AIMessage`` named ``stopserve`` whose text gives the reason and whose
``response_metadata["stopserve"]`` holds the whole decision.

**The nudge.** A loop at its threshold is not stopped at once: for a few more repeats
the service goes on with a ``nudge``, words for the agent (docs/safety.md). Wrap the
node that runs right after the router in :meth:`StopServeRouter.nudging` (in a ReAct
graph the tool node) and the nudge reaches the model on its next call: the node's
update gets a ``HumanMessage`` named ``stopserve`` after its own messages, once per
decision::

    builder.add_node("tools", router.nudging(ToolNode(tools)))

An agent that heeds it and moves on is not stopped; one that repeats on is stopped
two repeats later (``loop_detected``). ``nudge=False``: nothing is added. Messages
named ``stopserve`` are stopserve's own and are not mapped to events.

**recursion_limit is the outer safety net.** stopserve's own nets (turns,
time, tokens, money, loops) stop a run cleanly; LangGraph's ``recursion_limit``
(default 25 super-steps) raises ``GraphRecursionError`` instead. Set it above
what the stopserve budget allows: a ReAct turn is two super-steps (agent, tools),
so with ``max_turns=N`` use ``recursion_limit >= 2 * N + 5``. It then fires only
if the service and the local fail-safe both fail to stop the run.

Which run a call belongs to: ``config["configurable"]["stopserve_run_id"]`` if
set, else the ``thread_id``, else the id of the first message in the state.

Mapping: ``AIMessage`` tool calls -> one ``tool_use`` per call; an ``AIMessage``
without calls -> ``return``: the node that wrote it hands its turn back, a decision
point, so a graph of agents that only talk is decided on turn by turn (and the loop
detector's ``repeated_reply`` sees an agent repeating itself); ``ToolMessage`` ->
``return`` (``error`` when its status is ``error``; ``progress`` from its text:
:func:`stopserve.signals.progress.extract`'s test counts, exit code, error signature,
files changed; ``progress=False``: none); ``HumanMessage`` and other
messages -> ``communicate`` (role ``human`` for a human); ``usage_metadata`` ->
``tokens``. System messages and stopserve's own (named ``stopserve``) are skipped.
``replies_as_turns=False`` maps a reply without calls to ``communicate`` (only tool
results are turns, as in earlier stopserve releases).

The router asks the service only at a decision point, with the events up to the
last one: in a ReAct graph it runs after the model already asked for the next tool,
and that request waits for the next call (or the outcome), so every decision is
made on the state right after a tool result or reply, as the model was trained. A
stop at a reply that ends the graph anyway (``then`` routes to ``END``) routes to
``END`` too: the model's own answer stays the graph's last message. A graph of
agents that only talk routes with ``then`` (who speaks next) and puts the router on
each agent node's edge.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stopserve.api import DecideResponse, OutcomeResponse
from stopserve.client import DEFAULT_TIMEOUT, StopClient
from stopserve.ids import content_refs
from stopserve.integrations._common import (
    Outbox,
    RunClock,
    integration_client,
    missing_extra,
    stop_of,
    stop_text,
)
from stopserve.objective import Objective
from stopserve.signals.progress import progress_fields
from stopserve.trace import Event, Stop, Topology

try:
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
    from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
    from langgraph.graph import END
    from langgraph.prebuilt import tools_condition
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("stopserve.integrations.langgraph", "langgraph and langchain-core", exc) from exc

__all__ = ["StopServeRouter", "events_from_messages"]

#: The name of the messages stopserve adds to a graph's state (a nudge, a stop's reason).
NAME = "stopserve"


@dataclass(slots=True)
class _Track:
    clock: RunClock = field(default_factory=RunClock)
    seen: set[str] = field(default_factory=set)
    outbox: Outbox = field(default_factory=Outbox)
    decision: DecideResponse | None = None
    nudge: str | None = None  # the latest decision's nudge, until a wrapped node delivers it


def _messages(state: Any, key: str) -> Sequence[Any]:
    if isinstance(state, list):
        return state
    if isinstance(state, Mapping):
        found = state.get(key)
    else:
        found = getattr(state, key, None)
    if not isinstance(found, list | tuple):
        raise ValueError(f"StopServeRouter: no message list at state[{key!r}]")
    return found


def _message_id(message: Any, index: int) -> str:
    mid = getattr(message, "id", None)
    return mid if isinstance(mid, str) and mid else f"m{index}"


def _tokens(message: AIMessage) -> int | None:
    usage = message.usage_metadata
    if not usage:
        return None
    total = usage.get("total_tokens")
    if total is None:
        total = usage.get("input_tokens", 0) + usage.get("output_tokens", 0)
    return max(0, int(total))


def _text(content: Any) -> str:
    """The text of a message's content: a string, or its text blocks (LangChain's list form)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            b if isinstance(b, str) else str(b.get("text", ""))
            for b in content
            if isinstance(b, str) or (isinstance(b, Mapping) and b.get("type") == "text")
        )
    return ""


def events_from_messages(
    messages: Sequence[Any],
    clock: RunClock,
    seen: set[str] | None = None,
    *,
    replies_as_turns: bool = True,
    sketch: bool = True,
    progress: bool = True,
) -> list[Event]:
    """Format-v1 events for the LangChain messages whose ids are not in ``seen`` (updated).

    ``replies_as_turns`` (default) maps an ``AIMessage`` without tool calls to ``return``
    (its node hands the turn back: a decision point), else to ``communicate``. Events with
    content carry its hash and its sketch (``sketch=False``: the hash only); tool results
    what their text shows about progress (``progress=False``: not).
    """
    seen = set() if seen is None else seen
    out: list[Event] = []
    for index, message in enumerate(messages):
        mid = _message_id(message, index)
        if mid in seen or not isinstance(message, BaseMessage) or message.name == NAME:
            continue  # stopserve's own messages (a nudge) are not the run's
        seen.add(mid)
        t = clock.now()
        items: list[dict[str, Any]] = []
        tokens: int | None = None
        if isinstance(message, AIMessage):
            agent = message.name or "assistant"
            tokens = _tokens(message)
            for i, call in enumerate(message.tool_calls):
                items.append(
                    {
                        "id": f"{mid}:{call.get('id') or i}",
                        "type": "tool_use",
                        "agent": agent,
                        "tool": call["name"],
                        **content_refs([call["name"], call.get("args")]),
                    }
                )
            if not items:
                items.append(
                    {
                        "id": mid,
                        "type": "return" if replies_as_turns else "communicate",
                        "agent": agent,
                        **content_refs(message.content),
                    }
                )
        elif isinstance(message, ToolMessage):
            items.append(
                {
                    "id": mid,
                    "type": "return",
                    "agent": message.name or "tools",
                    "tool": message.name,
                    "error": message.status == "error",
                    **content_refs(message.content),
                    # a status "success" is only the default: a tool's failure may be in its text
                    **(
                        progress_fields(
                            _text(message.content),
                            tool=message.name,
                            failed=message.status == "error" or None,
                        )
                        if progress
                        else {}
                    ),
                }
            )
        elif isinstance(message, SystemMessage):
            continue
        else:
            item: dict[str, Any] = {
                "id": mid,
                "type": "communicate",
                "agent": message.name or message.type,
                **content_refs(message.content),
            }
            if isinstance(message, HumanMessage):
                item["role"] = "human"
            items.append(item)
        for i, item in enumerate(items):
            item["t"] = t
            if tokens and i == 0:
                item["tokens"] = tokens
            if not sketch:
                item.pop("sketch", None)
            out.append(Event.model_validate(item))
    return out


class StopServeRouter:
    """A LangGraph router asking stopserve at each turn; ``END`` (or ``on_stop``) on stop.

    Thread-safe, one instance serves any number of concurrent runs (bounded by
    ``max_runs``, least recently used forgotten first). Fails safe like
    :class:`~stopserve.client.StopClient`: a dead service gives degraded local
    decisions, never an exception in the graph.
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        *,
        then: Callable[[Any], Any] | None = None,
        on_stop: str = END,
        messages_key: str = "messages",
        timeout: float = DEFAULT_TIMEOUT,
        budget: Mapping[str, Any] | None = None,
        objective: Objective | None = None,
        safety: Mapping[str, Any] | None = None,
        topology: Topology | None = None,
        task_id: str | None = None,
        system: str = "langgraph",
        run_prefix: str = "langgraph-",
        max_runs: int = 10_000,
        replies_as_turns: bool = True,
        sketch: bool = True,
        progress: bool = True,
        nudge: bool = True,
        client: StopClient | None = None,
    ) -> None:
        self.then = then if then is not None else tools_condition
        self.on_stop = on_stop
        self.messages_key = messages_key
        self.task_id = task_id
        self.system = system
        self.run_prefix = run_prefix
        self.max_runs = max_runs
        self.replies_as_turns = replies_as_turns
        self.sketch = sketch
        #: whether tool results carry what their text shows about progress
        self.progress = progress
        #: whether :meth:`nudging` nodes hand a decision's nudge to the model
        self.nudge = nudge
        self.client = client or integration_client(
            StopClient,
            url,
            timeout=timeout,
            budget=budget,
            objective=objective,
            safety=safety,
            topology=topology,
        )
        self._runs: OrderedDict[str, _Track] = OrderedDict()
        self._lock = threading.Lock()
        self.__name__ = "stopserve_router"  # LangGraph names the edge after it

    def run_id(self, state: Any = None, config: RunnableConfig | None = None) -> str:
        """The stopserve run id of a graph run (see the module docstring)."""
        configurable = (config or {}).get("configurable") or {}
        key = configurable.get("stopserve_run_id") or configurable.get("thread_id")
        if key is None and state is not None:
            messages = _messages(state, self.messages_key)
            key = _message_id(messages[0], 0) if messages else None
        if key is None:
            raise ValueError("StopServeRouter: no run id (give a thread_id or stopserve_run_id)")
        return f"{self.run_prefix}{key}"

    def _track(self, run_id: str) -> _Track:
        with self._lock:
            track = self._runs.get(run_id)
            if track is None:
                track = self._runs[run_id] = _Track()
                while len(self._runs) > self.max_runs:
                    self._runs.popitem(last=False)
            else:
                self._runs.move_to_end(run_id)
            return track

    def __call__(self, state: Any, config: RunnableConfig) -> Any:
        """Route: ``on_stop`` when stopserve says stop, else whatever ``then`` says."""
        run_id = self.run_id(state, config)
        track = self._track(run_id)
        messages = _messages(state, self.messages_key)
        turns = self.replies_as_turns
        events = events_from_messages(
            messages,
            track.clock,
            track.seen,
            replies_as_turns=turns,
            sketch=self.sketch,
            progress=self.progress,
        )
        ready = track.outbox.ready(events)
        if ready is None:
            return self.then(state)  # no decision point yet (the task, a first model call)
        decision = self.client.decide(run_id, ready, task_id=self.task_id, system=self.system)
        track.decision = decision
        track.nudge = decision.nudge if self.nudge and decision.action == "continue" else None
        if decision.action != "stop":
            return self.then(state)
        following = self.then(state)
        if following == END:
            return END  # the graph ends here anyway: keep its own last message
        return self.on_stop

    def decision(self, state: Any = None, config: RunnableConfig | None = None) -> DecideResponse | None:
        """The latest decision for a run."""
        track = self._runs.get(self.run_id(state, config))
        return track.decision if track is not None else None

    def stop_node(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """A graph node that records why stopserve stopped the run, as an ``AIMessage``."""
        decision = self.decision(state, config)
        data = decision.model_dump() if decision is not None else {}
        text = stop_text(decision) if decision is not None else "stopserve: stop (unknown)"
        message = AIMessage(content=text, name=NAME, response_metadata={"stopserve": data})
        return {self.messages_key: [message]}

    def nudging(self, node: Any) -> Runnable[Any, Any]:
        """``node`` (a runnable such as ``ToolNode``, or a function of the state) that also delivers nudges.

        When the run's latest decision went on with a ``nudge``, the node's update gets a
        ``HumanMessage`` named ``stopserve`` with it after the node's own messages (after a
        tool's result, so the model reads it on its next call), once per decision. Wrap the
        node the router routes to::

            builder.add_node("tools", router.nudging(ToolNode(tools)))
        """
        inner: Runnable[Any, Any] = node if isinstance(node, Runnable) else RunnableLambda(node)

        def run(state: Any, config: RunnableConfig) -> Any:
            return self._nudged(state, config, inner.invoke(state, config))

        async def arun(state: Any, config: RunnableConfig) -> Any:
            return self._nudged(state, config, await inner.ainvoke(state, config))

        return RunnableLambda(run, afunc=arun, name=getattr(inner, "name", None) or "stopserve_nudging")

    def _nudged(self, state: Any, config: RunnableConfig, update: Any) -> Any:
        """``update`` with the run's pending nudge after its messages (the nudge is then delivered)."""
        with self._lock:
            track = self._runs.get(self.run_id(state, config))
            text = track.nudge if track is not None else None
            if text is None or track is None:
                return update
            message = HumanMessage(content=text, name=NAME)
            new: Any
            if isinstance(update, Mapping):
                new = {**update, self.messages_key: [*update.get(self.messages_key, ()), message]}
            elif isinstance(update, list):
                new = [*update, message]  # a graph whose state is the message list
            else:
                return update  # a Command or another form: the nudge waits for the next node
            track.nudge = None
            return new

    def outcome(
        self,
        rewards: Mapping[str, float],
        *,
        state: Any = None,
        config: RunnableConfig | None = None,
        stop: Stop | None = None,
    ) -> OutcomeResponse | None:
        """Post a finished run's rewards: the service writes its whole trace to the log."""
        run_id = self.run_id(state, config)
        with self._lock:
            track = self._runs.pop(run_id, None)
        d = track.decision if track is not None else None
        if stop is None and d is not None and d.action == "stop":
            stop = stop_of(d.reason, d.safety_net, d.limit)
        held = track.outbox.drain() if track is not None else []  # after its last decision point
        return self.client.outcome(run_id, rewards, stop=stop, events=held)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self.client.close()
