"""Import Claude Code session transcripts (``~/.claude/projects/<project>/<session>.jsonl``).

A session transcript is JSON Lines, one line per message part; a session's
sub-agents (launched by the ``Task``/``Agent`` tool) write their own transcripts to
``<session>/subagents/agent-<agentId>.jsonl`` beside it. One session becomes one
trace (``trace_id`` = ``task_id`` = the session id, ``system="claude-code"``,
``topology="harness"``, ``"hierarchical"`` with sub-agents). Lines map as:

* a ``user`` line with text (a prompt) -> ``communicate`` by ``user``, role ``human``;
  a harness note (``isMeta``, e.g. "Stop hook feedback: ...") -> ``communicate`` by
  ``harness``, role ``hook``;
* an ``assistant`` line: each ``text`` block -> ``communicate`` by the agent; each
  ``tool_use`` block -> ``tool_use`` (``tool`` = its name, ``content_ref`` = hash of
  name and input, the free-text ``description`` left out); a ``Task``/``Agent`` call
  -> ``spawn`` of the sub-agent and ``delegate`` to it; ``thinking`` blocks -> nothing;
* a ``tool_result`` block -> ``return`` by the tool (by the sub-agent for a
  ``Task``/``Agent`` call), id ``<tool_use id>.out``, ``error`` from ``is_error``,
  ``content_ref`` = hash of the line's ``toolUseResult`` (the structured result, the
  same object a ``PostToolUse`` hook receives as ``tool_response``), else of the text;
  ``progress`` from the text (:func:`stopserve.signals.progress.extract`: test counts,
  the exit code of a failed ``Bash`` call's "Exit code N", an error signature, one file
  changed by an ``Edit``/``Write``/``MultiEdit``/``NotebookEdit`` that did not fail); a
  result not flagged ``is_error`` is a success; the text of a write, ``Read``, ``Grep``,
  ``Glob``, ``LS``, ``WebFetch`` or ``WebSearch`` that did not fail is content, not read;
* an assistant turn ending in text (the next line is a prompt, a harness note, or
  the end) -> a proposed ``stop`` (``information_complete``): where the ``Stop`` hook
  fires live;
* a sub-agent's transcript: the same, under its agent id, merged in time order.

Tokens: ``input_tokens + output_tokens`` of ``message.usage``, once per API message
(Claude Code writes one line per content block and repeats the message's usage on
each; a later, larger report adds only the difference). Cache reads
(``cache_read_input_tokens``) and writes (``cache_creation_input_tokens``) go to the
event fields ``cache_read_tokens`` and ``cache_write_tokens``, never into ``tokens``.
No cost in USD is recorded (transcripts carry none).

``summary``, ``system``, ``file-history-snapshot``, ``queue-operation`` and other
bookkeeping lines are skipped; unknown line types and lines that are not JSON are
skipped too: all are counted in ``metrics`` (``lines_skipped``, ``lines_unknown``,
``lines_malformed``), never fatal. Outcomes come from ``labels`` (the hook's
``labels.jsonl``, or any JSON Lines of ``{"session_id", "reward"}``) as
``rewards.team``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from stopserve.errors import ImporterError
from stopserve.ids import content_ref, content_refs
from stopserve.importers._common import OnError, fail, iter_files, report
from stopserve.importers._transcript import (
    TranscriptMapper,
    build_trace,
    is_test_command,
    map_file,
    parse_time,
    read_labels,
)

if TYPE_CHECKING:
    from stopserve.trace import Trace

__all__ = ["ClaudeCodeMapper", "read", "subagent_transcripts"]

#: line types that carry no event (bookkeeping of the harness)
_SKIP_TYPES: Final = frozenset(
    {
        "summary",
        "system",
        "file-history-snapshot",
        "queue-operation",
        "progress",
        "custom-title",
        "agent-name",
        "tag",
        "last-prompt",
        "permission-mode",
        "attachment",
    }
)
_AGENT_TOOLS: Final = frozenset({"Task", "Agent"})
_EDIT_TOOLS: Final = frozenset({"Edit", "Write", "MultiEdit", "NotebookEdit"})
_SHELL_TOOLS: Final = frozenset({"Bash", "BashOutput"})
_USAGE_KEPT: Final = 64
_HARNESS_PREFIXES: Final = ("<command-", "<local-command", "Caveat:", "<system-reminder>")


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else 0


def tool_payload(name: str, tool_input: Any) -> dict[str, Any]:
    """What a tool call's ``content_ref`` hashes: its name and input, without free-text fields."""
    if isinstance(tool_input, dict):
        tool_input = {k: v for k, v in tool_input.items() if k != "description"}
    return {"name": name, "input": tool_input}


class ClaudeCodeMapper(TranscriptMapper):
    """Claude Code transcript lines -> events (see the module docstring)."""

    FLAGS_FAILURES = True  # a failed tool result has is_error (a Bash one: "Exit code N" too)
    CONTENT_TOOLS = frozenset({"Read", "NotebookRead", "Grep", "Glob", "LS", "WebFetch", "WebSearch"})

    def __init__(self, agent: str | None = None, agent_ids: Mapping[str, str] | None = None) -> None:
        super().__init__(agent)
        self.agent_ids = dict(agent_ids or {})  # Task tool_use id -> sub-agent id (importer look-ahead)
        self._usage: OrderedDict[str, list[int]] = OrderedDict()
        self._text_uuid: str | None = None  # the agent's last activity was this text line
        self._text_ref: str | None = None
        self._closed_ref: str | None = None  # a live stop already proposed after this text
        self._stops = 0

    # ------------------------------------------------------------------ lines

    def _map(self, obj: dict[str, Any]) -> None:
        kind = obj.get("type")
        if kind in _SKIP_TYPES:
            self.counts["skipped"] += 1
            return
        if kind not in ("user", "assistant"):
            self.counts["unknown"] += 1
            return
        message = obj.get("message")
        if not isinstance(message, dict):
            self.counts["malformed"] += 1
            return
        t = self.clock(parse_time(obj.get("timestamp")))
        uuid = obj.get("uuid")
        uuid = uuid if isinstance(uuid, str) and uuid else f"line{self.counts['lines']}"
        agent = self.agent
        if agent == self.MAIN and obj.get("isSidechain") is True:
            agent = str(obj.get("agentId") or "sidechain")  # older versions: sub-agents inline
        if kind == "assistant":
            self._assistant(message, uuid, t, agent)
        else:
            self._user(obj, message, uuid, t, agent)

    def _assistant(self, message: dict[str, Any], uuid: str, t: float, agent: str) -> None:
        usage = message.get("usage")
        if isinstance(usage, dict):
            self._count_usage(str(message.get("id") or uuid), usage)
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        for k, block in enumerate(blocks):
            if not isinstance(block, dict):
                continue
            btype = block.get("type")
            if btype == "text":
                text = block.get("text")
                if not isinstance(text, str) or not text.strip():
                    continue
                said = content_refs(text, sketch=self.sketch)
                ref = said["content_ref"]
                self.emit(self.event(f"{uuid}.{k}", t, "communicate", agent, role="assistant", **said))
                if ref == self._closed_ref:
                    self._closed_ref = None  # the text a live stop was already proposed after
                else:
                    self._text_uuid, self._text_ref = uuid, ref
            elif btype in ("tool_use", "server_tool_use"):
                self._text_uuid = None
                self._tool_use(block, t, agent)

    def _tool_use(self, block: dict[str, Any], t: float, agent: str) -> None:
        call_id = block.get("id")
        name = block.get("name")
        if not isinstance(call_id, str) or not call_id or not isinstance(name, str):
            self.counts["malformed"] += 1
            return
        tool_input = block.get("input")
        inp = tool_input if isinstance(tool_input, dict) else {}
        if name in _AGENT_TOOLS:
            sub = self.agent_ids.get(call_id) or f"task-{call_id[-8:]}"
            role = inp.get("subagent_type")
            self.emit(
                self.event(f"{call_id}.spawn", t, "spawn", sub, role=role if isinstance(role, str) else None)
            )
            refs = content_refs(tool_payload(name, tool_input), sketch=self.sketch)
            self.emit(self.event(call_id, t, "delegate", agent, to=sub, tool=name, **refs))
            self.facts.tool_calls += 1
            self.remember(call_id, name, str(inp.get("description") or name), "agent", sub)
            return
        command = inp.get("command")
        label = command if isinstance(command, str) else name
        kind = (
            "test" if name in _SHELL_TOOLS and isinstance(command, str) and is_test_command(command) else ""
        )
        path = inp.get("file_path") or inp.get("notebook_path")
        edits = [path] if name in _EDIT_TOOLS and isinstance(path, str) and path else []
        if edits:
            label = f"{name} {edits[0]}"
        self.call(
            call_id, t, name, tool_payload(name, tool_input), agent=agent, label=label, kind=kind, edits=edits
        )

    def _user(self, obj: dict[str, Any], message: dict[str, Any], uuid: str, t: float, agent: str) -> None:
        content = message.get("content")
        results = (
            [
                b
                for b in content
                if isinstance(b, dict) and b.get("type") in ("tool_result", "web_search_tool_result")
            ]
            if isinstance(content, list)
            else []
        )
        if results:
            structured = obj.get("toolUseResult") if len(results) == 1 else None
            for block in results:
                call_id = block.get("tool_use_id")
                if not isinstance(call_id, str) or not call_id:
                    self.counts["malformed"] += 1
                    continue
                self._text_uuid = None
                text = _text_of(block.get("content"))
                payload = structured if structured is not None else text
                self.result(call_id, t, payload, error=block.get("is_error") is True, output=text)
            return
        text = _text_of(content)
        if not text.strip():
            self.counts["skipped"] += 1
            return
        meta = obj.get("isMeta") is True or text.lstrip().startswith(_HARNESS_PREFIXES)
        self.close_turn(t)
        if meta:
            self.emit(
                self.event(
                    uuid, t, "communicate", "harness", role="hook", **content_refs(text, sketch=self.sketch)
                )
            )
        else:
            self.emit(
                self.event(
                    uuid, t, "communicate", "user", role="human", **content_refs(text, sketch=self.sketch)
                )
            )

    def _count_usage(self, msg_id: str, usage: dict[str, Any]) -> None:
        now = [
            _int(usage.get("input_tokens")) + _int(usage.get("output_tokens")),
            _int(usage.get("cache_read_input_tokens")),
            _int(usage.get("cache_creation_input_tokens")),
        ]
        before = self._usage.get(msg_id)
        if before is None:
            self._usage[msg_id] = now
            if len(self._usage) > _USAGE_KEPT:
                self._usage.popitem(last=False)
            self.usage(*now)
            return
        delta = [max(0, a - b) for a, b in zip(now, before, strict=True)]
        self._usage[msg_id] = [max(a, b) for a, b in zip(now, before, strict=True)]
        if any(delta):
            self.usage(*delta)

    # ------------------------------------------------------------------ stops

    def close_turn(self, t: float | None = None) -> None:
        """The agent's turn ended in text: a proposed stop after it (no-op otherwise)."""
        if self._text_uuid is None:
            return
        when = self.last_t if t is None else t
        self.emit(
            self.event(
                f"{self._text_uuid}.stop",
                when,
                "stop",
                self.agent,
                reason="information_complete",
                proposed=True,
                content_ref=self._text_ref,
            )
        )
        self._text_uuid = None

    def propose_stop(
        self, ts: float | None, last_message: str | None = None, turn_id: str | None = None
    ) -> None:
        """A ``Stop``/``SubagentStop`` hook fired: the agent proposes to stop now.

        When the transcript already shows the turn's final text, the stop gets the id the
        importer gives it; otherwise (the text not written yet) a stop of its own, and
        that text, when it comes, does not propose again.
        """
        ref = content_ref(last_message) if isinstance(last_message, str) and last_message.strip() else None
        if self._text_uuid is not None and (ref is None or ref == self._text_ref):
            self.close_turn(self.clock(ts))
            return
        self._stops += 1
        self.emit(
            self.event(
                f"stop-{self._stops}",
                self.clock(ts),
                "stop",
                self.agent,
                reason="information_complete",
                proposed=True,
                content_ref=ref,
            )
        )
        self._text_uuid = None
        self._closed_ref = ref

    def tool_event(
        self, call_id: str, name: str, tool_input: Any, tool_response: Any, ts: float | None, *, error: bool
    ) -> None:
        """A tool call seen in a ``PreToolUse``/``PostToolUse`` hook's input (``tool_response``
        ``None``: not run yet); ids as in the transcript, so it counts once."""
        t = self.clock(ts)
        if not self.seen(call_id) and not self.pending_tool(call_id):
            self._text_uuid = None
            self._tool_use({"id": call_id, "name": name, "input": tool_input}, t, self.agent)
        if tool_response is not None and not self.seen(f"{call_id}.out"):
            text = tool_response if isinstance(tool_response, str) else _response_text(tool_response)
            if error:  # the tool_result's text (the facts' words) has no "Error: " before it
                text = text.removeprefix("Error: ")
            self.result(call_id, t, tool_response, error=error, output=text)

    # ------------------------------------------------------------------ state

    def _dump_extra(self) -> dict[str, Any]:
        return {
            "usage_ids": [[k, *v] for k, v in self._usage.items()],
            "text": [self._text_uuid, self._text_ref, self._closed_ref],
            "stops": self._stops,
        }

    def _load_extra(self, data: Mapping[str, Any]) -> None:
        for row in data.get("usage_ids") or []:
            if isinstance(row, list) and len(row) == 4 and isinstance(row[0], str):
                self._usage[row[0]] = [int(x) for x in row[1:]]
        text = data.get("text")
        if isinstance(text, list) and len(text) == 3:
            self._text_uuid, self._text_ref, self._closed_ref = (
                x if isinstance(x, str) else None for x in text
            )
        stops = data.get("stops")
        self._stops = stops if isinstance(stops, int) else 0


def _response_text(response: Any) -> str:
    if isinstance(response, dict):
        parts = [response.get(k) for k in ("stdout", "stderr", "error", "output", "content")]
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


# --------------------------------------------------------------------------- files


def subagent_transcripts(transcript: Path) -> list[Path]:
    """The sub-agent transcripts of a session: ``<session>/subagents/**/*.jsonl``, sorted."""
    folder = transcript.with_suffix("") / "subagents"
    return sorted(folder.rglob("*.jsonl")) if folder.is_dir() else []


def _agent_id(path: Path) -> str:
    return path.stem.removeprefix("agent-") or path.stem


def _agent_hints(path: Path) -> dict[str, str]:
    """Task/Agent tool_use id -> sub-agent id, from the results that name it (``toolUseResult.agentId``)."""
    import orjson

    hints: dict[str, str] = {}
    with path.open("rb") as fh:
        for line in fh:
            if b'"agentId"' not in line or b"tool_use_id" not in line:
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            result = obj.get("toolUseResult") if isinstance(obj, dict) else None
            content = (obj.get("message") or {}).get("content") if isinstance(obj, dict) else None
            if (
                not isinstance(result, dict)
                or not isinstance(result.get("agentId"), str)
                or not isinstance(content, list)
            ):
                continue
            for block in content:
                if isinstance(block, dict) and isinstance(block.get("tool_use_id"), str):
                    hints[block["tool_use_id"]] = result["agentId"]
    return hints


def read(
    sources: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    labels: str | os.PathLike[str] | None = None,
    *,
    on_error: OnError = None,
) -> Iterator[Trace]:
    """Yield one :class:`Trace` per session transcript (files, or folders searched recursively).

    >>> traces = read("~/.claude/projects/-home-me-app")  # doctest: +SKIP
    """
    rewards = read_labels(labels) if labels is not None else {}
    # a sub-agent's transcript (under subagents/) is read with its parent session, not alone
    for path in iter_files(sources, (".jsonl",), skip_dirs=("subagents",)):
        try:
            parts: list[tuple[TranscriptMapper, list[dict[str, Any]]]] = []
            transcripts = [(path, ClaudeCodeMapper(agent_ids=_agent_hints(path)))]
            transcripts += [(p, ClaudeCodeMapper(agent=_agent_id(p))) for p in subagent_transcripts(path)]
            for file, mapper in transcripts:
                events = map_file(file, mapper)
                mapper.close_turn()  # the transcript ends after the agent's last words
                parts.append((mapper, events + mapper.drain()))
            yield build_trace(path.stem, "claude-code", parts, file=path, reward=rewards.get(path.stem))
        except OSError as exc:
            report(fail(f"cannot read: {exc.strerror or exc}", file=path), on_error)
        except ImporterError as err:
            report(err, on_error)
