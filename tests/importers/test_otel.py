"""otel importer: spans recorded by the real opentelemetry-sdk, encoded to OTLP/JSON by the
real OTLP encoder (base64 ids, string int64s, enum names), plus the spec's hex-id form."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from stopserve.cli import main
from stopserve.errors import ImporterError
from stopserve.importers.otel import read
from stopserve.trace import is_decision_point, read_traces


def _record() -> tuple[list[ReadableSpan], str]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "research-crew"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    op = "gen_ai.operation.name"
    with tracer.start_as_current_span(
        "invoke_agent orchestrator",
        attributes={
            op: "invoke_agent",
            "gen_ai.agent.name": "orchestrator",
            "gen_ai.conversation.id": "task-42",
        },
    ) as root:
        with tracer.start_as_current_span(
            "create_agent researcher", attributes={op: "create_agent", "gen_ai.agent.name": "researcher"}
        ):
            pass
        with tracer.start_as_current_span(
            "chat gpt-4o",
            attributes={
                op: "chat",
                "gen_ai.provider.name": "openai",
                "gen_ai.request.model": "gpt-4o",
                "gen_ai.usage.input_tokens": 100,
                "gen_ai.usage.output_tokens": 20,
            },
        ):
            pass
        with tracer.start_as_current_span(
            "invoke_agent researcher",
            # a roll-up of the children's usage: must not be counted again
            attributes={
                op: "invoke_agent",
                "gen_ai.agent.name": "researcher",
                "gen_ai.usage.input_tokens": 300,
                "gen_ai.usage.output_tokens": 40,
            },
        ):
            with tracer.start_as_current_span(
                "chat claude",
                attributes={
                    op: "chat",
                    "gen_ai.system": "anthropic",
                    "gen_ai.usage.input_tokens": 300,
                    "gen_ai.usage.output_tokens": 40,
                },
            ):
                pass
            with tracer.start_as_current_span(
                "execute_tool web_search",
                attributes={
                    op: "execute_tool",
                    "gen_ai.tool.name": "web_search",
                    "error.type": "TimeoutError",
                    "gen_ai.tool.call.arguments": '{"q": "x"}',
                },
            ) as tool:
                tool.set_status(Status(StatusCode.ERROR, "timed out"))
        root.add_event(
            "gen_ai.evaluation.result",
            {"gen_ai.evaluation.name": "correctness", "gen_ai.evaluation.score.value": 0.8},
        )
    trace_id = format(root.get_span_context().trace_id, "032x")
    with tracer.start_as_current_span("chat other", attributes={op: "chat", "gen_ai.usage.input_tokens": 7}):
        pass
    return list(exporter.get_finished_spans()), trace_id


@pytest.fixture(scope="module")
def recorded() -> tuple[list[ReadableSpan], str]:
    return _record()


def _otlp(spans: list[ReadableSpan]) -> dict[str, Any]:
    return MessageToDict(encode_spans(spans))


def test_sdk_spans_become_one_trace_per_trace_id(recorded, tmp_path: Path, capsys) -> None:
    spans, trace_id = recorded
    path = tmp_path / "export.json"
    path.write_text(json.dumps(_otlp(spans)))
    assert '"traceId"' in path.read_text() and "==" in path.read_text()  # base64 ids, as the encoder writes
    out = tmp_path / "otel.jsonl"
    assert main(["import", "otel", str(path), "-o", str(out), "--no-progress"]) == 0
    assert "imported 2 traces" in capsys.readouterr().out
    traces = {t.trace_id: t for t in read_traces(out, strict=True)}
    trace = traces[trace_id]
    assert trace.task_id == "task-42" and trace.system == "research-crew" and trace.topology == "unknown"
    kinds = [(e.type, e.agent) for e in trace.events]
    assert kinds == [
        ("delegate", "agent"),
        ("spawn", "orchestrator"),
        ("communicate", "orchestrator"),
        ("delegate", "orchestrator"),
        ("communicate", "researcher"),
        ("tool_use", "researcher"),
        ("return", "web_search"),
        ("return", "researcher"),
        ("reward", "orchestrator"),
        ("return", "orchestrator"),
        ("stop", "agent"),
    ]
    # tokens from inference spans only: 120 + 340, not the agent's 340 roll-up again
    assert sum(e.tokens or 0 for e in trace.events) == 460
    by_type = {(e.type, e.agent): e for e in trace.events}
    assert by_type[("communicate", "orchestrator")].provider == "openai"
    assert by_type[("communicate", "researcher")].provider == "anthropic"  # older gen_ai.system
    tool_return = by_type[("return", "web_search")]
    assert tool_return.error is True and tool_return.error_type == "TimeoutError"
    assert by_type[("return", "researcher")].error is False
    reward = by_type[("reward", "orchestrator")]
    assert (reward.value, reward.channel) == (0.8, "correctness")
    ts = [e.t for e in trace.events]
    assert ts == sorted(ts) and ts[0] == 0.0
    assert sum(is_decision_point(e) for e in trace.events) == 4


def test_spans_of_one_trace_split_across_lines(recorded, tmp_path: Path) -> None:
    spans, trace_id = recorded
    path = tmp_path / "collector.jsonl"
    path.write_text("\n".join(json.dumps(_otlp([s])) for s in spans) + "\n")
    traces = {t.trace_id: t for t in read([path])}
    assert len(traces) == 2 and len(traces[trace_id].events) == 11


def test_hex_ids_and_enum_numbers(tmp_path: Path) -> None:
    doc = {
        "resourceSpans": [
            {
                "resource": {"attributes": []},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b174",
                                "name": "chat gpt-4o",
                                "kind": 3,
                                "startTimeUnixNano": 1544712660000000000,
                                "endTimeUnixNano": 1544712661000000000,
                                "attributes": [
                                    {"key": "gen_ai.usage.output_tokens", "value": {"intValue": 12}}
                                ],
                                "status": {"code": 2},
                            },
                        ]
                    }
                ],
            }
        ]
    }
    path = tmp_path / "hex.json"
    path.write_text(json.dumps(doc))
    (trace,) = read([path])
    assert trace.trace_id == "5b8efff798038103d269b633813fc60c"
    chat = trace.events[0]
    assert (chat.type, chat.tokens, chat.error, chat.t) == ("communicate", 12, True, 1.0)
    assert trace.topology == "harness" and trace.system == "otel"


def test_not_an_export_is_a_located_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    bad_id = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {"spans": [{"traceId": "zz", "spanId": "eee19b7ec3c1b174", "startTimeUnixNano": "1"}]}
                ]
            }
        ]
    }
    path.write_text(json.dumps({"spans": []}) + "\n" + json.dumps(bad_id) + "\n")
    skipped: list[ImporterError] = []
    assert list(read([path], on_error=skipped.append)) == []
    assert str(skipped[0].issues[0]) == f"{path}:1: not an OTLP/JSON trace export: expected 'resourceSpans'"
    assert str(skipped[1].issues[0]).startswith(f"{path}:2: resourceSpans[0].scopeSpans[0].spans[0].traceId:")
