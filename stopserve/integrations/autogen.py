"""AutoGen (autogen-agentchat >= 0.4): a termination condition that asks stopserve.

>>> from autogen_agentchat.conditions import MaxMessageTermination   # doctest: +SKIP
>>> stop = StopServeTermination("http://127.0.0.1:8080") | MaxMessageTermination(50)  # doctest: +SKIP
>>> team = RoundRobinGroupChat([coder, critic], termination_condition=stop)  # doctest: +SKIP
>>> result = await team.run(task="...")   # result.stop_reason says why  # doctest: +SKIP

AutoGen hands a termination condition only the messages produced since its last
call, so :class:`StopServeTermination` keeps the run's id and clock itself. The
team resets its condition right after any stop: the next call starts a new run,
and :meth:`StopServeTermination.outcome` still closes the one that just ended.

Mapping to format-v1 events: an agent's reply (``TextMessage`` and other chat
messages) -> ``return``: the agent hands its turn back to the team, a decision
point, so every reply is a turn; ``ToolCallRequestEvent`` -> one ``tool_use`` per
call; ``ToolCallExecutionEvent`` -> one ``return`` per result (``error`` from
``is_error``); ``HandoffMessage`` -> ``delegate``, then a ``return`` without content
(the agent's turn ends with the handoff); ``CodeGenerationEvent`` -> ``tool_use``;
``CodeExecutionEvent`` -> ``return`` (``error`` when the exit code is not 0);
``models_usage`` -> ``tokens``. A tool or code result's text gives its ``progress``
(:func:`stopserve.signals.progress.extract`: test counts, the exit code, an error
signature, files changed; ``progress=False``: none). The task (a message from ``user``) and
``StopMessage`` stay ``communicate``; so does the summary of a tool call
(``ToolCallSummaryMessage``), without content: its results were the turn. Other
agent events (thoughts, streaming chunks, speaker selection) carry no action and
are skipped. ``replies_as_turns=False`` maps replies to ``communicate`` and
handoffs to a bare ``delegate``: then only tool and code results are turns (the
mapping of earlier stopserve releases).

The nudge: a loop at its threshold is not stopped at once; for a few more repeats the
service goes on with a ``nudge``, words for the agent (docs/safety.md). A termination
condition cannot add a message, but a model client can add one to the next request:
give the repeating agent its model client through :meth:`StopServeTermination.nudging`
and the model call after a decision that nudged gets the nudge as a last
``UserMessage`` (source ``stopserve``), once; the team's messages stay as they are::

    coder = AssistantAgent("coder", model_client=stop.nudging(client), tools=[...])

``nudge=False`` (also in the component config): nothing is added.

Magentic-One: its orchestrator asks its model for a *progress ledger* every round
(``is_progress_being_made``, ``is_in_loop``) and shows it to no one but its trace log.
Give the orchestrator its model client through :meth:`StopServeTermination.read_ledger`
and each ledger is a decision point: the orchestrator's ``aggregate`` event carrying
``progress`` (``made_progress`` / ``in_loop``; never the reasons). The default
``orchestrator_ledger`` rule (docs/safety.md) stops a run whose orchestrator says it is
in a loop three ledger turns in a row; Magentic-One is then told the request is done,
with stopserve's reason, and writes its final answer (:class:`LedgerReader`)::

    stop = StopServeTermination(url) | MaxMessageTermination(50)
    team = MagenticOneGroupChat([surfer, coder], model_client=stop.read_ledger(client),
                                termination_condition=stop)
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, Final

import orjson
from pydantic import BaseModel

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
from stopserve.signals.progress import Progress, ledger_text, progress_fields
from stopserve.trace import Event, Stop, Topology

try:
    from autogen_agentchat.base import TerminatedException, TerminationCondition
    from autogen_agentchat.messages import (
        BaseAgentEvent,
        BaseChatMessage,
        CodeExecutionEvent,
        CodeGenerationEvent,
        HandoffMessage,
        StopMessage,
        ToolCallExecutionEvent,
        ToolCallRequestEvent,
        ToolCallSummaryMessage,
    )
    from autogen_core import CancellationToken, Component
    from autogen_core.models import (
        ChatCompletionClient,
        CreateResult,
        LLMMessage,
        ModelInfo,
        RequestUsage,
        UserMessage,
    )
    from autogen_core.tools import Tool, ToolSchema
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("stopserve.integrations.autogen", "autogen-agentchat", exc) from exc

__all__ = [
    "LedgerReader",
    "NudgingClient",
    "StopServeTermination",
    "StopServeTerminationConfig",
    "events_from_messages",
    "stop_text",
]

SOURCE = "StopServeTermination"
#: The source of the message a :class:`NudgingClient` adds to a model request.
NUDGE_SOURCE: Final = "stopserve"
#: The agent name of the events that carry an orchestrator's progress ledger.
ORCHESTRATOR: Final = "MagenticOneOrchestrator"


class StopServeTerminationConfig(BaseModel):
    """Declarative config of :class:`StopServeTermination` (AutoGen component config)."""

    url: str = "http://127.0.0.1:8080"
    timeout: float = DEFAULT_TIMEOUT
    budget: dict[str, Any] | None = None
    #: what cost is worth: ``{"lambda": x}`` or ``{"cost_share": s}`` (an Objective's JSON)
    objective: dict[str, Any] | None = None
    safety: dict[str, Any] | None = None
    topology: Topology | None = None
    task_id: str | None = None
    system: str = "autogen"
    run_prefix: str = "autogen-"
    replies_as_turns: bool = True
    sketch: bool = True
    progress: bool = True
    nudge: bool = True


def _tokens(message: BaseAgentEvent | BaseChatMessage) -> int | None:
    usage = message.models_usage
    if usage is None:
        return None
    return max(0, int(usage.prompt_tokens or 0)) + max(0, int(usage.completion_tokens or 0))


def events_from_messages(
    messages: Sequence[BaseAgentEvent | BaseChatMessage],
    clock: RunClock,
    *,
    replies_as_turns: bool = True,
    sketch: bool = True,
    progress: bool = True,
) -> list[Event]:
    """Format-v1 events for AutoGen messages (ids derive from message ids: retries are idempotent).

    ``replies_as_turns`` (default) maps an agent's reply to ``return`` (it hands its turn
    back to the team) and ends a handoff with one, so every agent turn is a decision
    point; ``False`` maps replies to ``communicate`` (only tool and code results are turns).
    Events with content carry its hash and its sketch (``sketch=False``: the hash only);
    tool and code results what their text shows about progress (``progress=False``: not).
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        t = clock.at(message.created_at)
        base: dict[str, Any] = {"t": t, "agent": message.source or "unknown"}
        tokens = _tokens(message)
        items: list[dict[str, Any]] = []
        if isinstance(message, ToolCallRequestEvent):
            for call in message.content:
                items.append(
                    {
                        "type": "tool_use",
                        "tool": call.name,
                        **content_refs([call.name, call.arguments]),
                    }
                )
        elif isinstance(message, ToolCallExecutionEvent):
            for result in message.content:
                items.append(
                    {
                        "type": "return",
                        "tool": result.name,
                        "error": bool(result.is_error),
                        **content_refs(result.content),
                        # is_error: the tool raised; a tool that returns a failure says so in its text
                        **(
                            progress_fields(result.content, tool=result.name, failed=result.is_error or None)
                            if progress
                            else {}
                        ),
                    }
                )
        elif isinstance(message, CodeGenerationEvent):
            items.append({"type": "tool_use", "tool": "code", **content_refs(message.content)})
        elif isinstance(message, CodeExecutionEvent):
            code = message.result
            items.append(
                {
                    "type": "return",
                    "tool": "code",
                    "error": code.exit_code != 0,
                    **content_refs(code.output),
                    **(
                        progress_fields(code.output, tool="code", exit_code=code.exit_code)
                        if progress
                        else {}
                    ),
                }
            )
        elif isinstance(message, HandoffMessage):
            items.append({"type": "delegate", "to": message.target, **content_refs(message.content)})
            if replies_as_turns:
                # the handoff ends the agent's turn; no content: a handoff's text is boilerplate,
                # the same every time, and must not count as a repeated reply
                items.append({"type": "return"})
        elif isinstance(message, ToolCallSummaryMessage):
            # the results it sums up were the turn (and its content); counting its text again
            # would make different calls with the same output look like a repeated reply
            items.append({"type": "communicate"})
        elif isinstance(message, BaseChatMessage):
            item: dict[str, Any] = {
                "type": "communicate",
                **content_refs(message.to_model_text()),
            }
            if message.source == "user":
                item["role"] = "human"
            elif replies_as_turns and not isinstance(message, StopMessage):
                item["type"] = "return"
            items.append(item)
        else:
            continue  # thoughts, streaming chunks, speaker selection: no action to count
        for i, item in enumerate(items):
            event = {**base, **item, "id": message.id if len(items) == 1 else f"{message.id}:{i}"}
            if tokens and i == 0:
                event["tokens"] = tokens  # the model call's usage, counted once
            if not sketch:
                event.pop("sketch", None)
            out.append(event)
    return [Event.model_validate(e) for e in out]


class _Wrapper(ChatCompletionClient):
    """A model client that hands every call to ``client``, the request through
    :meth:`_request` and the answer through :meth:`_read`."""

    def __init__(self, client: ChatCompletionClient, termination: StopServeTermination) -> None:
        self.client = client
        self._termination = termination

    def _request(self, messages: Sequence[LLMMessage]) -> Sequence[LLMMessage]:
        return messages

    async def _read(self, result: CreateResult) -> CreateResult:
        return result

    async def create(
        self,
        messages: Sequence[LLMMessage],
        *,
        tools: Sequence[Tool | ToolSchema] = (),
        tool_choice: Any = "auto",
        json_output: Any = None,
        extra_create_args: Mapping[str, Any] | None = None,
        cancellation_token: CancellationToken | None = None,
    ) -> CreateResult:
        """The wrapped client's answer (to the request as this wrapper makes it)."""
        result = await self.client.create(
            self._request(messages),
            tools=tools,
            tool_choice=tool_choice,
            json_output=json_output,
            extra_create_args=extra_create_args or {},
            cancellation_token=cancellation_token,
        )
        return await self._read(result)

    async def create_stream(
        self,
        messages: Sequence[LLMMessage],
        *,
        tools: Sequence[Tool | ToolSchema] = (),
        tool_choice: Any = "auto",
        json_output: Any = None,
        extra_create_args: Mapping[str, Any] | None = None,
        cancellation_token: CancellationToken | None = None,
    ) -> AsyncGenerator[str | CreateResult, None]:
        """The wrapped client's stream (to the request as this wrapper makes it)."""
        async for chunk in self.client.create_stream(
            self._request(messages),
            tools=tools,
            tool_choice=tool_choice,
            json_output=json_output,
            extra_create_args=extra_create_args or {},
            cancellation_token=cancellation_token,
        ):
            yield await self._read(chunk) if isinstance(chunk, CreateResult) else chunk

    async def close(self) -> None:
        """Close the wrapped client."""
        await self.client.close()

    def actual_usage(self) -> RequestUsage:
        """The wrapped client's."""
        return self.client.actual_usage()

    def total_usage(self) -> RequestUsage:
        """The wrapped client's."""
        return self.client.total_usage()

    def count_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = ()) -> int:
        """The wrapped client's."""
        return self.client.count_tokens(messages, tools=tools)

    def remaining_tokens(
        self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = ()
    ) -> int:
        """The wrapped client's."""
        return self.client.remaining_tokens(messages, tools=tools)

    @property
    def capabilities(self) -> Any:
        """The wrapped client's (deprecated in AutoGen: ``model_info``)."""
        return self.client.model_info

    @property
    def model_info(self) -> ModelInfo:
        """The wrapped client's."""
        return self.client.model_info


class LedgerReader(_Wrapper):
    """A Magentic-One orchestrator's model client that asks stopserve at each progress ledger.

    Every call goes to the wrapped client. An answer that holds a progress ledger
    (:func:`stopserve.signals.progress.ledger_text`) is an orchestrator's step: its verdict
    (``made_progress`` / ``in_loop``, never the text) goes to the service as the
    orchestrator's ``aggregate`` event, and when the service says stop, the orchestrator is
    answered that the request is satisfied, with stopserve's reason: Magentic-One then
    writes its final answer from what the team has (stopserve's *finalize*) and ends the
    run with that reason, instead of another round or another re-plan. Made by
    :meth:`StopServeTermination.read_ledger`.
    """

    async def _read(self, result: CreateResult) -> CreateResult:
        if not isinstance(result.content, str):
            return result
        verdict = ledger_text(result.content)
        if verdict is None:
            return result
        decision = await self._termination.ledger_turn(verdict)
        if decision is None or decision.action != "stop":
            return result
        return result.model_copy(update={"content": _satisfied(stop_text(decision))})


class NudgingClient(_Wrapper):
    """An agent's model client that hands it stopserve's nudges: the request after a decision
    that nudged ends with the nudge as a ``UserMessage`` (source ``stopserve``), once.

    Every call goes to the wrapped client. Made by :meth:`StopServeTermination.nudging`.
    """

    def _request(self, messages: Sequence[LLMMessage]) -> Sequence[LLMMessage]:
        text = self._termination.take_nudge()
        if text is None:
            return messages
        return [*messages, UserMessage(content=text, source=NUDGE_SOURCE)]


def _satisfied(reason: str) -> str:
    """A progress ledger that ends a Magentic-One run: the request satisfied, for ``reason``."""
    blank = {"reason": "", "answer": ""}
    return orjson.dumps(
        {
            "is_request_satisfied": {"reason": reason, "answer": True},
            "is_progress_being_made": {"reason": "", "answer": False},
            "is_in_loop": {"reason": "", "answer": False},
            "instruction_or_question": blank,
            "next_speaker": blank,
        }
    ).decode()


class StopServeTermination(TerminationCondition, Component[StopServeTerminationConfig]):
    """Terminate an AutoGen team when the stopserve service says stop.

    Composable with AutoGen's own conditions (``|``, ``&``). ``budget``, ``objective`` and
    ``safety`` go with every request (``safety`` also drives the local fail-safe).
    When the service is unreachable the condition keeps working on local safety
    nets: it never raises into the team because its sidecar is down.

    Every agent turn is a decision point: each reply is mapped to ``return`` (the agent
    hands its turn back), each tool or code result too, so text-only teams are decided
    on like tool-using ones (the loop detector's ``repeated_reply`` catches an agent
    giving the same reply again and again). ``replies_as_turns=False`` counts only tool
    and code results as turns, as earlier stopserve releases did.
    """

    component_config_schema = StopServeTerminationConfig
    component_provider_override = "stopserve.integrations.autogen.StopServeTermination"

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        *,
        timeout: float = DEFAULT_TIMEOUT,
        budget: Mapping[str, Any] | None = None,
        objective: Objective | Mapping[str, Any] | None = None,
        safety: Mapping[str, Any] | None = None,
        topology: Topology | None = None,
        task_id: str | None = None,
        system: str = "autogen",
        run_prefix: str = "autogen-",
        replies_as_turns: bool = True,
        sketch: bool = True,
        progress: bool = True,
        nudge: bool = True,
    ) -> None:
        if objective is not None and not isinstance(objective, Objective):
            objective = Objective.from_dict(objective)
        self._config = StopServeTerminationConfig(
            url=url,
            timeout=timeout,
            budget=dict(budget) if budget is not None else None,
            objective=objective.to_dict() if objective is not None else None,
            safety=dict(safety) if safety is not None else None,
            topology=topology,
            task_id=task_id,
            system=system,
            run_prefix=run_prefix,
            replies_as_turns=replies_as_turns,
            sketch=sketch,
            progress=progress,
            nudge=nudge,
        )
        self.client = integration_client(
            AsyncStopClient,
            url,
            timeout=timeout,
            budget=budget,
            objective=objective,
            safety=safety,
            topology=topology,
        )
        self._terminated = False
        self._run_id: str | None = None
        self._clock = RunClock()
        self._outbox = Outbox()
        self.last_run_id: str | None = None
        self.last_decision: DecideResponse | None = None
        self._n_ledgers = 0  # progress ledgers read in this run (LedgerReader)
        self._nudge: str | None = None  # the latest decision's nudge, until a NudgingClient takes it

    @property
    def terminated(self) -> bool:
        """Whether stopserve said stop (until :meth:`reset`)."""
        return self._terminated

    @property
    def run_id(self) -> str | None:
        """Id of the run in progress (``None`` before the first call after a reset)."""
        return self._run_id

    async def __call__(self, messages: Sequence[BaseAgentEvent | BaseChatMessage]) -> StopMessage | None:
        if self._terminated:
            raise TerminatedException("Termination condition has already been reached")
        run_id = self._start()
        config = self._config
        events = events_from_messages(
            messages,
            self._clock,
            replies_as_turns=config.replies_as_turns,
            sketch=config.sketch,
            progress=config.progress,
        )
        ready = self._outbox.ready(events)
        if ready is None:
            return None  # no decision point yet (the task alone): nothing to ask
        decision = await self.client.decide(
            run_id, ready, task_id=self._config.task_id, system=self._config.system
        )
        self._decided(decision)
        if decision.action != "stop":
            return None
        self._terminated = True
        return StopMessage(content=stop_text(decision), source=SOURCE)

    def _start(self) -> str:
        """The id of the run in progress, a new run's when there is none."""
        if self._run_id is None:
            self._run_id = new_run_id(self._config.run_prefix)
            self._clock = RunClock()
            self._outbox = Outbox()
            self.last_decision = None
            self._n_ledgers = 0
            self._nudge = None
        self.last_run_id = self._run_id
        return self._run_id

    def _decided(self, decision: DecideResponse) -> None:
        self.last_decision = decision
        keep = self._config.nudge and decision.action == "continue"
        self._nudge = decision.nudge if keep else None

    def take_nudge(self) -> str | None:
        """The latest decision's nudge, once (``None`` after it was taken, or with ``nudge=False``)."""
        text, self._nudge = self._nudge, None
        return text

    def nudging(self, client: ChatCompletionClient) -> NudgingClient:
        """``client`` for an agent: the request after a decision that nudged ends with the nudge.

        >>> coder = AssistantAgent("coder", model_client=stop.nudging(client), tools=tools)  # doctest: +SKIP
        """
        return NudgingClient(client, self)

    async def reset(self) -> None:
        """Ready for a new run (the team calls this right after any stop)."""
        self._terminated = False
        self._run_id = None

    def read_ledger(self, client: ChatCompletionClient) -> LedgerReader:
        """``client`` for a Magentic-One orchestrator: each progress ledger it answers is a decision point.

        >>> team = MagenticOneGroupChat(agents, model_client=stop.read_ledger(client),
        ...                             termination_condition=stop)  # doctest: +SKIP
        """
        return LedgerReader(client, self)

    async def ledger_turn(self, verdict: Progress) -> DecideResponse | None:
        """Ask the service at an orchestrator's progress ledger (``verdict``: its ``progress``).

        The ledger is the orchestrator's ``aggregate`` step, carrying only the verdict; the
        events held since the last decision point go before it. ``None`` once stopped.
        """
        if self._terminated:
            return None
        run_id = self._start()
        self._n_ledgers += 1
        event = Event.model_validate(
            {
                "id": f"{run_id}:ledger:{self._n_ledgers}",
                "t": self._clock.now(),
                "type": "aggregate",
                "agent": ORCHESTRATOR,
                "progress": verdict,
            }
        )
        ready = self._outbox.ready([event]) or [event]
        decision = await self.client.decide(
            run_id, ready, task_id=self._config.task_id, system=self._config.system
        )
        self._decided(decision)
        if decision.action == "stop":
            self._terminated = True  # the orchestrator finishes (it resets this condition as it does)
        return decision

    async def outcome(
        self, rewards: Mapping[str, float], *, run_id: str | None = None, stop: Stop | None = None
    ) -> OutcomeResponse | None:
        """Post the final rewards of the last run (or ``run_id``): the service logs its trace.

        ``stop`` defaults to stopserve's own stop when it ended the run. Returns ``None``
        when the service cannot be reached.
        """
        target = run_id or self.last_run_id
        if target is None:
            return None
        d = self.last_decision
        held: list[Event] = []
        if target == self.last_run_id:
            held = self._outbox.drain()  # events after its last decision point
            if stop is None and d is not None and d.action == "stop":
                stop = stop_of(d.reason, d.safety_net, d.limit)
        return await self.client.outcome(target, rewards, stop=stop, events=held)

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        await self.client.aclose()

    def _to_config(self) -> StopServeTerminationConfig:
        return self._config.model_copy()

    @classmethod
    def _from_config(cls, config: StopServeTerminationConfig) -> StopServeTermination:
        return cls(**config.model_dump())
