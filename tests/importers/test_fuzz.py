"""Any JSON at all: validation and every importer either succeed or raise our located errors."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from stopserve.errors import ImporterError
from stopserve.importers import mini_swe_agent, openai_chat, otel, survey
from stopserve.trace import check_trace

KEYS = [
    "id",
    "t",
    "type",
    "agent",
    "value",
    "reason",
    "src",
    "dst",
    "events",
    "edges",
    "role",
    "content",
    "messages",
    "tool_calls",
    "function",
    "name",
    "resourceSpans",
    "scopeSpans",
    "spans",
    "traceId",
    "spanId",
    "info",
    "trajectory",
    "action",
    "usage",
    "decision",
    "tokens",
]
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(-2, 2)
    | st.sampled_from(
        [
            "",
            "stop",
            "reward",
            "assistant",
            "tool",
            "user",
            "orchestrator_decision",
            "chat",
            "5b8efff798038103d269b633813fc60c",
        ]
    )
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=5),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(
    data=st.dictionaries(
        st.sampled_from(["trace_id", "task_id", "events", "edges", "stop", "budget", "costs"]), JSON
    )
)
def test_check_trace_never_raises(data: dict[str, Any]) -> None:
    trace, issues = check_trace(data, strict=True)
    assert (trace is None) == bool(issues)
    assert all(str(issue) for issue in issues)


def _otel(data: Any) -> None:
    source = otel._Source("x.json", None)
    for _, span in otel._spans_of(data, "x.json", None):
        source.spans.append(span)
    if source.spans:
        otel._convert("5b8efff798038103d269b633813fc60c", source)


@settings(max_examples=60, deadline=None)
@given(data=JSON)
def test_importers_raise_only_importer_errors(data: Any) -> None:
    converters = [
        survey.convert,
        openai_chat.convert,
        lambda d: mini_swe_agent.trace_from_mini(d, "x.traj.json"),
        lambda d: mini_swe_agent.trace_from_swe_agent(d, "x.traj"),
        _otel,
    ]
    for convert in converters:
        try:
            convert(data)
        except ImporterError as err:
            assert err.issues and err.issues[0].file


MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "function", "robot", 3])},
    optional={
        "content": JSON,
        "tool_calls": JSON | st.lists(st.fixed_dictionaries({"id": JSON, "function": JSON}), max_size=2),
        "tool_call_id": JSON,
        "usage": JSON
        | st.fixed_dictionaries({"prompt_tokens": JSON, "completion_tokens": JSON, "cost": JSON}),
        "created": JSON | st.sampled_from(["2024-01-01T00:00:00Z", "yesterday"]),
        "name": JSON,
        "is_error": JSON,
    },
)


@settings(max_examples=60, deadline=None)
@given(messages=st.lists(MESSAGE, max_size=5), reward=JSON)
def test_openai_chat_messages(messages: list[dict[str, Any]], reward: Any) -> None:
    try:
        openai_chat.convert({"messages": messages, "reward": reward})
    except ImporterError as err:
        assert err.issues


@settings(max_examples=60, deadline=None)
@given(messages=st.lists(MESSAGE, max_size=5), info=JSON)
def test_mini_swe_agent_messages(messages: list[dict[str, Any]], info: Any) -> None:
    try:
        mini_swe_agent.trace_from_mini({"messages": messages, "info": info}, "x.traj.json")
    except ImporterError as err:
        assert err.issues


ANY_VALUE = st.one_of(
    st.fixed_dictionaries({"stringValue": JSON}),
    st.fixed_dictionaries({"intValue": JSON | st.sampled_from(["12", "x", "1e3"])}),
    st.fixed_dictionaries({"doubleValue": JSON}),
    st.fixed_dictionaries({"arrayValue": JSON}),
    JSON,
)
ATTRS = st.lists(
    st.fixed_dictionaries(
        {
            "key": st.sampled_from(
                [
                    "gen_ai.operation.name",
                    "gen_ai.agent.name",
                    "gen_ai.usage.input_tokens",
                    "gen_ai.tool.name",
                    "error.type",
                    "gen_ai.evaluation.score.value",
                    "gen_ai.conversation.id",
                ]
            ),
            "value": ANY_VALUE,
        }
    ),
    max_size=4,
)
SPAN = st.fixed_dictionaries(
    {
        "traceId": st.just("5b8efff798038103d269b633813fc60c"),
        "spanId": st.sampled_from(["eee19b7ec3c1b174", "aaa19b7ec3c1b174"]),
        "startTimeUnixNano": st.integers(0, 10**12) | st.sampled_from(["5", "x"]),
    },
    optional={
        "parentSpanId": st.sampled_from(["eee19b7ec3c1b174", "aaa19b7ec3c1b174", "zz"]),
        "name": JSON,
        "endTimeUnixNano": st.integers(0, 10**12) | JSON,
        "attributes": ATTRS | JSON,
        "events": st.lists(
            st.fixed_dictionaries({"name": JSON, "timeUnixNano": JSON, "attributes": ATTRS}), max_size=2
        )
        | JSON,
        "status": st.fixed_dictionaries({"code": JSON | st.sampled_from([2, "STATUS_CODE_ERROR"])}) | JSON,
    },
)


@settings(max_examples=60, deadline=None)
@given(spans=st.lists(SPAN, min_size=1, max_size=4))
def test_otel_spans(spans: list[dict[str, Any]]) -> None:
    try:
        _otel({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]})
    except ImporterError as err:
        assert err.issues
