"""Import MINT benchmark runs (``results.jsonl``, gzipped or not) as format v1.

Layout (the benchmark's own output folders, kept in the shared copy)::

    <model>/F=<feedback model or None>/[PHF=<setting>/]max<T>_p<P>[+...]/<task type>/<family>/results.jsonl.gz

``model``, ``F``, ``PHF``, the limits (``max5_p2``: 5 turns, 2 proposals), the task type
and the family are read from the last six (or seven) parts of each file's path. A file
named on the command line whose path does not follow the layout is an error; one found
while walking a folder is skipped with the reason.

One line is one run: ``task`` (``task_id``, ``prompt``, ...) and ``state`` (``history``
of alternating ``user`` / ``assistant`` messages, ``success``, ``terminate_reason``,
``token_counter``). The first user message is the task prompt; every later action of the
model is one turn (``t`` = its index, the source has no timestamps):

* ``<solution>`` in the reply (MINT checks it first): ``stop`` with ``proposed: true``,
  ``reason: information_complete``, offline ``grade`` 1.0 for the proposal the run
  succeeded on, else 0.0; answered ``Your answer is wrong.`` -> ``reward`` 0.0 by ``env``;
* else code in ``<execute>...</execute>`` (or a fenced python block, which later MINT
  versions ask for) that the environment ran: ``tool_use`` (``tool: "python"``), then
  the ``Observation`` as a ``return`` by ``env`` (``error`` by :func:`is_error_output`,
  ``progress`` by :func:`stopserve.signals.progress.extract`: exception signature, counts);
* else (or ``I don't understand your input``): ``communicate`` to ``env`` and a
  ``return`` with ``error: true``; an action MINT did not record (an empty reply leaves
  two user messages in a row) is the same with an empty ref and ``missing: true``.

Two-agent runs (``F=<model>``) carry ``Expert feedback:`` after each observation: a
``communicate`` by ``feedback:<F>`` (``role: "critic"``) placed before the environment's
event of that turn. A success adds ``reward`` 1.0 by ``env`` (with ``grade`` 1.0) and a
final ``stop`` ``quality_met``; other ends map ``terminate_reason``. Tokens are whole-run
totals in MINT: :func:`apportion` spreads them over the turns in proportion to what each
turn read and wrote (docs/trace-format.md, section "mint").
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from stopserve.errors import ImporterError
from stopserve.ids import content_refs
from stopserve.importers._common import (
    CHARS_PER_TOKEN,
    OnError,
    fail,
    finish,
    iter_files,
    iter_json_records,
    report,
)
from stopserve.signals.progress import progress_fields
from stopserve.trace import FORMAT_TAG, Trace

__all__ = ["RunPath", "apportion", "convert", "is_error_output", "parse_path", "read"]

_SUFFIXES: Final = (".jsonl", ".jsonl.gz")
_LAYOUT: Final = (
    "<model>/F=<feedback model or None>/[PHF=.../]max<T>_p<P>[+...]/<task type>/<family>/results.jsonl[.gz]"
)
_SETTING_RE: Final = re.compile(r"max(\d+)_p(\d+)(?:\+.*)?")
_SOLUTION_RE: Final = re.compile(r"<solution>(.*?)</solution>", re.DOTALL)
_EXECUTE_RE: Final = re.compile(r"<execute>(.*?)</execute>", re.DOTALL)
_PYTHON_RE: Final = re.compile(r"```python(.*?)```", re.DOTALL)
_OBSERVATION: Final = "Observation:\n"
_FEEDBACK: Final = "\nExpert feedback:\n"
# the count-down MINT appends to every observation (StepOutput.to_str)
_TURN_INFO_RE: Final = re.compile(
    r"\nYou have -?\d+ steps left and -?\d+ chances to propose solution left\.\n"
    r"(?:You should take the last step to propose a solution\.\n)?"
)
_INVALID: Final = "I don't understand your input"
_WRONG: Final = "Your answer is wrong."
_TRACEBACK_RE: Final = re.compile(r"Traceback \(most recent call last\)")
_EXCEPTION_LINE_RE: Final = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)\b(?::|$)", re.M)
_BUDGET_REASONS: Final = ("max_steps", "max_propose_steps")


@dataclass(frozen=True, slots=True)
class RunPath:
    """What a MINT results file's path says about its runs."""

    model: str
    feedback: str  # "None" or the feedback model
    phf: str | None  # the pseudo-human-feedback setting, e.g. "no_GT-textual"
    max_turns: int
    max_proposals: int
    task_type: str
    family: str

    @property
    def two_agent(self) -> bool:
        """A second model wrote feedback after every turn."""
        return self.feedback != "None"


def parse_path(path: str | os.PathLike[str]) -> RunPath:
    """Read model, feedback model, limits and family from a results file's path.

    >>> parse_path("gpt-4-0613/F=None/max5_p2+tool+cd/reasoning/gsm8k/results.jsonl.gz").family
    'gsm8k'

    Raises :class:`ImporterError` naming the file when the path does not follow the layout.
    """
    parts = Path(path).parts
    if len(parts) >= 7 and parts[-5].startswith("PHF="):
        phf: str | None = parts[-5].removeprefix("PHF=")
        fb_at = -6
    else:
        phf = None
        fb_at = -5
    setting = _SETTING_RE.fullmatch(parts[-4]) if len(parts) >= 6 else None
    if len(parts) < 1 - fb_at or setting is None or not parts[fb_at].startswith("F="):
        raise fail(f"path does not follow the MINT layout {_LAYOUT}", file=path)
    feedback = parts[fb_at].removeprefix("F=")
    model = parts[fb_at - 1]
    if not feedback or not model or phf == "":
        raise fail(f"path does not follow the MINT layout {_LAYOUT}", file=path)
    return RunPath(
        model=model,
        feedback=feedback,
        phf=phf,
        max_turns=int(setting.group(1)),
        max_proposals=int(setting.group(2)),
        task_type=parts[-3],
        family=parts[-2],
    )


def is_error_output(observation: str) -> bool:
    """Whether a Python observation shows an exception.

    True when it holds ``Traceback (most recent call last)`` or a line that starts with
    an exception name and a colon (``NameError: ...``, ``SyntaxError: invalid syntax``):
    IPython prints one of the two for every uncaught exception.
    """
    return bool(_TRACEBACK_RE.search(observation) or _EXCEPTION_LINE_RE.search(observation))


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """Split ``total`` into integers proportional to ``weights`` that sum to ``total`` exactly.

    Each share is rounded down; the remainder goes to the last one (all to the last one
    when every weight is 0).

    >>> apportion(10, [1, 1, 1])
    [3, 3, 4]
    """
    n = len(weights)
    if n == 0:
        return []
    weight = sum(weights)
    if weight <= 0:
        return [0] * (n - 1) + [total]
    shares = [total * w // weight for w in weights]
    shares[-1] += total - sum(shares)
    return shares


# --------------------------------------------------------------------------- one run


@dataclass(slots=True)
class _Turn:
    text: str | None  # the model's reply; None when MINT did not record it
    context: int  # characters of the history the model read before it
    reply: str | None = None  # the next user message (observation, count-down, feedback)


def _history(state: Mapping[str, Any], file: str, line: int | None) -> list[tuple[str, str]]:
    history = state.get("history")
    if not isinstance(history, list) or not history:
        raise fail("expected a non-empty list of messages", file=file, line=line, path="state.history")
    out: list[tuple[str, str]] = []
    for i, msg in enumerate(history):
        where = f"state.history[{i}]"
        if not isinstance(msg, dict):
            raise fail("expected a message object", file=file, line=line, path=where)
        role, content = msg.get("role"), msg.get("content")
        if role not in ("user", "assistant"):
            raise fail(f"role {role!r} is not user or assistant", file=file, line=line, path=f"{where}.role")
        if not isinstance(content, str):
            raise fail("expected the content as a string", file=file, line=line, path=f"{where}.content")
        out.append((role, content))
    if out[0][0] != "user":
        raise fail("expected the user's task prompt first", file=file, line=line, path="state.history[0]")
    return out


def _turns(history: list[tuple[str, str]], ended_in_error: bool) -> list[_Turn]:
    turns: list[_Turn] = []
    context = len(history[0][1])
    previous = "user"
    for role, content in history[1:]:
        if role == "assistant":
            turns.append(_Turn(content, context))
        elif previous == "assistant":
            turns[-1].reply = content
        else:  # a user message after a user message: the action between was empty
            turns.append(_Turn(None, context, content))
        context += len(content)
        previous = role
    if len(history) > 1 and previous == "user" and not ended_in_error:
        # MINT logs no reply once a run is finished: a final user message means one more
        # (empty, unrecorded) action ended it; an error ends the run without one
        turns.append(_Turn(None, context))
    return turns


def _split_reply(reply: str) -> tuple[str, str | None]:
    """(observation, feedback) of a user message after an action."""
    body = reply.removeprefix(_OBSERVATION)
    for match in _TURN_INFO_RE.finditer(body):
        rest = body[match.end() :]
        if not rest or rest.startswith(_FEEDBACK):
            feedback = rest[len(_FEEDBACK) :].strip() if rest else None
            return body[: match.start()], feedback or None
    head, sep, tail = body.rpartition(_FEEDBACK)
    if sep:
        return head, tail.strip() or None
    return body.rstrip("\n"), None


def _counter(counter: Mapping[str, Any], key: str) -> int | None:
    value = counter.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return int(value)
    return None


def _estimate(chars: Sequence[int]) -> list[int]:
    return [math.ceil(c / CHARS_PER_TOKEN) for c in chars]


def _split_tokens(
    prompt: int | None, completion: int | None, context: Sequence[int], written: Sequence[int]
) -> tuple[list[int], bool]:
    """Per-call tokens: the totals spread by characters read and written, or chars/4 each."""
    reads = apportion(prompt, context) if prompt is not None else _estimate(context)
    writes = apportion(completion, written) if completion is not None else _estimate(written)
    return [r + w for r, w in zip(reads, writes, strict=True)], prompt is None or completion is None


def _final_reason(success: bool, terminate: Any) -> tuple[str, str, str | None]:
    """(reason, by, limit) of the run's end."""
    if success:
        return "quality_met", "safety_net", None
    if terminate in _BUDGET_REASONS:
        return "budget_exhausted", "safety_net", "turns"
    if terminate == "error":
        return "error", "external", None
    return "unknown", "external", None


def convert(
    record: Any,
    where: RunPath,
    *,
    file: str | os.PathLike[str],
    line: int | None = None,
    sketch: bool = True,
) -> Trace:
    """Convert one parsed line of a MINT ``results.jsonl`` whose path said ``where``.

    ``sketch=False`` leaves the texts' sketches out (their hashes stay).
    """
    name = str(file)
    if not isinstance(record, dict):
        raise fail(f"expected a JSON object, got {type(record).__name__}", file=name, line=line)
    task, state = record.get("task"), record.get("state")
    if not isinstance(task, dict):
        raise fail("expected an object", file=name, line=line, path="task")
    if not isinstance(state, dict):
        raise fail("expected an object", file=name, line=line, path="state")
    raw_id = task.get("task_id")
    if isinstance(raw_id, bool) or not isinstance(raw_id, int | str) or raw_id == "":
        raise fail("expected a task id (string or integer)", file=name, line=line, path="task.task_id")
    success = state.get("success")
    if not isinstance(success, bool):
        raise fail("expected true or false", file=name, line=line, path="state.success")
    terminate = state.get("terminate_reason")
    history = _history(state, name, line)
    turns = _turns(history, terminate == "error")
    model = where.model
    fb_agent = f"feedback:{where.feedback}"

    # tokens: whole-run totals spread over the calls that spent them
    counter = state.get("token_counter")
    counter = counter if isinstance(counter, dict) else {}
    prompt = _counter(counter, "prompt_tokens")
    if prompt is None:
        prompt = _counter(counter, "token_count")  # PaLM: count_message_tokens of the prompts
    completion = _counter(counter, "completion_tokens")
    model_tokens, estimated = _split_tokens(
        prompt,
        completion,
        [t.context for t in turns],
        [len(t.text or "") for t in turns],
    )
    feedback_at: list[int] = []  # turn index of each feedback message
    feedback_read: list[int] = []
    feedback_written: list[int] = []
    split: list[tuple[str, str | None] | None] = []
    for k, turn in enumerate(turns):
        if turn.reply is None:
            split.append(None)
            continue
        observation, feedback = _split_reply(turn.reply)
        split.append((observation, feedback))
        if feedback is not None:
            feedback_at.append(k)
            # the critic reads the history and this turn's action and observation
            feedback_read.append(turn.context + len(turn.text or "") + len(turn.reply) - len(feedback))
            feedback_written.append(len(feedback))
    fb_tokens: list[int] = []
    if feedback_at:
        fb_tokens, fb_estimated = _split_tokens(
            _counter(counter, "feedback_prompt_tokens"),
            _counter(counter, "feedback_completion_tokens"),
            feedback_read,
            feedback_written,
        )
        estimated = estimated or fb_estimated
    fb_of_turn = dict(zip(feedback_at, fb_tokens, strict=True))

    events: list[dict[str, Any]] = []
    n_tool = n_propose = n_invalid = n_missing = 0
    last = len(turns) - 1
    for k, turn in enumerate(turns):
        won = success and k == last
        text = turn.text
        act: dict[str, Any] = {"id": f"turn{k + 1}.model", "t": k, "agent": model, "role": "assistant"}
        act["tokens"] = model_tokens[k]
        reply = split[k]
        observation = reply[0] if reply is not None else ""
        refused = observation.lstrip().startswith(_INVALID)
        code = None
        if text is not None and "<solution>" not in text:
            blocks = _EXECUTE_RE.findall(text) or _PYTHON_RE.findall(text)
            code = "\n".join(b.strip() for b in blocks) if blocks else None
        if text is not None and "<solution>" in text:
            kind = "propose"
            answer = "\n".join(a.strip() for a in _SOLUTION_RE.findall(text))
            act.update(
                type="stop",
                proposed=True,
                reason="information_complete",
                **content_refs(answer or text, sketch=sketch),
                grade=1.0 if won else 0.0,
            )
            n_propose += 1
        elif code is not None and not refused:
            kind = "tool"
            act.update(type="tool_use", tool="python", **content_refs(code, sketch=sketch))
            n_tool += 1
        else:
            kind = "invalid"
            act.update(type="communicate", to="env", **content_refs(text or "", sketch=sketch))
            if text is None:
                act["missing"] = True
                n_missing += 1
            else:
                n_invalid += 1
        events.append(act)
        if reply is not None:
            feedback = reply[1]
            if feedback is not None:
                events.append(
                    {
                        "id": f"turn{k + 1}.feedback",
                        "t": k,
                        "type": "communicate",
                        "agent": fb_agent,
                        "role": "critic",
                        "to": model,
                        **content_refs(feedback, sketch=sketch),
                        "tokens": fb_of_turn[k],
                    }
                )
            env: dict[str, Any] = {"id": f"turn{k + 1}.env", "t": k, "agent": "env"}
            if kind == "propose" and observation.strip().startswith(_WRONG):
                env.update(type="reward", channel="quality", value=0.0)
            else:
                env.update(type="return", **content_refs(observation, sketch=sketch))
                if kind == "tool":
                    env.update(tool="python", error=is_error_output(observation))
                else:  # refused, or a proposal MINT could not parse
                    env["error"] = True
                env.update(progress_fields(observation, tool=env.get("tool"), failed=env["error"]))
            events.append(env)
        if won:
            events.append(
                {
                    "id": f"turn{k + 1}.success",
                    "t": k,
                    "type": "reward",
                    "agent": "env",
                    "channel": "quality",
                    "value": 1.0,
                    "grade": 1.0,
                }
            )

    t_end = max(last, 0)
    reason, by, limit = _final_reason(success, terminate)
    end: dict[str, Any] = {
        "id": "end",
        "t": t_end,
        "type": "stop",
        "agent": "env",
        "reason": reason,
        "proposed": False,
    }
    if isinstance(terminate, str):
        end["terminate_reason"] = terminate
    if not turns and (prompt or completion):
        end["tokens"] = (prompt or 0) + (completion or 0)  # a run with no recorded call
    events.append(end)
    stop: dict[str, Any] = {"reason": reason, "by": by, "t": t_end}
    if limit:
        stop["limit"] = limit

    trace_id = "/".join(
        p for p in ("mint", model, where.feedback, where.phf, where.family, str(raw_id)) if p is not None
    )
    metrics: dict[str, float] = {
        "two_agent": float(where.two_agent),
        "max_turns": float(where.max_turns),
        "max_proposals": float(where.max_proposals),
        "turns": float(len(turns)),
        "tool_calls": float(n_tool),
        "proposals": float(n_propose),
        "invalid_actions": float(n_invalid),
        "missing_actions": float(n_missing),
        "tokens_estimated": float(estimated),
        "task_success": float(success),
    }
    if feedback_at:
        metrics["feedback_tokens"] = float(sum(fb_tokens))
    trace: dict[str, Any] = {
        "format": FORMAT_TAG,
        "trace_id": trace_id,
        "task_id": f"mint/{where.family}/{raw_id}",
        "system": f"mint/{model}",
        "topology": "planner_executor_critic" if where.two_agent else "harness",
        "events": events,
        "rewards": {"team": 1.0 if success else 0.0},
        "costs": {
            "tokens": float(sum(e.get("tokens", 0) for e in events)),
            "tool_calls": float(n_tool),
            "messages": float(len(history)),
        },
        "stop": stop,
        "metrics": metrics,
    }
    return finish(trace, file=name, line=line)


# --------------------------------------------------------------------------- entry point


def read(
    sources: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    *,
    on_error: OnError = None,
    sketch: bool = True,
) -> Iterator[Trace]:
    """Yield one :class:`Trace` per line of MINT ``results.jsonl`` / ``results.jsonl.gz`` files.

    ``sources`` are files or folders (searched recursively for ``.jsonl`` and ``.jsonl.gz``).
    A line that cannot be converted, or a file found in a folder whose path does not
    follow the layout, raises :class:`ImporterError` or goes to ``on_error`` and is
    skipped; a file named directly whose path does not follow the layout always raises.
    ``sketch=False`` leaves the texts' sketches out (``stopserve import --no-sketch``).

    >>> traces = read("../shared/data/mint-train")  # doctest: +SKIP
    """
    if isinstance(sources, str | os.PathLike):
        sources = [sources]
    for source in sources:
        named = Path(source).is_file()
        for path in iter_files([source], _SUFFIXES):
            layout_error: ImporterError | None = None
            try:
                where: RunPath | None = parse_path(path)
            except ImporterError as err:
                if not named:
                    report(err, on_error)
                    continue
                where, layout_error = None, err
            records = iter_json_records(path)
            while True:
                try:
                    item = next(records, None)
                except ImporterError as err:  # the file as a whole: unreadable, empty, binary
                    report(err, on_error)
                    break
                if item is None:
                    break
                line, record = item
                if isinstance(record, ImporterError):
                    report(record, on_error)
                    continue
                if where is None:
                    # a file named directly must follow the layout; checked after its
                    # content so that an unreadable file says so first
                    assert layout_error is not None
                    raise layout_error
                try:
                    yield convert(record, where, file=path, line=line, sketch=sketch)
                except ImporterError as err:
                    report(err, on_error)
