"""OpenAI Agents SDK (openai-agents): run hooks that ask stopserve and end the run cleanly.

::

    hooks = StopServeHooks("http://127.0.0.1:8080")
    agent = hooks.attach(Agent(name="coder", tools=[bash], model=...))
    result = await Runner.run(agent, task, hooks=hooks, max_turns=60)
    print(result.final_output)                  # on a stop: the reason, then the best answer so far
    await hooks.outcome({"team": 1.0})          # the service logs the whole trace

How the run ends. The hooks ask the service at each decision point: a tool result
(``on_tool_end``) and a model response that calls no tool (``on_llm_end``).
Raising from a hook is not clean (the exception escapes ``Runner.run``) and
running into ``max_turns`` raises ``MaxTurnsExceeded``. The SDK's own clean exit
after tool calls is the agent's ``tool_use_behavior``: after every tool step it
may return ``ToolsToFinalOutputResult(is_final_output=True, final_output=...)``,
and the run then finishes normally, with output guardrails, ``on_agent_end`` and
``RunResult.final_output``. :meth:`StopServeHooks.attach` returns a clone of the
agent (and of the ``Agent`` objects in its ``handoffs``, recursively; a ``Handoff``
built with ``handoff()`` is kept as it is) whose ``tool_use_behavior`` does exactly
that once the service said stop, and otherwise keeps the agent's own behaviour.
A stop that arrives in ``on_llm_end`` takes effect after that response's tool
calls ran (one tool step, no further model call); a response without tool calls
is already the final output. Keep ``max_turns`` above the stopserve budget as
the outer safety net.

**The nudge.** A loop at its threshold is not stopped at once: for a few more repeats
the service goes on with a ``nudge``, words for the agent (docs/safety.md). No hook may
change what the model is sent (``on_llm_start`` is only shown it); the SDK's
``RunConfig.call_model_input_filter`` is made for it, and :meth:`StopServeHooks.run_config`
sets it: the model call after a decision that nudged gets the nudge as a last user
message, once (the conversation itself is left as it is)::

    result = await Runner.run(agent, task, hooks=hooks, run_config=hooks.run_config())

``nudge=False``: nothing is added.

The final output on a stop is ``final_output(decision, tool_results)`` when given
(use it for typed ``output_type`` agents), else a text with the stop reason and
the last tool output.

A handoff is no tool step, so ``tool_use_behavior`` cannot end the run there. Once
the service said stop, the handoffs of the attached agents are disabled
(``Handoff.is_enabled``): the agent the run was just handed to answers without
handing off again, and that answer (or, if it calls a tool, the stop text after the
tool step) ends the run. Text-only agents handing a task back and forth end this way.

Mapping, one model response at a time (the SDK's turn): calls to local tools
(function, computer, shell, custom, apply-patch) -> ``tool_use``, their results
(``on_tool_end``) -> ``return``, with ``progress`` from the result's text
(:func:`stopserve.signals.progress.extract`: test counts, exit code, error signature,
files changed; ``progress=False``: none); handoff calls -> ``delegate`` (``to``: the agent
handed to); a response that calls no local tool is the agent's whole turn and ends
with a ``return``: its message text, or no content for a bare handoff (a handoff
call's arguments are the same every time: they must not count as a repeated
reply); the message of a response that also calls tools -> ``communicate`` (the
results are the turn's decision points); ``usage.total_tokens`` -> ``tokens``. So
every model response reaches a decision point, and the service is asked there
only. ``replies_as_turns=False`` maps messages to ``communicate`` and handoffs to a
bare ``delegate`` (only tool results are turns, as in earlier stopserve releases).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any, Final

from stopserve.api import DecideResponse, OutcomeResponse
from stopserve.client import DEFAULT_TIMEOUT, AsyncStopClient
from stopserve.ids import content_refs
from stopserve.integrations._common import (
    Outbox,
    RunClock,
    integration_client,
    missing_extra,
    new_run_id,
    stop_of,
    stop_text,
)
from stopserve.objective import Objective
from stopserve.signals.progress import progress_fields
from stopserve.trace import Event, Stop, Topology

try:
    from agents import Agent, Handoff, RunConfig, RunContextWrapper, RunHooks, Tool, handoff
    from agents.agent import ToolsToFinalOutputResult
    from agents.items import ModelResponse
    from agents.run_config import CallModelData, ModelInputData
    from agents.tool import FunctionToolResult
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("stopserve.integrations.openai_agents", "openai-agents", exc) from exc

__all__ = ["StopServeHooks", "stop_text"]

FinalOutput = Callable[[DecideResponse, list[FunctionToolResult]], Any]

#: Response items that call a tool the SDK runs locally (``on_tool_end`` follows each).
LOCAL_TOOL_CALLS: Final = frozenset(
    {
        "function_call",
        "computer_call",
        "local_shell_call",
        "shell_call",
        "custom_tool_call",
        "apply_patch_call",
    }
)


def _call_refs(item: Any, kind: str) -> tuple[str, dict[str, str]]:
    """The tool name and the content fields (ref and sketch) of a local tool call item."""
    if kind == "function_call":
        name = str(getattr(item, "name", "tool"))
        return name, content_refs([name, getattr(item, "arguments", "")])
    name = str(getattr(item, "name", None) or kind.removesuffix("_call"))
    dump = getattr(item, "model_dump", None)
    payload = dump(mode="json", exclude={"id", "call_id", "status"}) if callable(dump) else str(item)
    return name, content_refs(payload)


def _default_final(decision: DecideResponse, results: list[FunctionToolResult]) -> str:
    last = str(results[-1].output) if results else ""
    return stop_text(decision) + (f"\n\n{last}" if last else "")


class StopServeHooks(RunHooks[Any]):
    """``RunHooks`` that ask stopserve each turn; with :meth:`attach`, a stop ends the run cleanly.

    One instance follows one run at a time: a new run starts at the first hook
    after the previous one finished (``on_agent_end``) or was stopped. Pass
    ``run_id`` to choose the id yourself. Fails safe like the client: a dead
    service gives degraded local decisions, never an exception in the run.
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        *,
        final_output: FinalOutput | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        budget: Mapping[str, Any] | None = None,
        objective: Objective | None = None,
        safety: Mapping[str, Any] | None = None,
        topology: Topology | None = None,
        task_id: str | None = None,
        system: str = "openai-agents",
        run_prefix: str = "agents-",
        run_id: str | None = None,
        replies_as_turns: bool = True,
        sketch: bool = True,
        progress: bool = True,
        nudge: bool = True,
        client: AsyncStopClient | None = None,
    ) -> None:
        self.client = client or integration_client(
            AsyncStopClient,
            url,
            timeout=timeout,
            budget=budget,
            objective=objective,
            safety=safety,
            topology=topology,
        )
        self.replies_as_turns = replies_as_turns
        #: whether events with content carry its sketch beside its hash
        self.sketch = sketch
        #: whether tool results carry what their text shows about progress
        self.progress = progress
        #: whether :meth:`run_config`'s filter hands a decision's nudge to the model
        self.nudge = nudge
        self._nudge: str | None = None  # the latest decision's nudge, until a model call is sent it
        self.final_output = final_output or _default_final
        self.task_id = task_id
        self.system = system
        self.run_prefix = run_prefix
        self._fixed_run_id = run_id
        self._run_id: str | None = None
        self._clock = RunClock()
        self._outbox = Outbox()
        self._n = 0
        self.last_run_id: str | None = None
        self.last_decision: DecideResponse | None = None
        self.stop_decision: DecideResponse | None = None

    # -- run bookkeeping ------------------------------------------------------------------------

    @property
    def run_id(self) -> str | None:
        """Id of the run in progress."""
        return self._run_id

    def _current(self) -> str:
        if self._run_id is None:
            self._run_id = self._fixed_run_id or new_run_id(self.run_prefix)
            self._clock = RunClock()
            self._outbox = Outbox()
            self._n = 0
            self.stop_decision = None
            self.last_decision = None
            self._nudge = None
            self.last_run_id = self._run_id
        return self._run_id

    def _event(self, **fields: Any) -> Event:
        self._n += 1
        if not self.sketch:
            fields.pop("sketch", None)
        return Event.model_validate({"id": f"{self._current()}-{self._n}", "t": self._clock.now(), **fields})

    async def _ask(self, events: list[Event]) -> DecideResponse | None:
        run_id = self._current()
        ready = self._outbox.ready(events)
        if ready is None:
            return None  # tool calls only: the service is asked at their results
        decision = await self.client.decide(run_id, ready, task_id=self.task_id, system=self.system)
        self.last_decision = decision
        self._nudge = decision.nudge if self.nudge and decision.action == "continue" else None
        if decision.action == "stop" and self.stop_decision is None:
            self.stop_decision = decision
        return decision

    # -- hooks ----------------------------------------------------------------------------------

    async def on_agent_start(self, context: Any, agent: Any) -> None:
        self._current()

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        targets = _handoff_targets(agent)
        items: list[dict[str, Any]] = []
        calls_tools = False
        for item in response.output:
            kind = getattr(item, "type", None)
            if kind == "function_call" and getattr(item, "name", None) in targets:
                name, refs = _call_refs(item, kind)
                items.append({"type": "delegate", "to": targets[name], **refs})
            elif kind in LOCAL_TOOL_CALLS:
                name, refs = _call_refs(item, str(kind))
                items.append({"type": "tool_use", "tool": name, **refs})
                calls_tools = True
            elif kind == "message":
                texts = [getattr(c, "text", "") for c in getattr(item, "content", [])]
                items.append({"type": "communicate", **content_refs("".join(texts))})
            # reasoning and hosted tools (their results are in this response) carry no action
        if self.replies_as_turns and not calls_tools:
            # the response is the agent's whole turn: it hands the turn back (a decision point)
            messages = [i for i in items if i["type"] == "communicate"]
            if messages:
                messages[-1]["type"] = "return"
            else:
                items.append({"type": "return"})
        tokens = int(getattr(response.usage, "total_tokens", 0) or 0)
        if tokens and not items:
            items.append({"type": "communicate"})
        if tokens:
            items[0]["tokens"] = tokens  # the model call's usage, counted once
        await self._ask([self._event(agent=agent.name, **fields) for fields in items])

    async def on_tool_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool, result: object
    ) -> None:
        name = getattr(tool, "name", "tool")
        text = str(result)
        read = progress_fields(text, tool=name) if self.progress else {}
        event = self._event(type="return", agent=agent.name, tool=name, **content_refs(text), **read)
        await self._ask([event])

    async def on_handoff(self, context: RunContextWrapper[Any], from_agent: Any, to_agent: Any) -> None:
        # the handoff call itself was a delegate event; nothing to ask until the next agent acts
        return None

    async def on_agent_end(self, context: Any, agent: Any, output: Any) -> None:
        self._run_id = None  # the run is over; the next hook starts a new one

    # -- ending the run cleanly -----------------------------------------------------------------

    def attach(self, agent: Agent[Any]) -> Agent[Any]:
        """A clone of ``agent`` (and of the agents it hands off to) that ends the run on a stop."""
        return self._attach(agent, {})

    def _attach(self, agent: Agent[Any], done: dict[int, Agent[Any]]) -> Agent[Any]:
        if id(agent) in done:
            return done[id(agent)]
        original = agent.tool_use_behavior

        async def behavior(
            context: RunContextWrapper[Any], results: list[FunctionToolResult]
        ) -> ToolsToFinalOutputResult:
            if self.stop_decision is not None:
                output = self.final_output(self.stop_decision, results)
                if inspect.isawaitable(output):
                    output = await output
                return ToolsToFinalOutputResult(is_final_output=True, final_output=output)
            return await _original_behavior(original, context, results)

        clone = agent.clone(tool_use_behavior=behavior)
        done[id(agent)] = clone
        handoffs: list[Any] = []
        for target in agent.handoffs:
            if isinstance(target, Agent):
                # disabled once stopped: the next agent answers instead of handing off again
                handoffs.append(handoff(self._attach(target, done), is_enabled=self._handoffs_enabled))
            else:
                handoffs.append(target)
        clone.handoffs = handoffs
        return clone

    def run_config(self, config: RunConfig | None = None) -> RunConfig:
        """``config`` (or a new ``RunConfig``) whose model input filter hands on the nudges.

        Its ``call_model_input_filter`` is :meth:`nudge_input`, after the one ``config``
        already has.
        """
        config = config if config is not None else RunConfig()
        before = config.call_model_input_filter

        async def filter_input(data: CallModelData[Any]) -> ModelInputData:
            if before is not None:
                out = before(data)
                data = dataclasses.replace(data, model_data=await out if inspect.isawaitable(out) else out)
            return self.nudge_input(data)

        return dataclasses.replace(config, call_model_input_filter=filter_input)

    def nudge_input(self, data: CallModelData[Any]) -> ModelInputData:
        """A ``call_model_input_filter``: the model input, with the pending nudge as a last user message.

        Once per decision: the nudge goes to the first model call after it.
        """
        text, self._nudge = self._nudge, None
        model = data.model_data
        if text is None:
            return model
        return ModelInputData(
            input=[*model.input, {"role": "user", "content": text}], instructions=model.instructions
        )

    def _handoffs_enabled(self, context: RunContextWrapper[Any], agent: Any) -> bool:
        return self.stop_decision is None

    async def outcome(
        self, rewards: Mapping[str, float], *, run_id: str | None = None, stop: Stop | None = None
    ) -> OutcomeResponse | None:
        """Post the final rewards of the last run (or ``run_id``): the service logs its trace."""
        target = run_id or self.last_run_id
        if target is None:
            return None
        d = self.stop_decision
        held: list[Event] = []
        if target == self.last_run_id:
            held = self._outbox.drain()  # events after its last decision point
            if stop is None and d is not None:
                stop = stop_of(d.reason, d.safety_net, d.limit)
        if target == self._run_id:
            self._run_id = None
        return await self.client.outcome(target, rewards, stop=stop, events=held)

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        await self.client.aclose()


def _handoff_targets(agent: Any) -> dict[str, str]:
    """Tool name -> agent name of each handoff an agent offers (``Agent`` or ``Handoff``)."""
    out: dict[str, str] = {}
    for target in getattr(agent, "handoffs", None) or ():
        if isinstance(target, Agent):
            out[Handoff.default_tool_name(target)] = target.name
        elif isinstance(target, Handoff):
            out[target.tool_name] = target.agent_name
    return out


async def _original_behavior(
    behavior: Any, context: RunContextWrapper[Any], results: list[FunctionToolResult]
) -> ToolsToFinalOutputResult:
    """The agent's own ``tool_use_behavior``, as the SDK would apply it."""
    if not results or behavior == "run_llm_again":
        return ToolsToFinalOutputResult(is_final_output=False, final_output=None)
    if behavior == "stop_on_first_tool":
        return ToolsToFinalOutputResult(is_final_output=True, final_output=results[0].output)
    if isinstance(behavior, dict):
        names = behavior.get("stop_at_tool_names", [])
        for result in results:
            if result.tool.name in names:
                return ToolsToFinalOutputResult(is_final_output=True, final_output=result.output)
        return ToolsToFinalOutputResult(is_final_output=False, final_output=None)
    if callable(behavior):
        out = behavior(context, results)
        if inspect.isawaitable(out):
            out = await out
        if isinstance(out, ToolsToFinalOutputResult):
            return out
    return ToolsToFinalOutputResult(is_final_output=False, final_output=None)
