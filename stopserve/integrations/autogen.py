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
``models_usage`` -> ``tokens``. The task (a message from ``user``) and
``StopMessage`` stay ``communicate``; so does the summary of a tool call
(``ToolCallSummaryMessage``), without content: its results were the turn. Other
agent events (thoughts, streaming chunks, speaker selection) carry no action and
are skipped. ``replies_as_turns=False`` maps replies to ``communicate`` and
handoffs to a bare ``delegate``: then only tool and code results are turns (the
mapping of earlier stopserve releases).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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
    from autogen_core import Component
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("stopserve.integrations.autogen", "autogen-agentchat", exc) from exc

__all__ = ["StopServeTermination", "StopServeTerminationConfig", "events_from_messages", "stop_text"]

SOURCE = "StopServeTermination"


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
) -> list[Event]:
    """Format-v1 events for AutoGen messages (ids derive from message ids: retries are idempotent).

    ``replies_as_turns`` (default) maps an agent's reply to ``return`` (it hands its turn
    back to the team) and ends a handoff with one, so every agent turn is a decision
    point; ``False`` maps replies to ``communicate`` (only tool and code results are turns).
    Events with content carry its hash and its sketch (``sketch=False``: the hash only).
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
        if self._run_id is None:
            self._run_id = new_run_id(self._config.run_prefix)
            self._clock = RunClock()
            self._outbox = Outbox()
            self.last_decision = None
        run_id = self._run_id
        self.last_run_id = run_id
        config = self._config
        events = events_from_messages(
            messages, self._clock, replies_as_turns=config.replies_as_turns, sketch=config.sketch
        )
        ready = self._outbox.ready(events)
        if ready is None:
            return None  # no decision point yet (the task alone): nothing to ask
        decision = await self.client.decide(
            run_id, ready, task_id=self._config.task_id, system=self._config.system
        )
        self.last_decision = decision
        if decision.action != "stop":
            return None
        self._terminated = True
        return StopMessage(content=stop_text(decision), source=SOURCE)

    async def reset(self) -> None:
        """Ready for a new run (the team calls this right after any stop)."""
        self._terminated = False
        self._run_id = None

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
