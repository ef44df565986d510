"""Trace format v1: models, validation, and streaming read/write.

The contract is ``docs/trace-format.md``; this module is its code. A trace
is one run of an agent system: events (eight atomic types), optional edges,
final rewards, costs, the stop, the budget in force and free metrics.

Read files with :func:`read_traces` (raises on the first invalid trace, with all
of its problems) or :func:`scan` (never raises for content; yields every
trace's problems, for ``stopserve validate``). Both stream: one trace in memory
at a time, one line at a time for JSON Lines.

>>> t = Trace.model_validate({"trace_id": "r1", "task_id": "t1",
...     "events": [{"id": "e1", "t": 0, "type": "tool_call", "agent": "a"}]})
>>> t.events[0].type
'tool_use'
"""

from __future__ import annotations

import collections
import difflib
import gzip
import io
import logging
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final, Literal, get_args

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from stopserve.errors import Issue, TraceFormatError, TraceValidationError, pydantic_issues
from stopserve.signals import sketch as _sketch

__all__ = [
    "DECISION_POINT_TYPES",
    "EVENT_TYPES",
    "FORMAT_TAG",
    "STOP_REASONS",
    "SURVEY_TYPE_MAP",
    "TOPOLOGIES",
    "Budget",
    "Decision",
    "Edge",
    "Event",
    "Progress",
    "ReadProblems",
    "Record",
    "Stop",
    "Trace",
    "TraceWriter",
    "check_trace",
    "is_decision_point",
    "parse_trace",
    "read_at",
    "read_records",
    "read_traces",
    "scan",
    "write_traces",
]

FORMAT_TAG: Final = "stopserve.trace/1"

EventType = Literal["spawn", "delegate", "communicate", "tool_use", "return", "aggregate", "reward", "stop"]
StopReason = Literal[
    "information_complete",
    "quality_met",
    "budget_exhausted",
    "loop_detected",
    "no_progress",
    "error",
    "external",
    "unknown",
]
Topology = Literal[
    "centralized", "planner_executor_critic", "debate", "swarm", "hierarchical", "harness", "mixed", "unknown"
]
Limit = Literal["turns", "seconds", "tokens", "usd"]
EdgeType = Literal[
    "temporal", "causal", "spawn", "message", "tool_dependency", "return", "aggregate", "safety_flow"
]

EVENT_TYPES: Final[tuple[str, ...]] = get_args(EventType)
STOP_REASONS: Final[tuple[str, ...]] = get_args(StopReason)
TOPOLOGIES: Final[tuple[str, ...]] = get_args(Topology)

#: Survey artifact event types and the v1 type each maps to (``orchestrator_decision``
#: becomes ``stop`` instead when it carries ``decision: "stop"``).
SURVEY_TYPE_MAP: Final[Mapping[str, str]] = {
    "orchestrator_decision": "delegate",
    "message": "communicate",
    "tool_call": "tool_use",
    "tool_result": "return",
    "despawn": "return",
    "human_intervention": "communicate",
    "safety_event": "communicate",
}

#: Event types after which control returns to the orchestrator (plus a *proposed* stop).
DECISION_POINT_TYPES: Final = frozenset({"return", "aggregate", "reward"})

#: Bytes one JSON Lines line or one ``.json`` file may hold; bounds memory per trace.
DEFAULT_MAX_TRACE_BYTES: Final = 64 * 1024 * 1024

#: Characters of a progress signature or source name.
MAX_PROGRESS_CHARS: Final = 128

_NEEDS_VALUE: Final = "a reward event must carry 'value'"
_NEEDS_REASON: Final = "a stop event must carry 'reason'"

_NonNegFloat = Field(default=None, ge=0, allow_inf_nan=False)


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow", allow_inf_nan=False)


def _whole_number(value: Any) -> Any:
    """Accept ``12000.0`` for an integer field (JSON writers emit it); strict typing rejects the rest."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class Decision(_Model):
    """What a stop service answered at one point (logged by the service)."""

    action: Literal["continue", "stop"]
    reason: StopReason | None = None
    v_stop: float | None = None
    propensity: float = Field(default=1.0, gt=0, le=1)
    model_version: str | None = None


class Stop(_Model):
    """How a run ended."""

    reason: StopReason
    by: Literal["orchestrator", "safety_net", "service", "external"] | None = None
    t: float | None = Field(default=None, ge=0)
    limit: Limit | None = None


class Budget(_Model):
    """Caps in force during a run; tells a cap-cut run from a chosen stop."""

    max_turns: int | None = Field(default=None, ge=0)
    max_seconds: float | None = _NonNegFloat
    max_tokens: int | None = Field(default=None, ge=0)
    max_usd: float | None = _NonNegFloat

    _whole = field_validator("max_turns", "max_tokens", mode="before")(_whole_number)


class Edge(_Model):
    """A link in the event graph; ``src`` and ``dst`` name event ids."""

    model_config = ConfigDict(extra="forbid")

    src: str = Field(min_length=1)
    dst: str = Field(min_length=1)
    type: EdgeType


# --------------------------------------------------------------------------- progress
# The optional `progress` object of an event (docs/trace-format.md, Progress): what the step's
# text showed, read where the text is (stopserve.signals.progress), never the text itself.
# Its keys are stopserve.signals.progress.FIELDS (a test keeps the two equal).


class Progress(BaseModel):
    """What a step showed about the run's progress; every field optional, unknown fields an error.

    >>> Progress.model_validate({"tests_passed": 5, "tests_failed": 2, "source": "pytest"}).tests_failed
    2
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    #: a test runner's summary: tests that passed
    tests_passed: int | None = Field(default=None, ge=0)
    #: ... that failed or errored
    tests_failed: int | None = Field(default=None, ge=0)
    #: the command's exit status, where known
    exit_code: int | None = None
    #: a short normalised signature of the error seen (equal errors, equal signatures)
    error: str | None = Field(default=None, min_length=1, max_length=MAX_PROGRESS_CHARS)
    #: files the step created or modified, where known
    files_changed: int | None = Field(default=None, ge=0)
    #: the orchestrator's own verdict: progress is being made (Magentic-One's ledger)
    made_progress: bool | None = None
    #: the orchestrator's own verdict: the team is in a loop (Magentic-One's ledger)
    in_loop: bool | None = None
    #: which extractor filled it: "pytest", "jest", "go", "exit_code", "magentic_one", ...
    source: str | None = Field(default=None, min_length=1, max_length=MAX_PROGRESS_CHARS)

    _whole = field_validator("tests_passed", "tests_failed", "exit_code", "files_changed", mode="before")(
        _whole_number
    )


class Event(_Model):
    """One atomic event. Unknown extra fields are kept (the survey allows them)."""

    id: str = Field(min_length=1)
    t: float = Field(ge=0, allow_inf_nan=False)
    type: EventType
    agent: str = Field(min_length=1)
    role: str | None = None
    from_: str | None = Field(default=None, alias="from")
    to: str | None = None
    tool: str | None = None
    content_ref: str | None = None
    #: a similarity sketch of the event's text (stopserve.signals.sketch), never the text
    sketch: str | None = None
    tokens: int | None = Field(default=None, ge=0)
    usd: float | None = _NonNegFloat
    error: bool | None = None
    value: float | None = Field(default=None, allow_inf_nan=False)
    channel: str | None = None
    reason: StopReason | None = None
    proposed: bool | None = None
    grade: float | None = Field(default=None, allow_inf_nan=False)
    #: offline label: the true quality change this event caused (a simulator knows it); never a feature
    contribution: float | None = Field(default=None, allow_inf_nan=False)
    decision: Decision | None = None
    #: what the step showed about progress (test counts, exit code, error signature, a ledger)
    progress: Progress | None = None

    _whole = field_validator("tokens", mode="before")(_whole_number)

    @field_validator("sketch")
    @classmethod
    def _sketch_shape(cls, wire: str | None) -> str | None:
        if wire is not None and (problem := _sketch.check(wire)) is not None:
            raise ValueError(problem)
        return wire

    @model_validator(mode="before")
    @classmethod
    def _map_survey_type(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        kind = data.get("type")
        if not isinstance(kind, str) or kind not in SURVEY_TYPE_MAP:
            return data
        data = dict(data)
        data["survey_type"] = kind
        decision = data.get("decision")
        if isinstance(decision, str):
            # the survey's free-form decision string is not a v1 Decision object
            data["survey_decision"] = data.pop("decision")
        if kind == "orchestrator_decision" and decision == "stop":
            data["type"] = "stop"
            if data.get("reason") is None:  # the survey schema allows an explicit null reason
                data["reason"] = "unknown"
        else:
            data["type"] = SURVEY_TYPE_MAP[kind]
        if kind == "human_intervention":
            data.setdefault("role", "human")
        elif kind == "safety_event":
            data.setdefault("error", True)
        return data

    @model_validator(mode="after")
    def _required_by_type(self) -> Event:
        if self.type == "reward" and self.value is None:
            raise ValueError(_NEEDS_VALUE)
        if self.type == "stop" and self.reason is None:
            raise ValueError(_NEEDS_REASON)
        return self

    def dump(self) -> dict[str, Any]:
        """The event as format-v1 JSON data (aliases, no empty fields)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class Trace(_Model):
    """One run of an agent system, as format v1 defines it."""

    format: Literal["stopserve.trace/1"] | None = None
    trace_id: str = Field(min_length=1)
    task_id: str = Field(min_length=1)
    system: str | None = None
    topology: Topology | None = None
    events: list[Event] = Field(min_length=1)
    edges: list[Edge] = Field(default_factory=list)
    rewards: dict[str, float] = Field(default_factory=dict)
    costs: dict[str, float] = Field(default_factory=dict)
    stop: Stop | None = None
    budget: Budget | None = None
    metrics: dict[str, float] = Field(default_factory=dict)

    @field_validator("costs")
    @classmethod
    def _costs_non_negative(cls, costs: dict[str, float]) -> dict[str, float]:
        for key, value in costs.items():
            if value < 0:
                raise ValueError(f"cost {key!r} must be >= 0, got {value}")
        return costs

    def total_costs(self) -> dict[str, float]:
        """``costs`` with every missing total recomputed from the events."""
        totals = {
            "tokens": float(sum(e.tokens or 0 for e in self.events)),
            "wall_clock_s": self.events[-1].t if self.events else 0.0,
            "tool_calls": float(sum(1 for e in self.events if e.type == "tool_use")),
            "messages": float(sum(1 for e in self.events if e.type == "communicate")),
        }
        if any(e.usd is not None for e in self.events):
            totals["usd"] = float(sum(e.usd or 0.0 for e in self.events))
        return {**totals, **self.costs}

    def dump(self) -> dict[str, Any]:
        """The trace as format-v1 JSON data (aliases, no empty fields)."""
        data = self.model_dump(by_alias=True, exclude_none=True, mode="json")
        data.setdefault("format", FORMAT_TAG)
        return data


def is_decision_point(event: Event) -> bool:
    """Whether control returns to the orchestrator right after ``event``."""
    return event.type in DECISION_POINT_TYPES or (event.type == "stop" and bool(event.proposed))


# --------------------------------------------------------------------------- validation

_TRACE_FIELDS: Final = frozenset(Trace.model_fields) | {"format"}
_EVENT_FIELDS: Final = (frozenset(Event.model_fields) - {"from_"}) | {"from"}
_PROGRESS_FIELDS: Final = frozenset(Progress.model_fields)


def _suggest(key: str, known: frozenset[str]) -> str | None:
    """The known field ``key`` most likely misspells (``tokns`` -> ``tokens``), if any."""
    match = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.8)
    return match[0] if match else None


def _typos(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(path, field, the field it likely misspells) for every unknown field close to a known one.

    Other unknown fields are extras the format keeps (the survey schema allows them).
    """
    out: list[tuple[str, str, str]] = []
    for key in data:
        if key not in _TRACE_FIELDS and (near := _suggest(key, _TRACE_FIELDS)):
            out.append((key, key, near))
    events = data.get("events")
    for i, ev in enumerate(events if isinstance(events, list) else ()):
        if not isinstance(ev, dict):
            continue
        for key in ev:
            if key not in _EVENT_FIELDS and (near := _suggest(key, _EVENT_FIELDS)):
                out.append((f"events[{i}].{key}", key, near))
    return out


def _hint_progress_typo(issue: Issue) -> Issue:
    """An unknown ``progress`` key (an error: the object is closed) names the key it likely misspells."""
    head, _, key = (issue.path or "").rpartition(".")
    if issue.message == "unknown field" and head.endswith(".progress"):
        near = _suggest(key, _PROGRESS_FIELDS)
        known = ", ".join(sorted(_PROGRESS_FIELDS))
        hint = f"did you mean {near!r}?" if near else f"progress holds only {known}"
        return replace(issue, message=f"unknown field ({hint})")
    return issue


def _semantic_issues(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Checks pydantic cannot express per field; tolerant of badly typed input."""
    out: list[tuple[str, str]] = []
    events = data.get("events")
    ids: dict[str, int] = {}
    if isinstance(events, list):
        last_t: float | None = None
        for i, ev in enumerate(events):
            if not isinstance(ev, dict):
                continue
            eid = ev.get("id")
            if isinstance(eid, str):
                if eid in ids:
                    out.append(
                        (f"events[{i}].id", f"duplicate event id {eid!r} (first at events[{ids[eid]}])")
                    )
                else:
                    ids[eid] = i
            raw_type = ev.get("type")
            kind = SURVEY_TYPE_MAP.get(raw_type, raw_type) if isinstance(raw_type, str) else None
            if kind == "reward" and ev.get("value") is None:
                out.append((f"events[{i}].value", _NEEDS_VALUE))
            if kind == "stop" and ev.get("reason") is None and ev.get("type") != "orchestrator_decision":
                out.append((f"events[{i}].reason", _NEEDS_REASON))
            t = ev.get("t")
            if isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t):
                if last_t is not None and t < last_t:
                    out.append((f"events[{i}].t", f"time goes backwards: {t} after {last_t}"))
                last_t = t if last_t is None else max(last_t, t)
    edges = data.get("edges")
    if isinstance(edges, list) and isinstance(events, list):
        for i, edge in enumerate(edges):
            if not isinstance(edge, dict):
                continue
            for end in ("src", "dst"):
                ref = edge.get(end)
                if isinstance(ref, str) and ref and ref not in ids:
                    out.append((f"edges[{i}].{end}", f"names no event: {ref!r}"))
    return out


def check_trace(
    data: Any,
    *,
    strict: bool = False,
    file: str | None = None,
    line: int | None = None,
    warnings: list[Issue] | None = None,
) -> tuple[Trace | None, list[Issue]]:
    """Validate one trace object; return it (or ``None``) and EVERY problem found.

    ``strict`` rejects unknown top-level fields (they are kept otherwise), and an unknown
    event field that looks like a misspelt one (``tokns``: "did you mean 'tokens'?").
    Without ``strict`` such likely typos go to ``warnings`` when it is given.
    """
    if not isinstance(data, dict):
        return None, [
            Issue(f"a trace must be a JSON object, got {type(data).__name__}", file=file, line=line)
        ]
    tid = data.get("trace_id")
    trace_id = tid if isinstance(tid, str) and tid else None
    issues: list[Issue] = []
    trace: Trace | None = None
    try:
        # strict: JSON types must match (no "5" for 5, no true for a number)
        trace = Trace.model_validate(data, strict=True)
    except ValidationError as exc:
        # a missing reward value or stop reason is reported with its field by _semantic_issues
        errs = [
            err
            for err in exc.errors()
            if str(err.get("msg", "")).removeprefix("Value error, ") not in (_NEEDS_VALUE, _NEEDS_REASON)
        ]
        issues += [
            _hint_progress_typo(issue)
            for issue in pydantic_issues(errs, file=file, line=line, trace_id=trace_id)
        ]
    for path, message in _semantic_issues(data):
        issues.append(Issue(message, file=file, line=line, trace_id=trace_id, path=path))
    typos = {path: near for path, _, near in _typos(data)}
    if strict:
        for key in data:
            if key not in _TRACE_FIELDS:
                hint = f" (did you mean {typos[key]!r}?)" if key in typos else ""
                message = f"unknown top-level field{hint} (--strict)"
                issues.append(Issue(message, file=file, line=line, trace_id=trace_id, path=key))
    for path, near in typos.items():
        field_name = path.rpartition(".")[2]
        if strict and "." not in path:
            continue  # said above
        said = Issue(
            f"unknown field {field_name!r} (did you mean {near!r}?)"
            + (" (--strict)" if strict else "; kept as an extra field"),
            file=file,
            line=line,
            trace_id=trace_id,
            path=path,
        )
        if strict:
            issues.append(said)
        elif warnings is not None:
            warnings.append(said)
    return (None if issues else trace), issues


def parse_trace(
    data: Any, *, strict: bool = False, file: str | None = None, line: int | None = None
) -> Trace:
    """Validate one trace object or raise :class:`TraceValidationError` listing every problem."""
    trace, issues = check_trace(data, strict=strict, file=file, line=line)
    if trace is None:
        where = Issue("", file=file, line=line, trace_id=issues[0].trace_id if issues else None)
        prefix = str(where).rstrip(": ")
        raise TraceValidationError(
            f"{prefix}: invalid trace ({len(issues)} problems)"
            if prefix
            else f"invalid trace ({len(issues)} problems)",
            issues,
        )
    return trace


# --------------------------------------------------------------------------- reading


@dataclass(slots=True)
class Record:
    """One trace read from a file: the trace when valid, else the problems found."""

    file: str
    line: int | None
    trace: Trace | None
    issues: list[Issue] = field(default_factory=list)
    #: False when the bytes could not be read as a JSON trace at all (binary, not JSON, empty)
    readable: bool = True
    #: likely typos kept as extra fields (an unknown field close to a known one); errors with strict
    warnings: list[Issue] = field(default_factory=list)
    #: where the line starts in the (decompressed) file, for JSON Lines: what :func:`read_at` reads back
    offset: int | None = None
    #: the trace's place in a ``.json`` file (0 for a file of one trace object)
    index: int | None = None


_GZIP_MAGIC: Final = b"\x1f\x8b"
_SNIFF_BYTES: Final = 8192


def _looks_binary(chunk: bytes) -> bool:
    return b"\x00" in chunk


def _decode(line: bytes, name: str, lineno: int | None) -> tuple[Any, Issue | None]:
    if _looks_binary(line):
        return None, Issue("binary content (NUL byte): not a JSON trace file", file=name, line=lineno)
    try:
        return orjson.loads(line), None
    except orjson.JSONDecodeError as exc:
        return None, Issue(f"not valid JSON: {exc}", file=name, line=lineno)


def _is_jsonl(path: Path) -> bool:
    name = path.name.lower().removesuffix(".gz")
    return name.endswith((".jsonl", ".ndjson"))


def scan(
    path: str | os.PathLike[str],
    *,
    strict: bool = False,
    max_trace_bytes: int = DEFAULT_MAX_TRACE_BYTES,
) -> Iterator[Record]:
    """Yield one :class:`Record` per trace in ``path``; never raises for bad content.

    ``.jsonl`` / ``.jsonl.gz`` are read a line at a time; ``.json`` holds one trace
    object (or a list of them). A line or ``.json`` file above ``max_trace_bytes``
    is reported, not loaded, so memory stays bounded whatever the input.
    Raises :class:`TraceFormatError` only when the file cannot be opened.
    """
    p = Path(path)
    name = str(path)
    try:
        raw = p.open("rb")
    except OSError as exc:
        raise TraceFormatError(f"{name}: cannot open: {exc.strerror or exc}") from exc
    with raw:
        stream = _decompressed(raw)
        reader = _scan_jsonl if _is_jsonl(p) else _scan_json
        try:
            if isinstance(stream, gzip.GzipFile):
                head = stream.peek(_SNIFF_BYTES)[:_SNIFF_BYTES]
            else:
                head = raw.read(_SNIFF_BYTES)
                raw.seek(0)
            if _looks_binary(head):
                # one clear error, not one per "line" of a binary blob
                issue = Issue("binary content (NUL byte): not a JSON trace file", file=name)
                yield Record(name, None, None, [issue], readable=False)
                return
            yield from reader(stream, name, strict, max_trace_bytes)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            yield Record(name, None, None, [Issue(f"cannot read: {exc}", file=name)], readable=False)


def _decompressed(raw: IO[bytes]) -> IO[bytes]:
    """``raw`` (at its start), or its gzip-decompressed stream when it starts with gzip's magic."""
    stream: IO[bytes] = raw
    if raw.read(2) == _GZIP_MAGIC:
        stream = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[assignment]
    raw.seek(0)
    return stream


def _scan_jsonl(stream: IO[bytes], name: str, strict: bool, max_bytes: int) -> Iterator[Record]:
    lineno = 0
    seen_any = False
    pos = 0
    while True:
        offset = pos
        line = stream.readline(max_bytes + 1)
        if not line:
            break
        pos += len(line)
        lineno += 1
        if len(line) > max_bytes and not line.endswith(b"\n"):
            # skip the rest of the over-long line without holding it
            while True:
                rest = stream.readline(1 << 20)
                pos += len(rest)
                if not rest or rest.endswith(b"\n"):
                    break
            issue = Issue(
                f"line longer than {max_bytes} bytes: refused to bound memory", file=name, line=lineno
            )
            yield Record(name, lineno, None, [issue], readable=False)
            seen_any = True
            continue
        if not line.strip():
            continue
        seen_any = True
        data, bad = _decode(line, name, lineno)
        if bad is not None:
            yield Record(name, lineno, None, [bad], readable=False)
            continue
        warned: list[Issue] = []
        trace, issues = check_trace(data, strict=strict, file=name, line=lineno, warnings=warned)
        yield Record(name, lineno, trace, issues, warnings=warned, offset=offset)
    if not seen_any:
        yield Record(name, None, None, [Issue("file is empty: no traces", file=name)], readable=False)


def _scan_json(stream: IO[bytes], name: str, strict: bool, max_bytes: int) -> Iterator[Record]:
    blob = stream.read(max_bytes + 1)
    if len(blob) > max_bytes:
        issue = Issue(
            f"file larger than {max_bytes} bytes: use JSON Lines (.jsonl) for many traces", file=name
        )
        yield Record(name, None, None, [issue], readable=False)
        return
    if not blob.strip():
        yield Record(name, None, None, [Issue("file is empty: no traces", file=name)], readable=False)
        return
    data, bad = _decode(blob, name, None)
    if bad is not None:
        if b"\n" in blob.strip() and _looks_like_jsonl(blob):
            # a JSON Lines file with a .json name: read it as lines
            yield from _scan_jsonl(io.BytesIO(blob), name, strict, max_bytes)
            return
        yield Record(name, None, None, [bad], readable=False)
        return
    items = data if isinstance(data, list) else [data]
    if not items:
        yield Record(
            name, None, None, [Issue("file holds an empty list: no traces", file=name)], readable=False
        )
    for i, item in enumerate(items):
        warned: list[Issue] = []
        where = name if len(items) == 1 else f"{name}[{i}]"
        trace, issues = check_trace(item, strict=strict, file=where, warnings=warned)
        yield Record(name, None, trace, issues, warnings=warned, index=i)


def _looks_like_jsonl(blob: bytes) -> bool:
    first = blob.lstrip().split(b"\n", 1)[0]
    try:
        return isinstance(orjson.loads(first), dict)
    except orjson.JSONDecodeError:
        return False


def read_traces(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    strict: bool = False,
    max_trace_bytes: int = DEFAULT_MAX_TRACE_BYTES,
    errors: Literal["first", "all"] = "first",
) -> Iterator[Trace]:
    """Stream valid traces from one or more files.

    ``errors="first"``: raises :class:`TraceFormatError` for unreadable input (binary,
    not JSON, empty) and :class:`TraceValidationError` at the first invalid trace, listing
    every problem in it. ``errors="all"`` (what ``stopserve train`` reads with): reads on,
    yielding every valid trace, and at the end raises one :class:`TraceValidationError`
    listing the problems of every invalid or unreadable trace, as ``stopserve validate``
    does. Likely typos (an unknown field close to a known one) are logged as one warning
    per field and file, with the count.
    """
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    if errors == "all":
        yield from _read_all(paths, strict=strict, max_trace_bytes=max_trace_bytes)
        return
    for path in paths:
        typos: collections.Counter[tuple[str, str]] = collections.Counter()
        for record in scan(path, strict=strict, max_trace_bytes=max_trace_bytes):
            _count_typos(record, typos)
            if record.trace is None:
                if not record.readable:
                    raise TraceFormatError(str(record.issues[0]), record.issues[1:])
                first = record.issues[0]
                where = str(Issue("", file=first.file, line=first.line, trace_id=first.trace_id)).rstrip(": ")
                raise TraceValidationError(
                    f"{where}: invalid trace ({len(record.issues)} problems)", record.issues
                )
            yield record.trace
        _warn_typos(path, typos)


#: problems one ``read_traces(errors="all")`` error lists before it only counts the rest
MAX_LISTED_ISSUES: Final = 1000
_log = logging.getLogger("stopserve.trace")


@dataclass
class ReadProblems:
    """What reading trace files with :func:`read_records` found wrong: counts, and the first problems."""

    #: traces read (valid or not), and of them invalid or unreadable
    n_total: int = 0
    n_bad: int = 0
    #: problems found, and the first :data:`MAX_LISTED_ISSUES` of them
    n_issues: int = 0
    issues: list[Issue] = field(default_factory=list)

    def add(self, issues: Sequence[Issue]) -> None:
        """One more invalid or unreadable trace (or file), with its problems."""
        self.n_bad += 1
        self.n_issues += len(issues)
        self.issues += issues[: max(0, MAX_LISTED_ISSUES - len(self.issues))]

    def merge(self, other: ReadProblems) -> None:
        """Count ``other``'s traces and problems too (files read apart, e.g. on other machines)."""
        self.n_total += other.n_total
        self.n_bad += other.n_bad
        self.n_issues += other.n_issues
        self.issues += other.issues[: max(0, MAX_LISTED_ISSUES - len(self.issues))]

    def raise_if_any(self) -> None:
        """One :class:`TraceValidationError` listing the problems, when a trace was bad."""
        if not self.n_bad:
            return
        listed = len(self.issues)
        more = f"; {self.n_issues - listed} more not listed" if self.n_issues > listed else ""
        raise TraceValidationError(
            f"{self.n_bad} of {self.n_total} traces invalid or unreadable ({self.n_issues} problems{more}); "
            "stopserve validate lists them the same way",
            self.issues,
        )


def read_records(
    paths: Iterable[str | os.PathLike[str]],
    problems: ReadProblems,
    *,
    strict: bool = False,
    max_trace_bytes: int = DEFAULT_MAX_TRACE_BYTES,
) -> Iterator[Record]:
    """The record of every valid trace in ``paths``, with where it was read; the rest go to ``problems``.

    What ``read_traces(errors="all")`` reads, without raising: call
    ``problems.raise_if_any()`` after the last record. A record's ``offset`` or ``index``
    finds its trace again (:func:`read_at`).
    """
    for path in paths:
        typos: collections.Counter[tuple[str, str]] = collections.Counter()
        try:
            for record in scan(path, strict=strict, max_trace_bytes=max_trace_bytes):
                _count_typos(record, typos)
                problems.n_total += 1
                if record.trace is not None:
                    yield record
                else:
                    problems.add(record.issues)
        except TraceFormatError as exc:  # cannot open the file: one more problem, read on
            problems.add([Issue(str(exc))])
        _warn_typos(path, typos)


def _read_all(
    paths: Iterable[str | os.PathLike[str]], *, strict: bool, max_trace_bytes: int
) -> Iterator[Trace]:
    problems = ReadProblems()
    for record in read_records(paths, problems, strict=strict, max_trace_bytes=max_trace_bytes):
        assert record.trace is not None
        yield record.trace
    problems.raise_if_any()


def read_at(
    path: str | os.PathLike[str],
    places: Sequence[tuple[int | None, int | None]],
    *,
    max_trace_bytes: int = DEFAULT_MAX_TRACE_BYTES,
) -> list[bytes]:
    """The JSON of the traces at ``places`` in ``path``, in the order given.

    A place is a record's ``(offset, index)`` (:class:`Record`): the offset of a JSON Lines
    line (read with a seek; in a gzip file, decompressed up to it), else the index in a
    ``.json`` file (the file read once for all of them). Raises :class:`TraceFormatError`
    when the file cannot be opened or holds nothing there (it changed since it was read).
    """
    name = os.fspath(path)
    out: list[bytes | None] = [None] * len(places)
    file = Path(path)
    try:
        raw = file.open("rb")
    except OSError as exc:
        raise TraceFormatError(f"{name}: cannot open: {exc.strerror or exc}") from exc
    with raw:
        stream = _decompressed(raw)
        lines = sorted((off, j) for j, (off, _) in enumerate(places) if off is not None)
        for off, j in lines:  # in file order: a gzip stream seeks forward only cheaply
            stream.seek(off)
            out[j] = stream.readline(max_trace_bytes + 1)
        items = [(index, j) for j, (off, index) in enumerate(places) if off is None and index is not None]
        if items:
            data = orjson.loads(stream.read(max_trace_bytes + 1))
            data = data if isinstance(data, list) else [data]
            for index, j in items:
                out[j] = orjson.dumps(data[index]) if index < len(data) else None
    missing = [places[j] for j, blob in enumerate(out) if not blob]
    if missing:
        raise TraceFormatError(f"{name}: no trace at {missing[0]}: the file changed since it was read")
    return [blob for blob in out if blob]


def _count_typos(record: Record, typos: collections.Counter[tuple[str, str]]) -> None:
    for warning in record.warnings:
        typos[(warning.path or "").rpartition(".")[2], warning.message] += 1


def _warn_typos(path: str | os.PathLike[str], typos: collections.Counter[tuple[str, str]]) -> None:
    for (_, message), n in typos.items():
        _log.warning("%s: %s, in %d place(s)", os.fspath(path), message, n)


# --------------------------------------------------------------------------- writing


class TraceWriter:
    """Append traces to a ``.jsonl`` / ``.jsonl.gz`` file (or one ``.json``).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "out.jsonl"
    >>> with TraceWriter(p) as w:
    ...     w.write({"trace_id": "r", "task_id": "t", "events": [{"id": "e", "t": 0, "type": "stop",
    ...              "agent": "a", "reason": "unknown"}]})
    >>> [t.trace_id for t in read_traces(p)]
    ['r']
    """

    def __init__(self, path: str | os.PathLike[str], *, append: bool = False) -> None:
        self.path = Path(path)
        self.count = 0
        self._json = self.path.name.lower().removesuffix(".gz").endswith(".json")
        mode = "ab" if append else "wb"
        try:
            self._raw: IO[bytes] = self.path.open(mode)
        except OSError as exc:
            raise TraceFormatError(f"{self.path}: cannot write: {exc.strerror or exc}") from exc
        self._fh: IO[bytes] = self._raw
        if self.path.name.lower().endswith(".gz"):
            self._fh = gzip.GzipFile(fileobj=self._raw, mode=mode)  # type: ignore[assignment]

    def write(self, trace: Trace | Mapping[str, Any], *, validate: bool = True) -> None:
        """Write one trace; a mapping is validated first, so the file never holds an invalid trace.

        ``validate=False`` writes a mapping as it is: only for generators whose output
        is tested to validate (the simulator), where per-trace validation is the cost.
        """
        if isinstance(trace, Trace):
            data: Any = trace.dump()
        elif validate:
            data = parse_trace(dict(trace), file=str(self.path)).dump()
        else:
            data = trace
        if self._json:
            if self.count:
                raise TraceFormatError(f"{self.path}: a .json file holds one trace; write .jsonl for many")
            self._fh.write(orjson.dumps(data, option=orjson.OPT_INDENT_2))
        else:
            self._fh.write(orjson.dumps(data) + b"\n")
        self.count += 1

    def close(self) -> None:
        self._fh.close()
        self._raw.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def write_traces(path: str | os.PathLike[str], traces: Iterable[Trace | Mapping[str, Any]]) -> int:
    """Write traces to ``path`` (format chosen by extension); return how many."""
    with TraceWriter(path) as writer:
        for trace in traces:
            writer.write(trace)
        return writer.count
