"""Import OpenTelemetry traces (OTLP/JSON) that follow the GenAI semantic conventions.

Input: OTLP/JSON ``ExportTraceServiceRequest`` documents (``{"resourceSpans": [...]}``),
one per ``.json`` file or one a line in ``.jsonl`` (the collector's file exporter).
Ids may be hex (the OTLP/JSON spec) or base64 (protobuf's ``MessageToDict``); enums
may be names or numbers; 64-bit integers may be strings. Spans are grouped by
``traceId``: one format-v1 trace per OTel trace, ``trace_id`` = the hex trace id.

Spans map by ``gen_ai.operation.name`` (else the first word of the span name):

===================================  =================================================
span                                 events
===================================  =================================================
``create_agent``                     ``spawn`` at start (``to`` = ``gen_ai.agent.name``)
``invoke_agent``                     ``delegate`` at start (to the agent), ``return`` at
                                     end (by the agent; ``error`` from the span status)
``execute_tool``                     ``tool_use`` at start (``tool`` = ``gen_ai.tool.name``),
                                     ``return`` at end (``error`` from the status)
``chat``, ``text_completion``,       ``communicate`` at end, by the enclosing agent to
``generate_content``, ``embeddings``  the model; ``tokens`` = ``gen_ai.usage.input_tokens``
                                     + ``output_tokens``
span event ``gen_ai.evaluation.      ``reward``: ``value`` = ``gen_ai.evaluation.score.value``,
result``                             ``channel`` = ``gen_ai.evaluation.name``
===================================  =================================================

Tokens are summed over inference spans only: usage an agent span reports again (a
roll-up of its children) is not counted twice. The acting agent is the nearest
``gen_ai.agent.name`` on the span or its ancestors (else ``agent``). A span with
status ERROR marks its end event ``error: true`` and keeps ``error.type`` as
``error_type``. The provider, from ``gen_ai.provider.name`` or the older
``gen_ai.system``, is kept on events as ``provider``. Other spans (HTTP, DB ...) add
no event. ``task_id`` is the first of the attributes ``stopserve.task_id``,
``task.id``, ``gen_ai.conversation.id`` found on any span, else the trace id.
``system`` is the resource's ``service.name``; ``topology`` is ``harness`` for one
agent and ``unknown`` for several. The trace ends in a ``stop`` (``error`` when the
root span failed, else ``unknown``: OTel does not say why a run ended).

Spans are held per trace until the input is read (a trace's spans may sit in any
line), so memory grows with the spans of the input, not with their payloads.
"""

from __future__ import annotations

import base64
import binascii
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from stopserve.errors import ImporterError
from stopserve.ids import content_refs
from stopserve.importers._common import (
    OnError,
    fail,
    finish,
    iter_files,
    iter_json_records,
    report,
)
from stopserve.trace import FORMAT_TAG, Trace

__all__ = ["INFERENCE_OPERATIONS", "read"]

INFERENCE_OPERATIONS: Final = frozenset({"chat", "text_completion", "generate_content", "embeddings"})
_TASK_KEYS: Final = ("stopserve.task_id", "task.id", "gen_ai.conversation.id")
_SUFFIXES: Final = (".json", ".jsonl", ".jsonl.gz", ".json.gz", ".ndjson")
_STATUS_ERROR: Final = ("STATUS_CODE_ERROR", 2)


def _hex_id(value: Any, size: int) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    if len(value) == 2 * size and all(c in "0123456789abcdefABCDEF" for c in value):
        return value.lower()
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == size else None


def _any_value(value: Any) -> Any:
    if not isinstance(value, dict):
        return None
    if "stringValue" in value:
        return value["stringValue"]
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        try:
            return int(value["intValue"])
        except (TypeError, ValueError, OverflowError):
            return None
    if "doubleValue" in value:
        try:
            return float(value["doubleValue"])
        except (TypeError, ValueError):
            return None
    if "arrayValue" in value:
        values = value["arrayValue"].get("values") if isinstance(value["arrayValue"], dict) else None
        return [_any_value(v) for v in values] if isinstance(values, list) else []
    if "kvlistValue" in value:
        kvs = value["kvlistValue"].get("values") if isinstance(value["kvlistValue"], dict) else None
        return _attributes(kvs)
    return None


def _attributes(items: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(items, list):
        for kv in items:
            if isinstance(kv, dict) and isinstance(kv.get("key"), str):
                out[kv["key"]] = _any_value(kv.get("value"))
    return out


def _nanos(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


@dataclass
class _Span:
    span_id: str
    parent_id: str | None
    name: str
    start: int
    end: int
    attrs: dict[str, Any]
    events: list[tuple[int, str, dict[str, Any]]]
    error: bool
    service: str | None
    children: list[_Span] = field(default_factory=list)

    @property
    def operation(self) -> str:
        op = self.attrs.get("gen_ai.operation.name")
        if isinstance(op, str) and op:
            return op
        return self.name.split(" ", 1)[0] if self.name else ""


@dataclass
class _Source:
    file: str
    line: int | None
    spans: list[_Span] = field(default_factory=list)


def _parse_span(raw: Any, where: str, file: str, line: int | None, service: str | None) -> tuple[str, _Span]:
    if not isinstance(raw, dict):
        raise fail("expected a span object", file=file, line=line, path=where)
    trace_id = _hex_id(raw.get("traceId"), 16)
    if trace_id is None:
        raise fail(
            "expected a 16-byte id (32 hex digits or base64)", file=file, line=line, path=f"{where}.traceId"
        )
    span_id = _hex_id(raw.get("spanId"), 8)
    if span_id is None:
        raise fail(
            "expected an 8-byte id (16 hex digits or base64)", file=file, line=line, path=f"{where}.spanId"
        )
    start = _nanos(raw.get("startTimeUnixNano"))
    end = _nanos(raw.get("endTimeUnixNano"))
    if start is None or start < 0:
        raise fail("expected Unix nanoseconds", file=file, line=line, path=f"{where}.startTimeUnixNano")
    end = start if end is None or end < start else end
    events = []
    raw_events = raw.get("events") or []
    if not isinstance(raw_events, list):
        raise fail("expected a list of events", file=file, line=line, path=f"{where}.events")
    for j, ev in enumerate(raw_events):
        if not isinstance(ev, dict):
            raise fail("expected an event object", file=file, line=line, path=f"{where}.events[{j}]")
        when = _nanos(ev.get("timeUnixNano"))
        events.append(
            (start if when is None else when, str(ev.get("name", "")), _attributes(ev.get("attributes")))
        )
    status = raw.get("status") if isinstance(raw.get("status"), dict) else {}
    assert isinstance(status, dict)
    span = _Span(
        span_id=span_id,
        parent_id=_hex_id(raw.get("parentSpanId"), 8),
        name=str(raw.get("name", "")),
        start=start,
        end=end,
        attrs=_attributes(raw.get("attributes")),
        events=events,
        error=status.get("code") in _STATUS_ERROR,
        service=service,
    )
    return trace_id, span


def _spans_of(doc: Any, file: str, line: int | None) -> Iterator[tuple[str, _Span]]:
    if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans"), list):
        raise fail("not an OTLP/JSON trace export: expected 'resourceSpans'", file=file, line=line)
    for i, rs in enumerate(doc["resourceSpans"]):
        if not isinstance(rs, dict):
            raise fail("expected an object", file=file, line=line, path=f"resourceSpans[{i}]")
        resource = rs.get("resource") if isinstance(rs.get("resource"), dict) else {}
        assert isinstance(resource, dict)
        service = _attributes(resource.get("attributes")).get("service.name")
        scopes = rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or []
        if not isinstance(scopes, list):
            raise fail("expected a list", file=file, line=line, path=f"resourceSpans[{i}].scopeSpans")
        for j, ss in enumerate(scopes):
            spans = ss.get("spans") if isinstance(ss, dict) else None
            if not isinstance(spans, list):
                raise fail(
                    "expected a list of spans",
                    file=file,
                    line=line,
                    path=f"resourceSpans[{i}].scopeSpans[{j}]",
                )
            for k, raw in enumerate(spans):
                where = f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]"
                yield _parse_span(raw, where, file, line, service if isinstance(service, str) else None)


def _convert(trace_id: str, source: _Source) -> Trace:
    spans = source.spans
    by_id = {s.span_id: s for s in spans}
    roots: list[_Span] = []
    for s in spans:
        s.children = []
    for s in spans:
        parent = by_id.get(s.parent_id) if s.parent_id else None
        (parent.children if parent is not None and parent is not s else roots).append(s)
    t0 = min(s.start for s in spans)
    out: list[dict[str, Any]] = []
    agents: set[str] = set()
    task_id: str | None = None

    def sec(nanos: int) -> float:
        return (nanos - t0) / 1e9

    def provider(attrs: Mapping[str, Any]) -> str | None:
        value = attrs.get("gen_ai.provider.name") or attrs.get("gen_ai.system")
        return value if isinstance(value, str) else None

    def add(kind: str, nanos: int, span: _Span, agent: str, **fields: Any) -> None:
        ev: dict[str, Any] = {"id": f"{span.span_id}.{kind}", "t": sec(nanos), "type": kind, "agent": agent}
        ev["span_id"] = span.span_id
        ev.update({k: v for k, v in fields.items() if v is not None})
        out.append(ev)

    def end_fields(span: _Span) -> dict[str, Any]:
        # semconv sets error.type only when the operation failed
        err_type = span.attrs.get("error.type")
        fields: dict[str, Any] = {"error": span.error or bool(err_type)}
        if isinstance(err_type, str) and err_type:
            fields["error_type"] = err_type
        return fields

    def visit(span: _Span, parent_agent: str) -> None:
        nonlocal task_id
        for key in _TASK_KEYS:
            value = span.attrs.get(key)
            if task_id is None and isinstance(value, str | int) and str(value):
                task_id = str(value)
        name = span.attrs.get("gen_ai.agent.name")
        op = span.operation
        agent = name if isinstance(name, str) and name else parent_agent
        if op in ("invoke_agent", "create_agent") and agent != "agent":
            agents.add(agent)
        tool_attr = span.attrs.get("gen_ai.tool.name")
        tool = tool_attr if isinstance(tool_attr, str) and tool_attr else None
        if op == "execute_tool" and tool is None:
            tool = span.name.removeprefix("execute_tool").strip() or "tool"
        if op == "create_agent":
            add("spawn", span.start, span, parent_agent, to=agent, role="create_agent")
        elif op == "invoke_agent":
            add("delegate", span.start, span, parent_agent, to=agent)
        elif op == "execute_tool":
            args = span.attrs.get("gen_ai.tool.call.arguments")
            add(
                "tool_use",
                span.start,
                span,
                agent,
                tool=tool,
                **(content_refs(f"{tool}\0{args}") if args else {}),
            )
        for nanos, ev_name, attrs in span.events:
            if ev_name == "gen_ai.evaluation.result":
                score = attrs.get("gen_ai.evaluation.score.value")
                if isinstance(score, int | float) and not isinstance(score, bool):
                    channel = attrs.get("gen_ai.evaluation.name")
                    out.append(
                        {
                            "id": f"{span.span_id}.reward{len(out)}",
                            "t": sec(nanos),
                            "type": "reward",
                            "agent": agent,
                            "value": float(score),
                            "channel": channel if isinstance(channel, str) else None,
                            "span_id": span.span_id,
                        }
                    )
        for child in sorted(span.children, key=lambda c: c.start):
            visit(child, agent)
        if op in INFERENCE_OPERATIONS:
            tokens = 0
            for key in ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"):
                value = span.attrs.get(key)
                if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf:
                    tokens += int(value)
            model = span.attrs.get("gen_ai.response.model") or span.attrs.get("gen_ai.request.model")
            output = span.attrs.get("gen_ai.output.messages")
            add(
                "communicate",
                span.end,
                span,
                agent,
                to=model if isinstance(model, str) else "model",
                role=op,
                tokens=tokens,
                provider=provider(span.attrs),
                **(content_refs(output) if output else {}),
                **end_fields(span),
            )
        elif op == "invoke_agent":
            add("return", span.end, span, agent, to=parent_agent, **end_fields(span))
        elif op == "execute_tool":
            add("return", span.end, span, tool or "tool", tool=tool, **end_fields(span))

    for root in sorted(roots, key=lambda s: s.start):
        visit(root, "agent")
    out = [{k: v for k, v in ev.items() if v is not None} for ev in out]
    out.sort(key=lambda e: e["t"])  # stable: equal times keep tree order
    failed = any(r.error for r in roots)
    end = sec(max(s.end for s in spans))
    out.append(
        {
            "id": "end",
            "t": max(end, out[-1]["t"] if out else 0.0),
            "type": "stop",
            "agent": "agent",
            "reason": "error" if failed else "unknown",
            "proposed": False,
        }
    )
    service = next((s.service for s in spans if s.service), None)
    trace: dict[str, Any] = {
        "format": FORMAT_TAG,
        "trace_id": trace_id,
        "task_id": task_id or trace_id,
        "system": service or "otel",
        "topology": "harness" if len(agents) <= 1 else "unknown",
        "events": out,
        "stop": {
            "reason": "error" if failed else "unknown",
            "by": "external" if failed else "orchestrator",
            "t": out[-1]["t"],
        },
        "metrics": {"n_spans": float(len(spans))},
    }
    return finish(trace, file=source.file, line=source.line)


def read(
    sources: Sequence[str | os.PathLike[str]] | str | os.PathLike[str], *, on_error: OnError = None
) -> Iterator[Trace]:
    """Yield one :class:`Trace` per OTel ``traceId`` found in ``sources`` (files or folders).

    A document that is not an OTLP/JSON export, or a trace that cannot be converted,
    raises :class:`ImporterError`, or goes to ``on_error`` and is skipped.
    """
    traces: dict[str, _Source] = {}
    for path in iter_files(sources, _SUFFIXES):
        try:
            for line, doc in iter_json_records(path):
                if isinstance(doc, ImporterError):
                    report(doc, on_error)
                    continue
                try:
                    parsed = list(_spans_of(doc, str(path), line))
                except ImporterError as err:
                    report(err, on_error)
                    continue
                for trace_id, span in parsed:
                    traces.setdefault(trace_id, _Source(str(path), line)).spans.append(span)
        except ImporterError as err:
            report(err, on_error)
    for trace_id, source in traces.items():
        try:
            yield _convert(trace_id, source)
        except ImporterError as err:
            report(err, on_error)
