"""What the Claude Code and Codex importers share: a streaming mapper from transcript
lines to format-v1 event dicts, and the facts a stop reason is built from.

One :class:`TranscriptMapper` subclass per harness turns one parsed transcript line
at a time into events (plain dicts, the wire form), so the importer (a whole file)
and the ``stopserve hook`` process (only the lines added since its last call) run
the same code and give the same ids, times and content hashes. Its state is small
and JSON-ready (:meth:`TranscriptMapper.dump` / :meth:`TranscriptMapper.load`): the
hook keeps it between calls.

Importing this module stays light (no pydantic, no numpy): it is on the hook's path.

Conventions shared by both harnesses:

* ``t`` is seconds since the transcript's first timestamp, never decreasing
  (a clock stepping back is clamped);
* tokens are uncached input plus output; cache reads (``cache_read_tokens``) and
  cache writes (``cache_write_tokens``) are extra event fields, never in ``tokens``.
  A usage report is put on the next event emitted;
* content is never kept: only :func:`content_ref` hashes (and sketches, unless
  ``sketch=False``: :func:`~stopserve.ids.content_refs`), so the service can see
  repetition without seeing text; the facts below stay on the machine;
* a tool result carries what its text shows about progress (``progress``: exit code,
  test counts, error signature, files changed; :func:`stopserve.signals.progress.extract`,
  run once per result, in this process);
* an event id already emitted (recently) is not emitted again, so a tool call seen
  first in a hook's input and later in the transcript counts once.
"""

from __future__ import annotations

import math
import os
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final

import orjson

from stopserve.ids import content_refs
from stopserve.importers._common import fail, finish

if TYPE_CHECKING:
    from stopserve.trace import Trace

__all__ = [
    "Facts",
    "TranscriptMapper",
    "build_trace",
    "first_line",
    "is_test_command",
    "map_file",
    "merge",
    "parse_time",
    "read_labels",
    "read_lines",
    "test_passed",
]

#: recent event ids remembered for de-duplication (a tool call and its result, in two places)
_RECENT_IDS: Final = 512
#: tool calls awaiting their result that are remembered (older ones are forgotten)
_PENDING_TOOLS: Final = 128
#: files named in the facts (the rest are counted)
_MAX_FILES: Final = 8

_TEST_RE: Final = re.compile(
    r"(?:^|[\s;&|(/])(?:"
    r"pytest|py\.test|python3?\s+-m\s+(?:pytest|unittest)|tox|nox|hatch\s+(?:run\s+)?test|"
    r"(?:npm|pnpm|yarn|bun)\s+(?:run\s+)?test|npx\s+(?:jest|vitest)|jest|vitest|mocha|"
    r"go\s+test|cargo\s+(?:test|nextest)|mvn\s+(?:\S+\s+)*test|gradlew?\s+(?:\S+\s+)*test|"
    r"make\s+(?:test|check)|ctest|rspec|phpunit|dotnet\s+test|mix\s+test|swift\s+test"
    r")(?=$|[\s;&|)])"
)
_FAILED_RE: Final = re.compile(
    r"\b[1-9]\d*\s+(?:failed|failing|errors?)\b|\bFAILED\b|^FAIL\b|\btest result: FAILED\b|"
    r"\bTests?:\s+\d+\s+failed\b|\bERRORS?\b:",
    re.MULTILINE,
)
_EXIT_RE: Final = re.compile(r"(?:exit(?:ed)?(?: with)? code|Exit code:?)\s*(-?\d+)", re.IGNORECASE)


def parse_time(value: Any) -> float | None:
    """Epoch seconds of an ISO-8601 timestamp (``2026-01-21T06:19:38.056Z``), else ``None``."""
    if not isinstance(value, str) or not value:
        return None
    try:
        ts = datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None
    return ts if math.isfinite(ts) else None


def first_line(text: str, limit: int = 100) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters."""
    for raw in text.splitlines():
        line = raw.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def is_test_command(command: str) -> bool:
    """Whether a shell command runs a test suite (pytest, npm test, go test, cargo test, ...).

    >>> is_test_command("cd app && python -m pytest -q"), is_test_command("git status")
    (True, False)
    """
    return bool(_TEST_RE.search(command))


def test_passed(error: bool, output: str) -> bool:
    """Whether a test run passed: no error flag, no non-zero exit code, no failure marker.

    >>> test_passed(False, "== 2 passed in 0.01s =="), test_passed(False, "1 failed, 3 passed")
    (True, False)
    """
    if error:
        return False
    code = _EXIT_RE.search(output)
    if code is not None and code.group(1) != "0":
        return False
    return not _FAILED_RE.search(output)


@dataclass
class Facts:
    """Simple facts read from the transcript, for a stop reason a person can act on.

    Only what the transcript shows: edits by the agent's edit tools (and patches),
    test runs recognised by their command (:func:`is_test_command`), the last tool
    error. Raw text stays on the machine (the service only ever sees hashes).
    """

    last_test: str | None = None
    last_test_passed: bool | None = None
    edited_after_test: list[str] = field(default_factory=list)
    n_edited_after_test: int = 0
    edits_total: int = 0
    tool_calls: int = 0
    last_call: str | None = None
    last_error_tool: str | None = None
    last_error: str | None = None
    last_call_failed: bool = False

    def edited(self, paths: Iterable[str]) -> None:
        """The agent changed these files."""
        for path in paths:
            self.edits_total += 1
            if path in self.edited_after_test:
                continue
            self.n_edited_after_test += 1
            if len(self.edited_after_test) < _MAX_FILES:
                self.edited_after_test.append(path)

    def tested(self, command: str, passed: bool) -> None:
        """A test run finished."""
        self.last_test = first_line(command)
        self.last_test_passed = passed
        self.edited_after_test = []
        self.n_edited_after_test = 0

    def result(self, tool: str, label: str, error: bool, output: str) -> None:
        """A tool call finished."""
        self.last_call = f"{tool}: {first_line(label)}" if label and label != tool else tool
        self.last_call_failed = error
        if error:
            self.last_error_tool = tool
            self.last_error = first_line(label) + (f": {first_line(output)}" if output.strip() else "")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Facts:
        """Read back :meth:`to_dict` (unknown keys ignored)."""
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


class TranscriptMapper:
    """Turns transcript lines (parsed JSON objects) into format-v1 event dicts, one line at a time.

    Subclasses implement :meth:`_map`. ``counts`` says how many lines were mapped,
    skipped as known non-events, unknown, or malformed (a line that is not a JSON
    object counts as malformed; the caller counts undecodable lines with
    :meth:`malformed`).
    """

    #: the name of the harness's own agent
    MAIN: ClassVar[str] = "main"
    #: the harness flags every failed tool result (Claude Code's ``is_error``), so a result
    #: not flagged succeeded; else only a stated exit code says so
    FLAGS_FAILURES: ClassVar[bool] = False
    #: tools whose result shows content (a file read, a page fetched, a search's hits), not what
    #: came of a step: a traceback in a page read is no error, so their text is read only on failure
    CONTENT_TOOLS: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, agent: str | None = None, *, sketch: bool = True) -> None:
        self.agent = agent or self.MAIN
        #: whether events carry a sketch of their text beside its hash (``--no-sketch``: not)
        self.sketch = sketch
        self.t0: float | None = None
        self.last_t = 0.0
        self.counts = {"lines": 0, "events": 0, "skipped": 0, "unknown": 0, "malformed": 0}
        self.facts = Facts()
        self._recent: deque[str] = deque(maxlen=_RECENT_IDS)
        self._recent_set: set[str] = set()
        # tool call id -> [tool, label, kind, agent]: kind "test", "edit", "agent" or ""
        self._tools: dict[str, list[str]] = {}
        self._tokens = 0
        self._cache_read = 0
        self._cache_write = 0
        self._out: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ feeding

    def feed(self, obj: Any) -> list[dict[str, Any]]:
        """The events of one parsed line (often none)."""
        self.counts["lines"] += 1
        if not isinstance(obj, dict):
            self.counts["malformed"] += 1
            return []
        self._out = []
        self._map(obj)
        out, self._out = self._out, []
        return out

    def drain(self) -> list[dict[str, Any]]:
        """Events emitted outside :meth:`feed` (a proposed stop, a hook's tool call)."""
        out, self._out = self._out, []
        return out

    def malformed(self) -> None:
        """Count a line that is not JSON."""
        self.counts["lines"] += 1
        self.counts["malformed"] += 1

    def feed_lines(self, lines: Iterable[bytes], too_long: int = 0) -> list[dict[str, Any]]:
        """The events of raw JSON Lines (blank ones skipped, undecodable or too long ones counted)."""
        for _ in range(too_long):
            self.malformed()
        events: list[dict[str, Any]] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                self.malformed()
                continue
            events.extend(self.feed(obj))
        return events

    def _map(self, obj: dict[str, Any]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def propose_stop(
        self, ts: float | None, last_message: str | None = None, turn_id: str | None = None
    ) -> None:
        """A ``Stop``/``SubagentStop`` hook fired: emit the proposed stop (harness-specific ids)."""
        raise NotImplementedError  # pragma: no cover - abstract

    def tool_event(
        self, call_id: str, name: str, tool_input: Any, tool_response: Any, ts: float | None, *, error: bool
    ) -> None:
        """A tool call seen in a tool hook's input (``tool_response`` ``None``: not run yet)."""
        raise NotImplementedError  # pragma: no cover - abstract

    # ------------------------------------------------------------------ building blocks

    def clock(self, ts: float | None) -> float:
        """``t`` of an event at epoch ``ts`` (``None``: at the latest time seen)."""
        if ts is not None:
            if self.t0 is None:
                self.t0 = ts
            self.last_t = max(self.last_t, round(ts - self.t0, 6))
        return self.last_t

    def usage(self, tokens: int, cache_read: int = 0, cache_write: int = 0) -> None:
        """Tokens spent; they go on the next event emitted."""
        self._tokens += max(0, tokens)
        self._cache_read += max(0, cache_read)
        self._cache_write += max(0, cache_write)

    def seen(self, event_id: str) -> bool:
        """Whether an event with this id was emitted recently."""
        return event_id in self._recent_set

    def emit(self, event: dict[str, Any]) -> None:
        """Queue one event (dropped when its id was emitted recently)."""
        eid = event["id"]
        if eid in self._recent_set:
            return
        if len(self._recent) == self._recent.maxlen:
            self._recent_set.discard(self._recent[0])
        self._recent.append(eid)
        self._recent_set.add(eid)
        if self._tokens or self._cache_read or self._cache_write:
            event["tokens"] = event.get("tokens", 0) + self._tokens
            if self._cache_read:
                event["cache_read_tokens"] = self._cache_read
            if self._cache_write:
                event["cache_write_tokens"] = self._cache_write
            self._tokens = self._cache_read = self._cache_write = 0
        self.counts["events"] += 1
        self._out.append(event)

    def event(self, eid: str, t: float, kind: str, agent: str, **fields: Any) -> dict[str, Any]:
        """An event dict with the ``None`` fields left out."""
        data: dict[str, Any] = {"id": eid, "t": t, "type": kind, "agent": agent}
        data.update({k: v for k, v in fields.items() if v is not None})
        return data

    def call(
        self,
        call_id: str,
        t: float,
        tool: str,
        payload: Any,
        *,
        agent: str | None = None,
        label: str = "",
        kind: str = "",
        edits: Iterable[str] = (),
    ) -> None:
        """A tool call: a ``tool_use`` event, remembered until its result comes."""
        agent = agent or self.agent
        refs = content_refs(payload, sketch=self.sketch)
        self.emit(self.event(call_id, t, "tool_use", agent, tool=tool, **refs))
        self.facts.tool_calls += 1
        paths = list(edits)
        if paths:
            self.facts.edited(paths)
        self.remember(call_id, tool, label, kind or ("edit" if paths else ""), tool)

    def remember(self, call_id: str, tool: str, label: str, kind: str, agent: str) -> None:
        """Keep what a result needs to know about its call (bounded)."""
        self._tools[call_id] = [tool, label, kind, agent]
        if len(self._tools) > _PENDING_TOOLS:
            del self._tools[next(iter(self._tools))]

    def result(
        self,
        call_id: str,
        t: float,
        ref_payload: Any,
        *,
        error: bool,
        output: str,
        exit_code: int | None = None,
    ) -> None:
        """The result of a tool call: a ``return`` event by the tool (or the sub-agent).

        Its ``progress`` is read from ``output`` with the call's tool and ``exit_code`` when
        the caller knows it; a write tool's success is one file changed, and its text is not
        read: it shows the file (a ``Write`` hook's ``tool_response`` holds the content written),
        not what came of the step; nor is a content tool's (:attr:`CONTENT_TOOLS`) that did not fail.
        A result already counted (a hook saw it before the transcript did) changes
        nothing: neither the event nor the facts, which the first copy set with its call.
        """
        if self.seen(f"{call_id}.out"):
            return
        # imported at the first result: its patterns take ~4 ms to compile, which a hook call
        # without a new result (a Stop, a PreToolUse) need not pay
        from stopserve.signals.progress import WRITE_TOOLS, progress_fields

        tool, label, kind, agent = self._tools.pop(call_id, None) or ["unknown", "", "", "unknown"]
        shown = not error and (tool in WRITE_TOOLS or tool in self.CONTENT_TOOLS)
        self.emit(
            self.event(
                f"{call_id}.out",
                t,
                "return",
                agent,
                tool=tool,
                **content_refs(ref_payload, text=output, sketch=self.sketch),
                error=error,
                **progress_fields(
                    None if shown else output,
                    tool=tool,
                    exit_code=exit_code,
                    failed=True if error else False if self.FLAGS_FAILURES else None,
                ),
            )
        )
        self.facts.result(tool, label, error, output)
        if kind == "test":
            self.facts.tested(label, test_passed(error, output))

    def pending_tool(self, call_id: str) -> bool:
        """Whether a tool call is waiting for its result."""
        return call_id in self._tools

    # ------------------------------------------------------------------ state

    def dump(self) -> dict[str, Any]:
        """The mapper's state as JSON-ready data (for the hook's state file)."""
        return {
            "agent": self.agent,
            "t0": self.t0,
            "last_t": self.last_t,
            "counts": dict(self.counts),
            "facts": self.facts.to_dict(),
            "recent": list(self._recent),
            "tools": self._tools,
            "usage": [self._tokens, self._cache_read, self._cache_write],
            "extra": self._dump_extra(),
        }

    def _dump_extra(self) -> dict[str, Any]:
        return {}

    def _load_extra(self, data: Mapping[str, Any]) -> None:
        return None

    @classmethod
    def load(cls, data: Mapping[str, Any]) -> TranscriptMapper:
        """A mapper in the state :meth:`dump` wrote (a bad or partial state starts fresh parts)."""
        mapper = cls(agent=str(data.get("agent") or cls.MAIN))
        t0 = data.get("t0")
        mapper.t0 = float(t0) if isinstance(t0, int | float) else None
        last_t = data.get("last_t")
        mapper.last_t = float(last_t) if isinstance(last_t, int | float) else 0.0
        counts = data.get("counts")
        if isinstance(counts, dict):
            for key in mapper.counts:
                if isinstance(counts.get(key), int):
                    mapper.counts[key] = counts[key]
        facts = data.get("facts")
        if isinstance(facts, dict):
            mapper.facts = Facts.from_dict(facts)
        recent = data.get("recent")
        if isinstance(recent, list):
            for eid in recent[-_RECENT_IDS:]:
                if isinstance(eid, str) and eid not in mapper._recent_set:
                    mapper._recent.append(eid)
                    mapper._recent_set.add(eid)
        tools = data.get("tools")
        if isinstance(tools, dict):
            mapper._tools = {
                k: [str(x) for x in v] for k, v in tools.items() if isinstance(v, list) and len(v) == 4
            }
        usage = data.get("usage")
        if isinstance(usage, list) and len(usage) == 3 and all(isinstance(x, int) for x in usage):
            mapper._tokens, mapper._cache_read, mapper._cache_write = usage
        extra = data.get("extra")
        mapper._load_extra(extra if isinstance(extra, dict) else {})
        return mapper


# --------------------------------------------------------------------------- reading lines

#: bytes read per call when no bound is given (a transcript line holding a file can be large)
READ_CHUNK: Final = 8 * 1024 * 1024


def read_lines(
    path: str, offset: int, max_bytes: int = READ_CHUNK, *, final: bool = False
) -> tuple[list[bytes], int, int]:
    """Complete lines of ``path`` from byte ``offset``: ``(lines, next offset, lines too long)``.

    At most ``max_bytes`` are read. A last line without its newline is left for the next
    call (its writer may be half-way through it) unless ``final`` (the file is complete).
    A single line longer than ``max_bytes`` is skipped whole and counted. Raises
    ``OSError`` when the file cannot be read.
    """
    with open(path, "rb") as fh:
        fh.seek(offset)
        chunk = fh.read(max_bytes)
        end = chunk.rfind(b"\n")
        if end < 0:
            if final and chunk and len(chunk) < max_bytes:
                return [chunk], offset + len(chunk), 0
            if len(chunk) < max_bytes:
                return [], offset, 0  # a line still being written
            # one line longer than the bound: skip to its end, count it
            pos = offset + len(chunk)
            while True:
                block = fh.read(1024 * 1024)
                if not block:
                    return [], pos if final else offset, 1 if final else 0
                nl = block.find(b"\n")
                if nl >= 0:
                    return [], pos + nl + 1, 1
                pos += len(block)
        body = chunk[: end + 1]
        lines = body.split(b"\n")[:-1]
        next_offset = offset + end + 1
        if final and len(chunk) < max_bytes and end + 1 < len(chunk):
            lines.append(chunk[end + 1 :])
            next_offset = offset + len(chunk)
        return lines, next_offset, 0


# --------------------------------------------------------------------------- importing whole files


def read_labels(path: str | os.PathLike[str]) -> dict[str, float]:
    """Session id -> reward from JSON Lines of ``{"session_id": ..., "reward": ...}`` (the last one wins)."""
    out: dict[str, float] = {}
    p = Path(path)
    try:
        lines = p.read_bytes().splitlines()
    except OSError as exc:
        raise fail(f"cannot read labels: {exc.strerror or exc}", file=p) from exc
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise fail(f"not valid JSON: {exc.msg}", file=p, line=i) from exc
        sid, reward = (obj.get("session_id"), obj.get("reward")) if isinstance(obj, dict) else (None, None)
        if not isinstance(sid, str) or not isinstance(reward, int | float) or isinstance(reward, bool):
            raise fail('expected {"session_id": string, "reward": number}', file=p, line=i)
        out[sid] = float(reward)
    return out


def map_file(path: Path, mapper: TranscriptMapper) -> list[dict[str, Any]]:
    """Every event of one transcript file, through ``mapper`` (a line that is not JSON is counted)."""
    events: list[dict[str, Any]] = []
    offset = 0
    while True:
        lines, offset_next, too_long = read_lines(str(path), offset, final=True)
        events += mapper.feed_lines(lines, too_long)
        if offset_next == offset:
            return events
        offset = offset_next


def merge(
    parts: Sequence[tuple[TranscriptMapper, list[dict[str, Any]]]],
) -> tuple[list[dict[str, Any]], float]:
    """Events of several transcripts in one time line (stable), ``t`` from the earliest start."""
    starts = [m.t0 for m, _ in parts if m.t0 is not None]
    origin = min(starts) if starts else 0.0
    keyed: list[tuple[float, int, int, dict[str, Any]]] = []
    for n, (mapper, events) in enumerate(parts):
        shift = (mapper.t0 - origin) if mapper.t0 is not None else 0.0
        keyed.extend((e["t"] + shift, n, i, e) for i, e in enumerate(events))
    keyed.sort(key=lambda row: row[:3])
    out: list[dict[str, Any]] = []
    last = 0.0
    for t, _, _, event in keyed:
        last = max(last, round(t, 6))
        event["t"] = last
        out.append(event)
    return out, last


def _why_empty(file: Path, counts: Mapping[str, int]) -> str:
    """Why a transcript gave no events, in the words the other importers use for a bad file."""
    lines = counts["lines"]
    if not lines:
        return "file is empty"
    if counts["malformed"] == lines:
        try:
            with file.open("rb") as fh:
                binary = b"\x00" in fh.read(8192)
        except OSError:
            binary = False
        if binary:
            return "binary content (NUL byte): not a transcript"
        return f"not valid JSON: none of its {lines} line(s) is a JSON object"
    return f"no events: none of its {lines} line(s) is a message or a tool call"


def build_trace(
    session_id: str,
    system: str,
    parts: Sequence[tuple[TranscriptMapper, list[dict[str, Any]]]],
    *,
    file: Path,
    reward: float | None,
) -> Trace:
    """One trace from a session's mapped transcripts (the main one first)."""
    from stopserve.trace import FORMAT_TAG

    events, last_t = merge(parts)
    if not events:
        raise fail(_why_empty(file, parts[0][0].counts), file=file)
    ended = events[-1]["type"] == "stop" and events[-1].get("proposed") is True
    reason = "information_complete" if ended else "unknown"
    events.append(
        {
            "id": "end",
            "t": last_t,
            "type": "stop",
            "agent": parts[0][0].agent,
            "reason": reason,
            "proposed": False,
        }
    )
    counts = {k: sum(m.counts[k] for m, _ in parts) for k in parts[0][0].counts}
    metrics: dict[str, float] = {"lines": float(counts["lines"])}
    metrics.update({f"lines_{k}": float(counts[k]) for k in ("skipped", "unknown", "malformed")})
    metrics["subagents"] = float(len(parts) - 1)
    trace: dict[str, Any] = {
        "format": FORMAT_TAG,
        "trace_id": session_id,
        "task_id": session_id,
        "system": system,
        "topology": "hierarchical" if len(parts) > 1 else "harness",
        "events": events,
        "costs": {
            "tokens": float(sum(e.get("tokens", 0) for e in events)),
            "cache_read_tokens": float(sum(e.get("cache_read_tokens", 0) for e in events)),
            "cache_write_tokens": float(sum(e.get("cache_write_tokens", 0) for e in events)),
            "tool_calls": float(sum(1 for e in events if e["type"] in ("tool_use", "delegate"))),
            "wall_clock_s": float(last_t),
        },
        "stop": {"reason": reason, "by": "orchestrator" if ended else "external", "t": last_t},
        "metrics": metrics,
    }
    if reward is not None:
        trace["rewards"] = {"team": reward}
        metrics["task_success"] = reward
    return finish(trace, file=file)
