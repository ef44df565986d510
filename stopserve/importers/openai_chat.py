"""Import runs logged as OpenAI chat-completions message lists.

One run is a JSON object ``{"messages": [...], "reward": 1.0, ...}`` (or a bare list
of messages); a ``.json`` file holds one run or a list of runs, a ``.jsonl`` /
``.jsonl.gz`` file one run a line. Optional run fields: ``trace_id`` (or ``id``),
``task_id`` (else the trace id), ``reward`` (number) or ``rewards`` (map), ``usage``
(run totals), ``metadata``. ``--reward`` gives runs without one a reward.

Messages map as:

=========================================  ============================================
message                                    events
=========================================  ============================================
``system``                                 none (its tokens count in the next call)
first ``user``                             ``delegate`` by ``user`` (the task)
later ``user``                             ``communicate`` by ``user``, ``role="human"``
``assistant`` with ``tool_calls``          one ``tool_use`` per call (``tool`` = function
                                           name, ref = hash of name and arguments)
``assistant`` with text only               ``aggregate`` (an answer: a decision point)
``tool`` (or legacy ``function``)          ``return`` by the tool (``error`` from an
                                           ``is_error``/``error`` flag when present)
=========================================  ============================================

The run ends in a ``stop`` event: ``information_complete`` when the last message is
an assistant answer, else ``unknown``.

Tokens: an assistant message's ``usage`` (``prompt_tokens + completion_tokens``) when
present; otherwise an estimate of one token per 4 characters of the message's own
text (content plus tool-call arguments), and ``metrics.tokens_estimated = 1``.
``usd`` comes from ``usage.cost`` when present. ``t``: a message's ``created`` or
``timestamp`` (Unix seconds or ISO 8601) relative to the first, else 0.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from stopserve.errors import ImporterError
from stopserve.ids import content_refs
from stopserve.importers._common import (
    CHARS_PER_TOKEN,
    OnError,
    fail,
    finish,
    is_json_lines,
    iter_files,
    iter_json_records,
    json_records,
    load_json,
    report,
)
from stopserve.trace import FORMAT_TAG, Trace

__all__ = ["CHARS_PER_TOKEN", "convert", "read"]

_SUFFIXES: Final = (".json", ".jsonl", ".jsonl.gz", ".json.gz", ".ndjson")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _time(msg: Mapping[str, Any]) -> float | None:
    for key in ("created", "timestamp", "created_at"):
        value = msg.get(key)
        number = _number(value)
        if number is not None:
            return number / 1000.0 if number > 1e11 else number  # milliseconds
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


def convert(
    data: Any,
    *,
    file: str | os.PathLike[str] = "<input>",
    line: int | None = None,
    index: int = 0,
    reward: float | None = None,
) -> Trace:
    """Turn one chat run (object with ``messages``, or a bare message list) into a :class:`Trace`."""
    if isinstance(data, list):
        data = {"messages": data}
    if not isinstance(data, dict):
        raise fail(
            f"a run must be a JSON object or a message list, got {type(data).__name__}", file=file, line=line
        )
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise fail("expected a non-empty list of chat messages", file=file, line=line, path="messages")
    stem = Path(file).name.split(".")[0]
    default_id = stem if line is None and index == 0 else f"{stem}:{line if line is not None else index}"
    trace_id = next((str(data[k]) for k in ("trace_id", "id", "run_id") if data.get(k)), default_id)
    task_id = str(data.get("task_id") or trace_id)

    events: list[dict[str, Any]] = []
    tool_names: dict[str, str] = {}
    first_time: float | None = None
    t = 0.0
    estimated = False
    seen_user = False
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise fail("expected a message object", file=file, line=line, path=where, trace_id=trace_id)
        role = msg.get("role")
        if not isinstance(role, str):
            raise fail(
                "expected a string 'role'", file=file, line=line, path=f"{where}.role", trace_id=trace_id
            )
        when = _time(msg)
        if when is not None:
            first_time = when if first_time is None else first_time
            t = max(t, when - first_time)
        text = _text(msg.get("content"))
        base: dict[str, Any] = {"t": t, "source_index": i}
        if role in ("system", "developer"):
            continue
        if role == "user":
            kind = "communicate" if seen_user else "delegate"
            events.append(
                {
                    **base,
                    "id": f"m{i}",
                    "type": kind,
                    "agent": str(msg.get("name") or "user"),
                    "role": "human",
                    "to": "assistant",
                    **content_refs(text),
                }
            )
            seen_user = True
            continue
        if role in ("tool", "function"):
            call_id = msg.get("tool_call_id")
            name = str(msg.get("name") or tool_names.get(str(call_id), "tool"))
            ev: dict[str, Any] = {
                **base,
                "id": f"m{i}",
                "type": "return",
                "agent": name,
                "tool": name,
                **content_refs(text),
            }
            flag = msg.get("is_error", msg.get("error"))
            if isinstance(flag, bool):
                ev["error"] = flag
            if isinstance(call_id, str):
                ev["tool_call_id"] = call_id
            events.append(ev)
            continue
        if role != "assistant":
            raise fail(
                f"unknown role {role!r}: expected system, user, assistant or tool",
                file=file,
                line=line,
                path=f"{where}.role",
                trace_id=trace_id,
            )
        agent = str(msg.get("name") or "assistant")
        calls = msg.get("tool_calls")
        if not isinstance(calls, list):
            calls = (
                [{"id": None, "function": msg["function_call"]}]
                if isinstance(msg.get("function_call"), dict)
                else []
            )
        usage = msg.get("usage") if isinstance(msg.get("usage"), dict) else None
        own = text
        new: list[dict[str, Any]] = []
        for j, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise fail(
                    "expected a function with a string 'name'",
                    file=file,
                    line=line,
                    path=f"{where}.tool_calls[{j}].function",
                    trace_id=trace_id,
                )
            args = fn.get("arguments")
            args_text = args if isinstance(args, str) else "" if args is None else str(args)
            own += args_text
            if isinstance(call.get("id"), str):
                tool_names[call["id"]] = fn["name"]
            new.append(
                {
                    **base,
                    "id": f"m{i}" if j == 0 else f"m{i}.{j}",
                    "type": "tool_use",
                    "agent": agent,
                    "role": "assistant",
                    "tool": fn["name"],
                    **content_refs(fn["name"] + "\0" + args_text),
                }
            )
        if not new:
            new.append(
                {
                    **base,
                    "id": f"m{i}",
                    "type": "aggregate",
                    "agent": agent,
                    "role": "assistant",
                    **content_refs(text),
                }
            )
        if usage is not None and _number(usage.get("prompt_tokens")) is not None:
            tokens = int(_number(usage.get("prompt_tokens")) or 0) + int(
                _number(usage.get("completion_tokens")) or 0
            )
            cost = _number(usage.get("cost"))
            if cost is not None and cost >= 0:
                new[0]["usd"] = cost
        else:
            tokens = math.ceil(len(own) / CHARS_PER_TOKEN)
            estimated = True
        new[0]["tokens"] = max(tokens, 0)
        events.extend(new)
    if not events:
        raise fail(
            "no user, assistant or tool messages", file=file, line=line, path="messages", trace_id=trace_id
        )
    last = messages[-1] if isinstance(messages[-1], dict) else {}
    answered = last.get("role") == "assistant" and events[-1]["type"] == "aggregate"
    reason = "information_complete" if answered else "unknown"
    events.append(
        {
            "id": "end",
            "t": t,
            "type": "stop",
            "agent": events[-1]["agent"] if answered else "assistant",
            "reason": reason,
            "proposed": False,
        }
    )

    trace: dict[str, Any] = {
        "format": FORMAT_TAG,
        "trace_id": trace_id,
        "task_id": task_id,
        "system": str(data.get("system") or "openai-chat"),
        "topology": data.get("topology") if isinstance(data.get("topology"), str) else "harness",
        "events": events,
        "stop": {"reason": reason, "by": "orchestrator", "t": t},
    }
    metrics: dict[str, float] = {}
    if estimated:
        metrics["tokens_estimated"] = 1.0
    rewards = data.get("rewards")
    value = _number(data.get("reward"))
    if isinstance(rewards, dict):
        trace["rewards"] = rewards
    elif value is not None:
        trace["rewards"] = {"team": value}
    elif data.get("reward") is not None:
        raise fail("expected a number", file=file, line=line, path="reward", trace_id=trace_id)
    elif reward is not None:
        trace["rewards"] = {"team": reward}
    run_usage = data.get("usage")
    if isinstance(run_usage, dict) and estimated:
        total = sum(int(_number(run_usage.get(k)) or 0) for k in ("prompt_tokens", "completion_tokens"))
        if total:
            trace["costs"] = {"tokens": float(total)}  # the run's own total beats the estimate
    if isinstance(data.get("metrics"), dict):
        metrics.update(data["metrics"])
    if metrics:
        trace["metrics"] = metrics
    return finish(trace, file=file, line=line)


def read(
    sources: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    reward: float | None = None,
    *,
    on_error: OnError = None,
) -> Iterator[Trace]:
    """Yield one :class:`Trace` per chat run in ``sources`` (files or folders).

    ``reward`` is given to runs that carry none. A run that cannot be converted raises
    :class:`ImporterError`, or goes to ``on_error`` and is skipped.
    """
    for path in iter_files(sources, _SUFFIXES):
        try:
            for index, (line, item) in enumerate(_runs(path)):
                if isinstance(item, ImporterError):
                    report(item, on_error)
                    continue
                try:
                    yield convert(item, file=path, line=line, index=index, reward=reward)
                except ImporterError as err:
                    report(err, on_error)
        except ImporterError as err:
            report(err, on_error)


def _runs(path: Path) -> Iterator[tuple[int | None, Any]]:
    if is_json_lines(path):
        yield from iter_json_records(path)
        return
    data = load_json(path)
    if isinstance(data, list) and data and all(isinstance(m, dict) and "role" in m for m in data):
        yield None, data  # one run as a bare message list
    else:
        yield from json_records(data, path)
