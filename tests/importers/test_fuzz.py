"""Any JSON at all: validation and every importer either succeed or raise our located errors."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from stopserve.errors import ImporterError
from stopserve.importers import intercode, mini_swe_agent, mint, openai_chat, otel, survey
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
    "task",
    "state",
    "history",
    "success",
    "task_id",
    "token_counter",
    "turn_history",
    "actions",
    "observations",
    "rewards",
    "valid_action",
    "environment",
    "dataset",
    "query",
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


MINT_PATH = mint.parse_path("m/F=None/max5_p2/reasoning/gsm8k/results.jsonl")
INTERCODE_FILE = intercode.LogFile(
    path="sql/gpt-4/ic_sql_multiturn_gpt-4_10_turns.json", model="gpt-4", strategy="multiturn"
)


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
        lambda d: mint.convert(d, MINT_PATH, file="x/results.jsonl", line=1),
        lambda d: intercode.convert(d, INTERCODE_FILE, "0"),
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


MINT_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", 3])},
    optional={
        "content": st.sampled_from(
            [
                "Observation:\n2\nYou have 3 steps left and 2 chances to propose solution left.\n",
                "Observation:\nYour answer is wrong.\nYou have 1 steps left and 1 chances to propose "
                "solution left.\nYou should take the last step to propose a solution.\n"
                "\nExpert feedback:\nno",
                "<execute> print(1) </execute>",
                "<solution> 2 </solution>",
                "```python\nprint(2)\n```",
                "",
            ]
        )
        | JSON
    },
)


@settings(max_examples=60, deadline=None)
@given(
    history=st.lists(MINT_MESSAGE, max_size=6),
    success=JSON | st.booleans(),
    counter=JSON
    | st.fixed_dictionaries({}, optional={"prompt_tokens": JSON, "feedback_prompt_tokens": JSON}),
    terminate=st.sampled_from(["task_success", "max_steps", "error", None]),
)
def test_mint_runs(history: list[dict[str, Any]], success: Any, counter: Any, terminate: Any) -> None:
    record = {
        "task": {"task_id": 1},
        "state": {
            "history": history,
            "success": success,
            "token_counter": counter,
            "terminate_reason": terminate,
        },
    }
    for where in (MINT_PATH, mint.parse_path("m/F=gpt-4/PHF=x/max5_p2/reasoning/gsm8k/results.jsonl")):
        try:
            mint.convert(record, where, file="x/results.jsonl", line=1)
        except ImporterError as err:
            assert err.issues and err.issues[0].file


@settings(max_examples=60, deadline=None)
@given(
    actions=st.lists(st.sampled_from(["SHOW TABLES", "blocked", "submit", "execute[ls]"]) | JSON, max_size=4),
    observations=st.lists(st.sampled_from(["[]", "Error executing query: x"]) | JSON, max_size=4),
    rewards=st.lists(st.sampled_from([0, 0.5, 1.0]) | JSON, max_size=4),
    valid=st.lists(st.booleans() | JSON, max_size=4),
    strategy=st.sampled_from(["multiturn", "react", "plan_solve"]),
)
def test_intercode_runs(actions: Any, observations: Any, rewards: Any, valid: Any, strategy: Any) -> None:
    run = {
        "environment": "ic_sql",
        "dataset": "./data/spider/dev_spider.json",
        "task_id": 1,
        "query": "q",
        "turn_history": {
            "actions": actions,
            "observations": observations,
            "rewards": rewards,
            "valid_action": valid,
            "thoughts": ["t"],
        },
        "summary": {"turns_max": 3},
    }
    source = intercode.LogFile(path="sql/m/f.json", model="m", strategy=strategy, refine_turns=1)
    try:
        intercode.convert(run, source, "0")
    except ImporterError as err:
        assert err.issues and err.issues[0].file
