"""Request and response models of the HTTP API (version 1).

Shared by the service and the client; no FastAPI import here, so a client
never pays for the server's dependencies. Field names are the wire names.

>>> DecideRequest.model_validate({"events": [], "lambda": 0.1}).lam
0.1
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from stopserve.ids import RUN_ID_PATTERN
from stopserve.trace import Budget, Event, Progress, Stop, StopReason, Topology

__all__ = [
    "API_VERSION",
    "MAX_ID_CHARS",
    "MAX_INT",
    "MAX_NUMBER",
    "MAX_TEXT_CHARS",
    "ApiBudget",
    "ApiEvent",
    "ApiProgress",
    "BatchDecideRequest",
    "BatchDecideResponse",
    "BatchItem",
    "BatchResult",
    "ChallengerInfo",
    "ChallengerRequest",
    "ChampionInfo",
    "CreditEvent",
    "CreditResponse",
    "CreditValue",
    "DecideRequest",
    "DecideResponse",
    "ErrorBody",
    "ErrorDetail",
    "ErrorIssue",
    "HealthResponse",
    "ModelInfo",
    "OutcomeRequest",
    "OutcomeResponse",
    "ReadyResponse",
    "ReloadRequest",
    "ReloadResponse",
    "RunInfo",
    "StatelessDecideRequest",
]

API_VERSION = "v1"

#: Characters of an id or a name (run, task, event ids; agent, tool, role, channel, system).
MAX_ID_CHARS: Final = 256
#: Characters of a free text field (``content_ref``: a hash, or the content itself).
MAX_TEXT_CHARS: Final = 4096
#: Largest integer accepted (tokens, caps): 2**53, exact in every JSON reader.
MAX_INT: Final = 2**53
#: Largest magnitude of a number (seconds, usd, rewards, lambda): far above any real value,
#: far below where sums over a run overflow.
MAX_NUMBER: Final = 1e15
#: Entries of a rewards, costs or metrics map.
MAX_MAP_ENTRIES: Final = 64

_Id = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]
_Amount = Annotated[float, Field(ge=-MAX_NUMBER, le=MAX_NUMBER, allow_inf_nan=False)]
_OptName = Field(default=None, max_length=MAX_ID_CHARS)
_OptSigned = Field(default=None, ge=-MAX_NUMBER, le=MAX_NUMBER, allow_inf_nan=False)
_OptPositive = Field(default=None, ge=0, le=MAX_NUMBER, allow_inf_nan=False)
_OptCount = Field(default=None, ge=0, le=MAX_INT)

_EVENT_EXAMPLE: dict[str, Any] = {
    "id": "e7",
    "t": 41.5,
    "type": "return",
    "agent": "coder",
    "tokens": 1830,
    "usd": 0.0021,
}


class ApiProgress(Progress):
    """An event's :class:`~stopserve.trace.Progress` with its numbers in range."""

    tests_passed: int | None = _OptCount
    tests_failed: int | None = _OptCount
    exit_code: int | None = Field(default=None, ge=-MAX_INT, le=MAX_INT)
    files_changed: int | None = _OptCount


class ApiEvent(Event):
    """A format-v1 event as the service takes it: ids and names capped, every number in range.

    A trace file may hold anything format v1 allows; a request may not hold more than the
    service will keep and log (docs/service.md, Limits).
    """

    id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    t: float = Field(ge=0, le=MAX_NUMBER, allow_inf_nan=False)
    agent: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    role: str | None = _OptName
    from_: str | None = Field(default=None, alias="from", max_length=MAX_ID_CHARS)
    to: str | None = _OptName
    tool: str | None = _OptName
    content_ref: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)
    tokens: int | None = _OptCount
    usd: float | None = _OptPositive
    value: float | None = _OptSigned
    channel: str | None = _OptName
    grade: float | None = _OptSigned
    progress: ApiProgress | None = None


class ApiBudget(Budget):
    """A :class:`~stopserve.trace.Budget` with its caps in range."""

    max_turns: int | None = _OptCount
    max_seconds: float | None = _OptPositive
    max_tokens: int | None = _OptCount
    max_usd: float | None = _OptPositive


class _Body(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", allow_inf_nan=False)


class _DecideFields(_Body):
    budget: ApiBudget | None = Field(
        default=None, description="Caps in force for this run (turns, seconds, tokens, usd)."
    )
    lam: float | None = Field(
        default=None,
        alias="lambda",
        ge=0,
        le=MAX_NUMBER,
        allow_inf_nan=False,
        description="Cost weight (cost units per unit of reward); default: the model's.",
    )
    cost_share: float | None = Field(
        default=None,
        ge=0,
        le=100,
        allow_inf_nan=False,
        description="What cost is worth as a share of a success: 0.3 = a whole run costs 30% of what a "
        "success is worth (instead of 'lambda'); default: the model's.",
    )
    safety: dict[str, Any] | None = Field(
        default=None,
        description="Safety-net configuration (SafetyConfig JSON), overriding the server's default.",
        examples=[{"max_turns": 50, "max_usd": 5.0}],
    )
    quality_target: float | None = Field(
        default=None,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="The quality reward that means done for this run (quality_met fires at it; with none "
        "given: 1.0). Kept for the run's later calls.",
    )
    proposed_stop: bool = Field(default=False, description="The orchestrator wants to stop now.")
    topology: Topology | None = Field(default=None, description="Topology of the run (first call).")
    task_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ID_CHARS,
        description="Task id written to the trace log (default: the run id).",
    )
    system: str | None = Field(
        default=None, max_length=MAX_ID_CHARS, description="Producing system, written to the trace log."
    )


class DecideRequest(_DecideFields):
    """Body of ``POST /v1/runs/{run_id}/decide``: the events since the last call.

    Events whose ids the run has already seen are ignored, so a retry never double-counts.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "events": [_EVENT_EXAMPLE],
                    "budget": {"max_turns": 40, "max_usd": 2.0},
                    "lambda": 0.05,
                    "proposed_stop": False,
                }
            ]
        }
    )

    events: list[ApiEvent] = Field(
        default_factory=list, description="Format-v1 events (survey types accepted) since the last call."
    )
    prior_events: int | None = Field(
        default=None,
        ge=0,
        le=MAX_INT,
        description=(
            "How many of this run's events earlier calls delivered (the client counts them). "
            "Above 0 on a run the service no longer holds (evicted, expired, restarted): 409 run_evicted "
            "instead of starting the run over. 0: the events sent are the whole run (a new run, or "
            "the resend of a run the service dropped)."
        ),
    )


class StatelessDecideRequest(_DecideFields):
    """Body of ``POST /v1/decide``: the whole trace prefix; the server keeps no state."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"events": [_EVENT_EXAMPLE], "budget": {"max_turns": 40}}]}
    )

    events: list[ApiEvent] = Field(min_length=1, description="Every event of the run so far, in time order.")
    run_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ID_CHARS,
        pattern=RUN_ID_PATTERN,
        description="Echoed back; nothing is stored.",
    )


class BatchItem(DecideRequest):
    """One run's share of a batch."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"run_id": "run-1", "events": [_EVENT_EXAMPLE]}]}
    )

    run_id: str = Field(min_length=1, max_length=MAX_ID_CHARS, pattern=RUN_ID_PATTERN)


class BatchDecideRequest(_Body):
    """Body of ``POST /v1/decide:batch``: many runs in one request."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"runs": [{"run_id": "run-1", "events": [_EVENT_EXAMPLE]}]}]}
    )

    runs: list[BatchItem] = Field(min_length=1)


class DecideResponse(BaseModel):
    """The answer at one decision point."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "run_id": "run-1",
                    "action": "continue",
                    "reason": None,
                    "v_stop": -0.12,
                    "q_continue": 0.71,
                    "q_stop": 0.59,
                    "cost_to_go": 0.04,
                    "turn": 7,
                    "safety_net": None,
                    "limit": None,
                    "pattern": None,
                    "finalize": False,
                    "model_version": "2026-11-29-a1b2c3",
                    "propensity": 1.0,
                    "degraded": False,
                    "events_accepted": 1,
                    "events_ignored": 0,
                }
            ]
        }
    )

    run_id: str | None
    action: Literal["continue", "stop"]
    reason: StopReason | None = None
    v_stop: float | None = None
    q_continue: float | None = None
    q_stop: float | None = None
    cost_to_go: float | None = None
    turn: int
    safety_net: str | None = Field(default=None, description="Which safety net fired, if any.")
    rule: str | None = Field(
        default=None, description="Which base rule of the policy stopped the run, if any."
    )
    message: str | None = Field(
        default=None, description="What fired (or what a model overruled, or why no stop may come), in words."
    )
    proposal: Literal["accepted", "overruled", "vetoed", "refused"] | None = Field(
        default=None,
        description=(
            "What became of a proposed stop: accepted (stop), overruled (a model keeps the run going), "
            "vetoed (before min_turns), refused (the policy does not take proposed stops: its rules and "
            "its value decide)."
        ),
    )
    nudge: str | None = Field(
        default=None,
        description=(
            "On a continue: a loop pattern reached its threshold and the run goes on for a few more "
            "repeats; these words, handed to the agent, say what it repeats and to try something else "
            "(the integrations and hooks do; docs/safety.md)."
        ),
    )
    limit: Literal["turns", "seconds", "tokens", "usd"] | None = None
    pattern: str | None = Field(default=None, description="Loop pattern, when the loop detector fired.")
    finalize: bool = Field(description="True on stop: produce your best final answer now.")
    model_version: str | None = None
    propensity: float = Field(description="Probability with which the service chose this action.")
    explored: bool = Field(
        default=False, description="Exploration (STOPSERVE_EXPLORE) made a stop this continue."
    )
    degraded: bool = False
    events_accepted: int = 0
    events_ignored: int = Field(default=0, description="Events skipped because their ids were seen.")


class BatchResult(BaseModel):
    """One run's answer in a batch: a decision, or the error for that run alone."""

    run_id: str
    decision: DecideResponse | None = None
    error: ErrorDetail | None = None


class BatchDecideResponse(BaseModel):
    """Answers in the order of the request."""

    results: list[BatchResult]


class OutcomeRequest(_Body):
    """Body of ``POST /v1/runs/{run_id}/outcome``: closes the run, logs its trace."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"rewards": {"team": 1.0}, "stop": {"reason": "quality_met", "by": "orchestrator"}}]
        }
    )

    rewards: dict[_Id, _Amount] = Field(
        max_length=MAX_MAP_ENTRIES, description="Final rewards by channel; 'team' in [0, 1]."
    )
    stop: Stop | None = None
    events: list[ApiEvent] = Field(default_factory=list, description="Last events not yet sent, if any.")
    costs: dict[_Id, _Amount] = Field(default_factory=dict, max_length=MAX_MAP_ENTRIES)
    metrics: dict[_Id, _Amount] = Field(default_factory=dict, max_length=MAX_MAP_ENTRIES)


class OutcomeResponse(BaseModel):
    """Where the finished trace went."""

    run_id: str
    trace_id: str
    n_events: int
    n_decisions: int
    trace_log: str | None = Field(description="File the trace was appended to (None: logging disabled).")


class RunInfo(BaseModel):
    """State of a live run, for debugging."""

    run_id: str
    task_id: str
    topology: str | None
    n_events: int
    turn: int
    elapsed: float
    tokens: float
    usd: float
    n_decisions: int
    last_action: Literal["continue", "stop"] | None
    created_at: float
    last_seen_at: float
    features: dict[str, float | None] = Field(description="Current features (null: not defined yet).")


class CreditValue(BaseModel):
    """The run's value at one decision point (``index`` -1: before any event)."""

    index: int
    event_id: str | None
    turn: int
    cost: float = Field(description="Cost so far, in the model's cost unit.")
    v: float = Field(description="V(s_t) = max(S, Q - lambda K): the value of the run here.")
    s: float = Field(description="Quality handed back if the run stops here.")
    v_continue: float = Field(description="Value of going on, net of the rest of the run's cost.")
    price: float = Field(description="Quality units one cost unit is worth here.")


class CreditEvent(BaseModel):
    """One event's credit (null: after the last decision point, or not ablated)."""

    index: int
    event_id: str
    type: str
    agent: str
    role: str | None
    tokens: int
    cost: float
    point: int = Field(description="The decision point whose interval holds the event (0: none).")
    v_before: float | None
    v_after: float | None
    credit: float | None
    contribution: float | None = Field(description="The offline label, when the events carry it.")


class CreditResponse(BaseModel):
    """Message-level credit of a live run's events so far (docs/credit.md)."""

    model_config = ConfigDict(populate_by_name=True)

    run_id: str
    model_version: str | None
    method: Literal["td", "ablation"]
    split: Literal["tokens", "equal"]
    window: Literal["decision", "reward"]
    baseline: Literal["zero", "model"]
    cost_unit: str
    lam: float | None = Field(alias="lambda")
    cost_share: float | None
    values: list[CreditValue]
    events: list[CreditEvent]
    aggregates: dict[str, list[dict[str, Any]]] = Field(
        description="Credit summed by agent, role, type and agent_type; largest first."
    )


class ChallengerInfo(BaseModel):
    """A shadow model and how its decisions compare with the champion's (this process's counts)."""

    name: str
    model_version: str | None
    kind: str
    path: str
    decisions: int = Field(description="Live decisions it made beside the champion.")
    agreement: float | None = Field(description="Share of those with the champion's action.")
    runs: int = Field(description="Runs the champion stopped while it decided beside it.")
    stopped_earlier: int = Field(description="Of those, runs it had stopped at an earlier turn.")
    stopped_same: int = Field(description="... runs it stops at the same turn.")
    stopped_later: int = Field(description="... runs it would have gone on past the champion's stop.")
    mean_turns_earlier: float | None = Field(
        description="How many turns earlier it stops, on the runs it stops earlier."
    )


class ChallengerRequest(_Body):
    """Body of ``POST /v1/admin/challengers``: a model directory to decide in the shadow."""

    model_dir: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    name: _Id | None = Field(default=None, description="Default: the directory's name.")


class ChampionInfo(BaseModel):
    """What the model store says to serve (``stopserve retrain`` promotes, ``stopserve rollback`` undoes)."""

    store: str
    version: str | None
    path: str
    promotions: int = Field(description="Champions promoted here so far (rollbacks undo them).")
    following: bool = Field(description="The service serves this champion (no manual reload since).")


class ModelInfo(BaseModel):
    """The model being served."""

    kind: Literal["model", "heuristic", "none"]
    model_version: str | None
    default_lambda: float | None
    default_cost_share: float | None = None
    rule: str | None = Field(default=None, description="The base rule the policy starts from, in words.")
    path: str | None
    safety_only: bool = Field(description="True when no model is loaded and only safety nets decide.")
    feature_names: list[str]
    safety: dict[str, Any] = Field(description="The safety nets in force when a request gives none.")
    manifest: dict[str, Any]
    model_card: str | None
    loaded_at: float
    challengers: list[ChallengerInfo] = Field(
        default_factory=list, description="Shadow models deciding beside this one (never acted on)."
    )
    champion: ChampionInfo | None = Field(
        default=None, description="The model store's champion pointer, when the service follows one."
    )


class ReloadRequest(_Body):
    """Body of ``POST /v1/admin/reload`` (optional): which model directory to load."""

    model_dir: str | None = Field(default=None, description="Default: the directory already configured.")


class ReloadResponse(BaseModel):
    """Result of a successful reload."""

    previous_version: str | None
    model_version: str | None
    kind: str
    path: str | None


class HealthResponse(BaseModel):
    """Liveness."""

    status: Literal["ok"] = "ok"


class ReadyResponse(BaseModel):
    """Readiness; ``safety_only`` says when no model is loaded."""

    ready: bool
    model_version: str | None
    kind: str
    safety_only: bool
    live_runs: int
    log_ok: bool


class ErrorIssue(BaseModel):
    """One problem, located as precisely as known."""

    field: str | None = None
    message: str
    file: str | None = None
    line: int | None = None
    trace_id: str | None = None


class ErrorDetail(BaseModel):
    """What went wrong: a stable type name, a message and the located issues."""

    type: str
    message: str
    status: int
    issues: list[ErrorIssue] = Field(default_factory=list)


class ErrorBody(BaseModel):
    """Every error response has this one shape."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "error": {
                        "type": "validation_error",
                        "message": "invalid request body (1 problem)",
                        "status": 422,
                        "issues": [{"field": "body.events[0].type", "message": "'spwan' is not one of ..."}],
                    }
                }
            ]
        }
    )

    error: ErrorDetail


BatchResult.model_rebuild()
