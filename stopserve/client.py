"""Python client for the stopserve service, failing safe to local safety nets.

:class:`StopClient` (sync) and :class:`AsyncStopClient` (asyncio) talk to
``POST /v1/runs/{run_id}/decide`` over one reused httpx connection pool, with a
short per-call timeout (200 ms by default). Every event sent is also folded
into a local :class:`~stopserve.features.RunState`, so when the service is
unreachable, slow, overloaded or answers 5xx the client still answers at once
from the same safety nets (:class:`~stopserve.safety.SafetyConfig`), marking the
decision ``degraded=True``. An orchestrator never hangs or crashes because its
sidecar is down.

Retries are safe: the service ignores event ids it has already seen, so events
a failed call may or may not have delivered are simply sent again with the
next call. After a failure the client skips the service for ``cooldown``
seconds (a circuit breaker), so a dead sidecar costs one timeout, not one per
turn.

The client keeps a journal of every event of a run (up to ``max_journal``) and
tells the service how many it delivered (``prior_events``). When the service no
longer holds the run (its store evicted it, or it restarted: 409 ``run_evicted``),
the client resends the whole journal once, so the run resumes at its real turn with
its safety nets; if it cannot (journal cut short, refused), it decides that run
locally from then on, and spools its trace at the outcome.

:class:`EventRecorder` turns an orchestrator's own actions into format-v1
events (ids, clock, tokens, content hashes, and what a result's text shows about
progress: test counts, exit code, error signature, files changed)::

    client, rec = StopClient("http://127.0.0.1:8080"), EventRecorder(agent="orchestrator")
    for step in range(100):
        output = run_tool(cmd)                     # your agent loop
        rec.tool_use("bash", content=cmd, tokens=n_tokens)
        rec.returned("bash", content=output, error=failed, exit_code=code)
        if client.decide(run_id, rec.drain()).action == "stop":
            break
    client.outcome(run_id, {"team": score})
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Generic, TypedDict, TypeVar, Unpack
from urllib.parse import quote

import httpx
import orjson
from pydantic import ValidationError

from stopserve.api import DecideResponse, ModelInfo, OutcomeResponse
from stopserve.decision import to_trace, to_wire
from stopserve.error_table import error_from_answer
from stopserve.errors import (
    ConfigError,
    Issue,
    RunClosedError,
    RunEvictedError,
    RunLimitError,
    StopServeError,
    TraceValidationError,
    pydantic_issues,
)
from stopserve.features import RunState
from stopserve.ids import RUN_ID, content_ref, content_refs
from stopserve.objective import Objective
from stopserve.policy import Policy
from stopserve.safety import DEFAULT_SAFETY, SafetyConfig
from stopserve.signals.progress import progress_fields
from stopserve.trace import Budget, Event, Stop, StopReason, Topology, Trace, TraceWriter

__all__ = [
    "DEFAULT_TIMEOUT",
    "AsyncStopClient",
    "EventRecorder",
    "StopClient",
    "content_ref",
]

log = logging.getLogger("stopserve.client")

#: Seconds one HTTP call may take (each of connect, write, read) before the client decides locally.
DEFAULT_TIMEOUT: Final = 0.2
#: Status codes that mean "the service cannot answer now": decide locally, retry later.
_UNAVAILABLE: Final = frozenset({408, 425, 429, 500, 502, 503, 504})

EventLike = Event | Mapping[str, Any]
BudgetLike = Budget | Mapping[str, Any]
SafetyLike = SafetyConfig | Mapping[str, Any]
_T = TypeVar("_T")
_TransportT = TypeVar("_TransportT", httpx.BaseTransport, httpx.AsyncBaseTransport)


class _UnavailableError(Exception):
    """The service could not answer (network, timeout, 5xx, garbage): decide locally."""


class DecideOptions(TypedDict, total=False):
    """Keyword options of ``decide`` (each falls back to the client's default for every run)."""

    budget: BudgetLike | None  #: the run's caps (max_turns, max_tokens, ...)
    objective: Objective | None  #: what cost is worth (λ or a cost share; default: the service's)
    proposed_stop: bool  #: the orchestrator proposes to stop here (default False)
    safety: SafetyLike | None  #: safety nets for this call (the service applies the same)
    quality_target: float | None  #: the quality reward that means done for this run (default 1.0)
    task_id: str | None  #: the task this run works on (kept in its trace)
    system: str | None  #: the system that runs it (kept in its trace)


class OutcomeOptions(TypedDict, total=False):
    """Keyword options of ``outcome``."""

    stop: Stop | Mapping[str, Any] | None  #: how the run stopped (format v1 ``stop``)
    events: Sequence[EventLike]  #: events of the run not sent yet
    costs: Mapping[str, float] | None  #: named costs of the run
    metrics: Mapping[str, float] | None  #: named figures of the run


@dataclass(frozen=True, slots=True)
class _Call:
    """One HTTP request a call of the core needs; the transport makes it."""

    method: str
    path: str
    content: bytes | None
    timeout: httpx.Timeout


#: What the transport hands back for a request: the answer, or the failure to get one.
_Reply = httpx.Response | httpx.TransportError
#: A call of the core, written once for both transports: it yields requests, gets replies, returns T.
Flow = Generator[_Call, _Reply, _T]
_JSON: Final = {"content-type": "application/json"}


# --------------------------------------------------------------------------- event recorder


class EventRecorder:
    """Turns an orchestrator's actions into format-v1 events, with ids, clock and hashes.

    Each method records one event and returns it; :meth:`drain` hands over the events
    recorded since the last drain (what to pass to ``decide``). Times are seconds since
    the recorder was created, from a monotonic clock. Raw content is never kept: only
    its hash (:func:`content_ref`), so repetition can be detected without storing text,
    and its similarity sketch (:mod:`stopserve.signals.sketch`), so near-repeats (the same
    traceback with another timestamp) can be too; ``sketch=False`` leaves sketches out.
    A return whose content is text carries what the text shows about progress
    (:meth:`returned`); ``progress=False`` leaves that out.

    >>> rec = EventRecorder(agent="orchestrator", id_prefix="r1-")
    >>> rec.tool_use("bash", content="ls").type, rec.returned("bash", content="a.py").type
    ('tool_use', 'return')
    >>> [e.id for e in rec.drain()], rec.drain()
    (['r1-1', 'r1-2'], [])
    """

    def __init__(
        self,
        agent: str = "orchestrator",
        *,
        id_prefix: str | None = None,
        sketch: bool = True,
        progress: bool = True,
    ) -> None:
        self.agent = agent
        self.id_prefix = id_prefix if id_prefix is not None else uuid.uuid4().hex[:8] + "-"
        #: whether events with content carry its sketch (``Event.sketch``) beside its hash
        self.sketch = sketch
        #: whether returns carry what their text shows about progress (``Event.progress``)
        self.progress = progress
        self._t0 = time.monotonic()
        self._n = 0
        self._last_t = 0.0
        self._pending: list[Event] = []

    @property
    def elapsed(self) -> float:
        """Seconds since the recorder started."""
        return time.monotonic() - self._t0

    def record(
        self,
        type: str,
        *,
        agent: str | None = None,
        content: Any = None,
        tokens: int | None = None,
        usd: float | None = None,
        error: bool | None = None,
        **fields: Any,
    ) -> Event:
        """Record one event of any format-v1 type; extra ``fields`` go in as they are."""
        self._n += 1
        t = max(self._last_t, round(self.elapsed, 6))
        self._last_t = t
        data: dict[str, Any] = {
            "id": f"{self.id_prefix}{self._n}",
            "t": t,
            "type": type,
            "agent": agent or self.agent,
        }
        if content is not None:
            data.update(content_refs(content, sketch=self.sketch))
        for key, value in (("tokens", tokens), ("usd", usd), ("error", error)):
            if value is not None:
                data[key] = value
        data.update({k: v for k, v in fields.items() if v is not None})
        try:
            event = Event.model_validate(data)
        except ValidationError as exc:
            self._n -= 1
            issues = pydantic_issues(exc.errors())
            raise TraceValidationError(f"EventRecorder: invalid {type!r} event", issues) from None
        self._pending.append(event)
        return event

    def spawn(self, agent: str, **fields: Any) -> Event:
        """An agent is brought in."""
        return self.record("spawn", agent=agent, **fields)

    def delegate(self, to: str, *, content: Any = None, **fields: Any) -> Event:
        """Work is assigned to agent ``to``."""
        return self.record("delegate", to=to, content=content, **fields)

    def communicate(self, *, content: Any = None, **fields: Any) -> Event:
        """A message between agents."""
        return self.record("communicate", content=content, **fields)

    def tool_use(self, tool: str, *, content: Any = None, **fields: Any) -> Event:
        """A tool call (``content``: its arguments or command)."""
        return self.record("tool_use", tool=tool, content=content, **fields)

    def returned(
        self,
        tool: str | None = None,
        *,
        content: Any = None,
        error: bool | None = None,
        exit_code: int | None = None,
        tool_input: Any = None,
        **fields: Any,
    ) -> Event:
        """A tool or sub-agent hands a result back (a decision point).

        When ``content`` is text (or ``exit_code`` is given) the event's ``progress`` says
        what it shows (:func:`stopserve.signals.progress.extract`: test counts, the exit
        code, an error signature, files changed), read here; the text itself is only
        hashed and sketched, never sent. ``tool`` names the tool (a write tool that did
        not fail changed one file), ``error`` whether it failed (``None``: not known),
        ``exit_code`` its exit status, ``tool_input`` the call's arguments (an editor's
        ``view`` command changes no file). A ``progress`` passed in is kept as it is.

        >>> rec = EventRecorder(id_prefix="r1-")
        >>> rec.returned("bash", content="==== 3 passed in 0.12s ====", exit_code=0).progress.tests_passed
        3
        """
        if self.progress and "progress" not in fields and (isinstance(content, str) or exit_code is not None):
            fields.update(
                progress_fields(content, tool=tool, exit_code=exit_code, failed=error, tool_input=tool_input)
            )
        return self.record("return", tool=tool, content=content, error=error, **fields)

    def aggregate(self, *, content: Any = None, **fields: Any) -> Event:
        """Results are combined into an answer (a decision point)."""
        return self.record("aggregate", content=content, **fields)

    def reward(self, value: float, *, channel: str | None = None, **fields: Any) -> Event:
        """A run-time reward signal, e.g. a verifier score (a decision point)."""
        return self.record("reward", value=value, channel=channel, **fields)

    def stop(self, reason: StopReason, *, proposed: bool = False, **fields: Any) -> Event:
        """The run stops, or (``proposed=True``) the orchestrator proposes to stop."""
        return self.record("stop", reason=reason, proposed=proposed, **fields)

    def drain(self) -> list[Event]:
        """The events recorded since the last drain (and forget them)."""
        out, self._pending = self._pending, []
        return out


# --------------------------------------------------------------------------- local state


def _as_event(item: EventLike, index: int) -> Event:
    if isinstance(item, Event):
        return item
    try:
        return Event.model_validate(item)
    except ValidationError as exc:
        issues = pydantic_issues(exc.errors(), prefix=f"events[{index}]")
        raise TraceValidationError(f"invalid event at events[{index}]", issues) from None


def _as_budget(budget: BudgetLike | None) -> Budget | None:
    if budget is None or isinstance(budget, Budget):
        return budget
    try:
        return Budget.model_validate(budget)
    except ValidationError as exc:
        raise ConfigError("invalid budget", pydantic_issues(exc.errors(), prefix="budget")) from None


def _as_safety(safety: SafetyLike | None) -> SafetyConfig | None:
    if safety is None or isinstance(safety, SafetyConfig):
        return safety
    return SafetyConfig.from_dict(dict(safety), source="safety")


@dataclass(slots=True)
class _LocalRun:
    """What the client keeps per run: the folded state and events the service has not confirmed."""

    state: RunState
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> event, in order
    dropped: int = 0
    journal: list[dict[str, Any]] = field(default_factory=list)  # every event, to resend or spool
    journal_full: bool = False  # more events than max_journal: the journal cannot be resent
    delivered: int = 0  # events the service took (what prior_events says)
    local_only: bool = False  # the service's copy of the run is incomplete: decided locally
    why_local: str = ""
    task_id: str | None = None
    system: str | None = None
    #: the safety config the run's calls asked for (``safety``, ``quality_target``): kept, as the service does
    safety: SafetyConfig | None = None


class _Core:
    """All the logic of the sync and async clients, without I/O (as httpx's ``BaseClient``).

    Local state, journal, spool, retries, breaker and fallback live here. Each call
    (:meth:`decide`, :meth:`outcome`, :meth:`model`) is a generator, a :data:`Flow`: it
    yields the HTTP requests it needs (:class:`_Call`) and is sent back each answer or
    transport failure, so the two clients only make requests (``_send``).
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float,
        outcome_timeout: float,
        retries: int,
        cooldown: float,
        budget: BudgetLike | None,
        objective: Objective | None,
        safety: SafetyLike | None,
        topology: Topology | None,
        raise_on_client_error: bool,
        max_runs: int,
        max_pending: int,
        headers: Mapping[str, str] | None,
        spool: str | os.PathLike[str] | None = None,
        max_journal: int = 10_000,
        max_batch: int = 2_000,
    ) -> None:
        if timeout <= 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {timeout}")
        if retries < 0:
            raise ConfigError(f"retries must be >= 0, got {retries}")
        if max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {max_batch}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.outcome_timeout = outcome_timeout
        self.retries = retries
        self.cooldown = cooldown
        self.budget = _as_budget(budget)
        if objective is not None and not isinstance(objective, Objective):
            raise ConfigError(f"objective must be an Objective, got {type(objective).__name__}")
        self.objective = objective
        self.safety_given = _as_safety(safety)
        self.safety = self.safety_given or DEFAULT_SAFETY
        self.topology = topology
        self.raise_on_client_error = raise_on_client_error
        self.max_runs = max_runs
        self.max_pending = max_pending
        self.spool = Path(spool) if spool is not None else None
        if self.spool is not None and not self.spool.name.endswith((".jsonl", ".jsonl.gz")):
            raise ConfigError(f"spool must be a .jsonl file, got {str(spool)!r}")
        self.max_journal = max_journal
        self.max_batch = max_batch
        self._spool_lock = threading.Lock()
        self.headers = dict(headers or {})
        self._runs: OrderedDict[str, _LocalRun] = OrderedDict()
        self._down_until = 0.0
        self._lock = threading.Lock()
        self._policy = Policy.safety_only(self.safety)

    # -- local state ------------------------------------------------------------------------

    def http_timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout)

    def run(self, run_id: str, budget: Budget | None) -> _LocalRun:
        run = self._runs.get(run_id)
        if run is None:
            run = _LocalRun(RunState(topology=self.topology, budget=budget or self.budget))
            self._runs[run_id] = run
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)  # least recently used: bounded memory
        else:
            self._runs.move_to_end(run_id)
            if budget is not None:
                run.state.set_budget(budget)
        return run

    def fold(
        self,
        run_id: str,
        events: Iterable[EventLike],
        budget: BudgetLike | None,
        task_id: str | None = None,
        system: str | None = None,
    ) -> _LocalRun:
        """Fold new events locally (ignoring seen ids) and queue them for the service."""
        parsed = [_as_event(e, i) for i, e in enumerate(events)]
        with self._lock:
            run = self.run(run_id, _as_budget(budget))
            run.task_id = task_id or run.task_id
            run.system = system or run.system
            new: list[Event] = []
            ids: set[str] = set()
            for event in parsed:
                if event.id in ids or event.id in run.pending or run.state.seen(event.id):
                    continue  # a retry: the id is already folded (and queued or delivered)
                ids.add(event.id)
                new.append(event)
            run.state.fold_many(new)  # checks the whole batch before folding any of it
            for event in new:
                run.pending[event.id] = data = event.dump()
                if len(run.journal) < self.max_journal:
                    run.journal.append(dict(data))
                else:
                    run.journal_full = True
        return run

    def trim(self, run_id: str, run: _LocalRun) -> None:
        """Bound the unsent events of a run the service cannot take now (memory while it is away).

        Only called when the service did not answer: events are never dropped while it does.
        A run that lost events would be decided by the service on a state with a hole in it,
        so it is decided locally from then on (``degraded=True``), and the warning says so.
        """
        with self._lock:
            cut = len(run.pending) - self.max_pending
            if cut <= 0:
                return
            for gone in list(run.pending)[:cut]:
                del run.pending[gone]
            run.dropped += cut
            run.local_only = True
            run.why_local = f"{run.dropped} of its events were dropped while the service was away"
        log.warning(
            "stopserve: run %s: dropped %d unsent events (service away, more than max_pending=%d "
            "waiting); the run is decided locally from now on",
            run_id,
            cut,
            self.max_pending,
        )

    def sent(self, run: _LocalRun, ids: Iterable[str], *, delivered: bool = True) -> None:
        """The service took these events (or refused them for good): stop resending them."""
        with self._lock:
            for gone in ids:
                if run.pending.pop(gone, None) is not None and delivered:
                    run.delivered += 1

    def resend_bodies(self, run: _LocalRun, body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """The decide bodies that resend the whole run (after 409 run_evicted), or None if it cannot.

        One body per ``max_batch`` events; the first says ``prior_events: 0`` (a new run).
        """
        if run.journal_full or not run.journal:
            return None
        events = [{k: v for k, v in e.items() if k != "decision"} for e in run.journal]
        base = dict(body)
        for key, value in (("task_id", run.task_id), ("system", run.system)):
            if value is not None:
                base[key] = value
        starts = range(0, len(events), self.max_batch)
        return [
            {
                **base,
                "events": events[i : i + self.max_batch],
                "prior_events": i,
                "proposed_stop": base.get("proposed_stop", False) and i == starts[-1],
            }
            for i in starts
        ]

    def resent(self, run: _LocalRun) -> None:
        """The service took the whole journal again."""
        with self._lock:
            run.pending.clear()
            run.delivered = len(run.journal)

    def give_up(self, run_id: str, run: _LocalRun, why: StopServeError) -> None:
        run.local_only = True
        run.why_local = "the service dropped the run"
        log.warning("stopserve: %s; run %s is decided locally from now on", why, run_id)

    def note(self, run: _LocalRun, decision: DecideResponse) -> DecideResponse:
        """Keep the decision on the run's last event, for the spool (format v1 ``decision``)."""
        if run.journal:
            run.journal[-1]["decision"] = to_trace(decision)
        return decision

    def spool_trace(self, run_id: str, run: _LocalRun | None, body: Mapping[str, Any]) -> Path | None:
        """Append the run's trace to the spool file (the outcome could not be delivered)."""
        if self.spool is None or run is None or not run.journal:
            return None
        events = list(run.journal)
        known = {e["id"] for e in events}
        events += [e for e in body["events"] if e["id"] not in known]
        data: dict[str, Any] = {
            "trace_id": run_id,
            "task_id": run.task_id or run_id,
            "events": events,
            "rewards": body["rewards"],
            "metrics": {**body.get("metrics", {}), "client_spooled": 1.0},
        }
        for key in ("stop", "costs"):
            if key in body:
                data[key] = body[key]
        if run.system:
            data["system"] = run.system
        if run.state.budget is not None:
            data["budget"] = run.state.budget.model_dump(exclude_none=True)
        try:
            trace = Trace.model_validate(data)
            with self._spool_lock, TraceWriter(self.spool, append=True) as writer:
                writer.write(trace)
        except (ValidationError, OSError, StopServeError) as exc:
            log.error("stopserve: run %s: could not spool its trace to %s: %s", run_id, self.spool, exc)
            return None
        return self.spool

    def undelivered(self, run_id: str, run: _LocalRun | None, body: Mapping[str, Any], why: object) -> None:
        """The outcome cannot reach the service: spool the trace (when spooling) and say so."""
        where = self.spool_trace(run_id, run, body)
        log.warning(
            "stopserve: outcome of run %s not delivered (%s)%s",
            run_id,
            why,
            f"; trace spooled to {where}" if where else "",
        )

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)

    def local_decision(
        self, run_id: str, run: _LocalRun, safety: SafetyConfig | None, proposed_stop: bool
    ) -> DecideResponse:
        """What the service answers without a model (safety nets, min_turns veto), marked degraded."""
        policy = self._policy if safety is None else Policy.safety_only(safety)
        decision = to_wire(policy.decide(run.state, proposed_stop=proposed_stop))
        decision.update(run_id=run_id, degraded=True, model_version=None)
        return DecideResponse.model_validate(decision)

    # -- requests -----------------------------------------------------------------------------

    def decide_body(
        self,
        run: _LocalRun,
        *,
        budget: BudgetLike | None,
        objective: Objective | None,
        safety: SafetyConfig | None,
        proposed_stop: bool,
        extra: Mapping[str, Any],
    ) -> dict[str, Any]:
        with self._lock:
            events = list(itertools.islice(run.pending.values(), self.max_batch))
            delivered = run.delivered
        body: dict[str, Any] = {"events": events, "proposed_stop": proposed_stop, "prior_events": delivered}
        b = _as_budget(budget) or self.budget
        if b is not None:
            body["budget"] = b.model_dump(exclude_none=True)
        if (worth := self.objective if objective is None else objective) is not None:
            body.update(worth.to_wire())
        if (cfg := safety or self.safety_given) is not None:
            body["safety"] = cfg.to_dict()
        if self.topology is not None:
            body["topology"] = self.topology
        body.update({k: v for k, v in extra.items() if v is not None})
        return body

    def is_down(self) -> bool:
        return time.monotonic() < self._down_until

    def mark_down(self, why: str) -> None:
        if not self.is_down():
            log.warning("stopserve: service at %s unavailable (%s); deciding locally", self.url, why)
        self._down_until = time.monotonic() + self.cooldown

    def mark_up(self) -> None:
        if self._down_until:
            log.info("stopserve: service at %s is back", self.url)
        self._down_until = 0.0

    def check(self, response: httpx.Response, what: str) -> Any:
        """Parse a response; raise _UnavailableError for transient failures, a StopServeError for 4xx."""
        if response.status_code in _UNAVAILABLE or response.status_code >= 500:
            raise _UnavailableError(f"HTTP {response.status_code}")
        try:
            data = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise _UnavailableError(f"HTTP {response.status_code}: not JSON") from None
        if response.is_success:
            return data
        raise error_from_answer(response.status_code, data, what)

    # -- the calls, written once: each yields the HTTP requests it needs and gets their answers

    def request(
        self,
        method: str,
        path: str,
        body: Any,
        what: str,
        *,
        timeout: float | None = None,
        closed_ok_on_retry: bool = False,
    ) -> Flow[Any]:
        """One call with its retries and the breaker: the answer's JSON, or :class:`_UnavailableError`."""
        call = _Call(
            method,
            path,
            orjson.dumps(body) if body is not None else None,
            httpx.Timeout(timeout if timeout is not None else self.timeout),
        )
        error = "no attempt"
        for attempt in range(self.retries + 1):
            reply = yield call
            if isinstance(reply, httpx.TimeoutException):
                # slow, not gone: a retry would double the wait the timeout promised to bound
                error = str(reply) or "timed out"
                break
            if isinstance(reply, httpx.TransportError):
                error = str(reply) or type(reply).__name__
                continue
            if closed_ok_on_retry and attempt > 0 and reply.status_code == 409:
                # an earlier attempt got through before its answer was lost
                self.mark_up()
                return None
            try:
                data = self.check(reply, what)
            except _UnavailableError as exc:
                error = str(exc)
                continue
            self.mark_up()
            return data
        self.mark_down(error)
        raise _UnavailableError(error)

    def decide(
        self, run_id: str, events: Iterable[EventLike], options: DecideOptions
    ) -> Flow[DecideResponse]:
        """Fold the events locally, ask the service; decide locally when it cannot answer.

        More unsent events than the service takes in one request (``max_batch``) go in
        several calls, oldest first; the answer to the last one is the decision.
        """
        path = _run_path(run_id) + "/decide"
        budget, objective = options.get("budget"), options.get("objective")
        proposed_stop = options.get("proposed_stop", False)
        task_id, system = options.get("task_id"), options.get("system")
        run = self.fold(run_id, events, budget, task_id, system)
        cfg = _as_safety(options.get("safety"))
        target = options.get("quality_target")
        if target is not None:
            cfg = (cfg or run.safety or self.safety).replace(quality_met=target)
        if cfg is not None:
            run.safety = cfg
        cfg = run.safety
        if self.is_down() or run.local_only:
            return self.away(run_id, run, cfg, proposed_stop)
        decision: DecideResponse | None = None
        while decision is None or run.pending:
            body = self.decide_body(
                run,
                budget=budget,
                objective=objective,
                safety=cfg,
                proposed_stop=proposed_stop and len(run.pending) <= self.max_batch,
                extra={"task_id": task_id, "system": system, "quality_target": target},
            )
            sent = [e["id"] for e in body["events"]]
            try:
                data = yield from self.post_decide(run_id, run, path, body)
                if data is None:  # the run could not be resent: decided locally from now on
                    return self.away(run_id, run, cfg, proposed_stop)
                decision = DecideResponse.model_validate(data)
            except _UnavailableError:
                return self.away(run_id, run, cfg, proposed_stop)
            except ValidationError:
                self.mark_down("unexpected response")
                return self.away(run_id, run, cfg, proposed_stop)
            except StopServeError as exc:
                if isinstance(exc, RunClosedError | RunLimitError):
                    # the service will never take them: do not resend forever
                    self.sent(run, sent, delivered=False)
                if self.raise_on_client_error:
                    raise
                log.warning("stopserve: %s; deciding locally", exc)
                return self.away(run_id, run, cfg, proposed_stop)
            self.sent(run, sent)
        return self.note(run, decision)

    def post_decide(self, run_id: str, run: _LocalRun, path: str, body: dict[str, Any]) -> Flow[Any]:
        """One decide request; after 409 run_evicted the whole run is resent once.

        Returns the answer's JSON, or None when the run cannot be resent (it is then
        decided locally from now on).
        """
        try:
            return (yield from self.request("POST", path, body, f"decide {run_id!r}"))
        except RunEvictedError as exc:
            bodies = self.resend_bodies(run, body)
            if bodies is None:
                self.give_up(run_id, run, exc)
                return None
            data: Any = None
            for i, whole in enumerate(bodies):
                try:
                    data = yield from self.request("POST", path, whole, f"decide {run_id!r} (resent)")
                except StopServeError as again:
                    self.give_up(run_id, run, again)
                    return None
                except _UnavailableError as again:
                    if i == 0:
                        raise  # nothing of the resend arrived: the next call tries again
                    # the service holds part of the run: a later call would leave a hole in it
                    self.give_up(run_id, run, StopServeError(f"resend cut short: {again}"))
                    return None
            self.resent(run)
            return data

    def away(
        self, run_id: str, run: _LocalRun, safety: SafetyConfig | None, proposed_stop: bool
    ) -> DecideResponse:
        """The service did not answer: bound what waits for it, decide locally."""
        self.trim(run_id, run)
        return self.note(run, self.local_decision(run_id, run, safety, proposed_stop))

    def outcome(
        self, run_id: str, rewards: Mapping[str, float], options: OutcomeOptions
    ) -> Flow[OutcomeResponse | None]:
        """Post the outcome with the unsent events; spool the trace when it cannot be delivered."""
        run = self._runs.get(run_id)
        body = _outcome_body(run, rewards, options)
        if (run is None or not run.local_only) and len(body["events"]) > self.max_batch:
            # an outcome carries at most max_batch events: the others go first, as decide calls
            yield from self.decide(run_id, options.get("events", ()), {})
            run = self._runs.get(run_id)
            body = _outcome_body(run, rewards, options)
        if run is not None and run.local_only:
            self.undelivered(run_id, run, body, run.why_local)
            return None
        if self.is_down():
            # the breaker is open: as decide, do not wait on a service that just failed
            self.undelivered(run_id, run, body, "the service failed just now (circuit breaker open)")
            return None
        try:
            data = yield from self.request(
                "POST",
                _run_path(run_id) + "/outcome",
                body,
                f"outcome {run_id!r}",
                timeout=self.outcome_timeout,
                closed_ok_on_retry=True,
            )
        except (_UnavailableError, RunEvictedError) as exc:
            self.undelivered(run_id, run, body, exc)
            return None
        self.forget(run_id)
        return OutcomeResponse.model_validate(data) if data is not None else None

    def model(self) -> Flow[ModelInfo]:
        """What the service serves; raises when it cannot be reached."""
        try:
            data = yield from self.request("GET", "/v1/model", None, "model", timeout=self.outcome_timeout)
        except _UnavailableError as exc:
            raise StopServeError(f"stopserve service at {self.url} unavailable: {exc}") from None
        return ModelInfo.model_validate(data)


def _run_path(run_id: str) -> str:
    if not RUN_ID.fullmatch(run_id):
        raise ConfigError(
            f"run_id {run_id[:60]!r}: letters, digits and . _ : @ + - only, 1 to 256 characters",
            [Issue("not a valid run id", path="run_id")],
        )
    return "/v1/runs/" + quote(run_id, safe="")


def _outcome_body(
    run: _LocalRun | None, rewards: Mapping[str, float], options: OutcomeOptions
) -> dict[str, Any]:
    pending = list(run.pending.values()) if run is not None else []
    seen = {e["id"] for e in pending}
    for i, item in enumerate(options.get("events", ())):
        event = _as_event(item, i)
        if event.id not in seen and not (run is not None and run.state.seen(event.id)):
            pending.append(event.dump())
    body: dict[str, Any] = {"rewards": dict(rewards), "events": pending}
    stop = options.get("stop")
    if stop is not None:
        body["stop"] = stop.model_dump(exclude_none=True) if isinstance(stop, Stop) else dict(stop)
    if costs := options.get("costs"):
        body["costs"] = dict(costs)
    if metrics := options.get("metrics"):
        body["metrics"] = dict(metrics)
    return body


# --------------------------------------------------------------------------- the two transports


class _ClientBase(Generic[_TransportT]):
    """What the sync and async clients share: the arguments, the core, the local state."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        *,
        timeout: float = DEFAULT_TIMEOUT,
        outcome_timeout: float = 5.0,
        retries: int = 1,
        cooldown: float = 5.0,
        budget: BudgetLike | None = None,
        objective: Objective | None = None,
        safety: SafetyLike | None = None,
        topology: Topology | None = None,
        raise_on_client_error: bool = True,
        max_runs: int = 10_000,
        max_pending: int = 10_000,
        max_batch: int = 2_000,
        headers: Mapping[str, str] | None = None,
        spool: str | os.PathLike[str] | None = None,
        transport: _TransportT | None = None,
    ) -> None:
        self._core = _Core(
            url,
            timeout=timeout,
            outcome_timeout=outcome_timeout,
            retries=retries,
            cooldown=cooldown,
            budget=budget,
            objective=objective,
            safety=safety,
            topology=topology,
            raise_on_client_error=raise_on_client_error,
            max_runs=max_runs,
            max_pending=max_pending,
            headers=headers,
            spool=spool,
            max_batch=max_batch,
        )
        self._transport: _TransportT | None = transport
        self._open()

    def _open(self) -> None:
        """Set up the transport (each client its own way)."""

    @property
    def url(self) -> str:
        """Base URL of the service."""
        return self._core.url

    def state(self, run_id: str) -> RunState | None:
        """The client's local state of a run (what degraded decisions are made from)."""
        run = self._core._runs.get(run_id)
        return run.state if run is not None else None


class StopClient(_ClientBase[httpx.BaseTransport]):
    """Synchronous client; decides locally (``degraded=True``) when the service cannot answer.

    ``timeout`` bounds each HTTP phase of one decide call (seconds; ``outcome_timeout`` for
    the outcome, which writes the whole trace). ``retries`` extra attempts are made at once
    after quick failures (refused connection, 5xx), never after a timeout. After a failure
    the service is skipped for ``cooldown`` seconds. ``budget``, ``objective`` and ``safety`` are
    defaults for every run (``safety`` also overrides the server's safety nets, so both sides
    apply the same; without it the local fallback applies
    :data:`~stopserve.safety.DEFAULT_SAFETY`, the service's own default).
    With ``spool`` (a ``.jsonl`` path) the client also keeps each run's events and
    decisions, and appends the run's format-v1 trace there when its outcome cannot be
    delivered, so the retraining log loses nothing while the sidecar is down.
    A call sends at most ``max_batch`` events per request (the service's
    ``STOPSERVE_MAX_EVENTS_PER_REQUEST``, 2,000 by default); more go in several requests.
    While the service is away, at most ``max_pending`` unsent events wait per run; past that
    the oldest are dropped with a warning naming the count, and the run is decided locally
    (``degraded=True``) from then on. Nothing is dropped while the service answers.
    A 4xx answer (the caller's mistake) raises a :class:`~stopserve.errors.StopServeError`
    (the class the service raised: :mod:`stopserve.error_table`), unless
    ``raise_on_client_error=False``: then it is logged and decided locally.

    >>> with StopClient("http://127.0.0.1:9", timeout=0.05) as client:   # nothing listens there
    ...     d = client.decide("run-1", [{"id": "e1", "t": 0, "type": "return", "agent": "a"}])
    >>> d.action, d.degraded
    ('continue', True)
    """

    def _open(self) -> None:
        core = self._core
        self._http = httpx.Client(
            base_url=core.url, timeout=core.http_timeout(), headers=core.headers, transport=self._transport
        )

    def _send(self, flow: Flow[_T]) -> _T:
        """Run a call of the core: make each request it yields, hand back the answer."""
        try:
            call = next(flow)
            while True:
                try:
                    reply: _Reply = self._http.request(
                        call.method, call.path, content=call.content, headers=_JSON, timeout=call.timeout
                    )
                except httpx.TransportError as exc:
                    reply = exc
                call = flow.send(reply)
        except StopIteration as done:
            value: _T = done.value
            return value

    def decide(
        self, run_id: str, events: Iterable[EventLike] = (), **options: Unpack[DecideOptions]
    ) -> DecideResponse:
        """Send the run's new events and return the service's decision (or a local one).

        ``options``: see :class:`DecideOptions` (budget, objective, proposed_stop, safety, task_id, system).
        """
        return self._send(self._core.decide(run_id, events, options))

    def outcome(
        self, run_id: str, rewards: Mapping[str, float], **options: Unpack[OutcomeOptions]
    ) -> OutcomeResponse | None:
        """Close the run with its final rewards; the service logs the whole trace.

        Unsent events go along. Returns ``None`` (and logs a warning) when the service
        cannot be reached: the orchestrator's run is over either way.
        """
        return self._send(self._core.outcome(run_id, rewards, options))

    def model(self) -> ModelInfo:
        """What the service is serving (raises when it cannot be reached)."""
        return self._send(self._core.model())

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> StopClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncStopClient(_ClientBase[httpx.AsyncBaseTransport]):
    """The asyncio twin of :class:`StopClient` (same arguments, same fail-safe, same core).

    The connection pool is bound to the event loop that first uses it; a client used
    from a new loop (e.g. a second ``asyncio.run``) opens a fresh pool there.
    """

    def _open(self) -> None:
        self._http: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop or self._http.is_closed:
            # a pool's connections belong to one loop; never reuse them from another
            core = self._core
            self._http = httpx.AsyncClient(
                base_url=core.url,
                timeout=core.http_timeout(),
                headers=core.headers,
                transport=self._transport,
            )
            self._loop = loop
        return self._http

    async def _send(self, flow: Flow[_T]) -> _T:
        """Run a call of the core: make each request it yields, hand back the answer."""
        try:
            call = next(flow)
            while True:
                try:
                    reply: _Reply = await self._client().request(
                        call.method, call.path, content=call.content, headers=_JSON, timeout=call.timeout
                    )
                except httpx.TransportError as exc:
                    reply = exc
                call = flow.send(reply)
        except StopIteration as done:
            value: _T = done.value
            return value

    async def decide(
        self, run_id: str, events: Iterable[EventLike] = (), **options: Unpack[DecideOptions]
    ) -> DecideResponse:
        """Send the run's new events and return the service's decision (or a local one)."""
        return await self._send(self._core.decide(run_id, events, options))

    async def outcome(
        self, run_id: str, rewards: Mapping[str, float], **options: Unpack[OutcomeOptions]
    ) -> OutcomeResponse | None:
        """Close the run with its final rewards (``None`` when the service cannot be reached)."""
        return await self._send(self._core.outcome(run_id, rewards, options))

    async def model(self) -> ModelInfo:
        """What the service is serving (raises when it cannot be reached)."""
        return await self._send(self._core.model())

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._http is not None:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncStopClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
