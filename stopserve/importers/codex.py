"""Import Codex CLI session rollouts (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``).

A rollout is JSON Lines of ``{"timestamp", "type", "payload"}`` records:
``session_meta`` (the thread id; a sub-agent's rollout names its parent thread and
the spawning call in ``source.subagent.thread_spawn``), ``response_item`` (messages,
reasoning, tool calls and their outputs), ``event_msg`` (user messages, token counts,
turn starts and ends, command ends) and ``turn_context``. One thread becomes one
trace (``trace_id`` = ``task_id`` = the thread id, ``system="codex"``), its sub-agent
threads merged in under their thread ids. Records map as:

* ``event_msg`` ``user_message`` -> ``communicate`` by ``user``, role ``human`` (the
  ``response_item`` user and developer messages repeat it or hold injected context:
  skipped); a ``response_item`` assistant ``message`` -> ``communicate`` by the agent
  (its ``event_msg`` ``agent_message`` copy is skipped);
* ``function_call``, ``custom_tool_call`` (``apply_patch``) and ``local_shell_call``
  -> ``tool_use`` (``content_ref`` = hash of tool and input; the shell tools
  ``shell``, ``exec_command``, ``local_shell``, ... are all ``Bash`` with their command
  line, as Codex names them to hooks); ``spawn_agent`` -> ``spawn`` + ``delegate``;
* their outputs -> ``return`` (id ``<call_id>.out``), ``error`` from the exit code
  (``metadata.exit_code``, "Process exited with code N", or the ``exec_command_end``
  event); ``content_ref`` hashes the output without its timing lines ("Wall time",
  "Chunk ID", ...), so the same command with the same output hashes the same;
  ``progress`` from the output and that exit code (:func:`stopserve.signals.progress.extract`:
  test counts, an error signature, files changed from ``apply_patch``'s "Success. Updated
  the following files:", ``git status`` or ``git diff --stat``);
* ``event_msg`` ``task_complete`` -> a proposed ``stop`` (id ``<turn_id>.stop``): where
  the ``Stop`` hook fires live.

Tokens: the growth of ``token_count``'s ``total_token_usage`` between reports:
uncached input (``input_tokens - cached_input_tokens``) plus ``output_tokens``
(reasoning included); cached input goes to ``cache_read_tokens``. Records without a
JSON body, and unknown record types, are skipped and counted in ``metrics``.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson

from stopserve.errors import ImporterError
from stopserve.ids import content_ref, content_refs
from stopserve.importers._common import OnError, fail, report
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

__all__ = ["CodexMapper", "read", "result_payload", "tool_call"]

SHELL_TOOLS: Final = frozenset(
    {"shell", "exec_command", "local_shell", "local_shell_call", "container.exec", "shell_command", "Bash"}
)
_SPAWN_TOOLS: Final = frozenset({"spawn_agent"})
_SKIP_ITEMS: Final = frozenset({"reasoning", "web_search_call", "image_generation_call", "compaction"})
_SKIP_RECORDS: Final = frozenset({"turn_context", "compacted"})
_VOLATILE: Final = re.compile(
    r"^(?:Chunk ID|Wall time|Original token count|Total output lines|Process running with session ID)"
    r"\b.*(?:\n|$)",
    re.MULTILINE,
)
_EXITED: Final = re.compile(r"(?:Process exited with code|Exit code:?)\s*(-?\d+)")
_PATCH_FILE: Final = re.compile(r"^\*\*\* (?:Update|Add|Delete) File: (.+)$", re.MULTILINE)
_EXIT_CODES_KEPT: Final = 64


def _command(args: Any) -> str | None:
    """The command line of a shell call, in whichever shape its arguments take."""
    if isinstance(args, dict):
        for key in ("cmd", "command"):
            value = args.get(key)
            if isinstance(value, str):
                return value
            if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
                # ["bash", "-lc", "the script"]: the script is what was run
                if len(value) == 3 and value[1] in ("-lc", "-c"):
                    return str(value[2])
                return " ".join(value)
    if isinstance(args, str):
        return args
    return None


def tool_call(name: str, args: Any) -> tuple[str, dict[str, Any], str, str, list[str]]:
    """``(tool, hashed payload, label, kind, edited files)`` of a Codex tool call.

    Shell tools are one tool, ``Bash``, identified by their command line, as in the
    ``PostToolUse`` hook's ``tool_name``/``tool_input``.
    """
    if isinstance(args, str):
        with contextlib.suppress(orjson.JSONDecodeError):
            args = orjson.loads(args)
    if name in SHELL_TOOLS:
        command = _command(args) or ""
        edits = _PATCH_FILE.findall(command) if "*** Begin Patch" in command else []
        kind = "test" if is_test_command(command) else ""
        return "Bash", {"name": "Bash", "input": {"command": command}}, command, kind, edits
    if name == "apply_patch":
        text = args if isinstance(args, str) else _command(args) or ""
        edits = _PATCH_FILE.findall(text)
        label = f"apply_patch {edits[0]}" if edits else "apply_patch"
        return name, {"name": name, "input": text}, label, "edit" if edits else "", edits
    return name, {"name": name, "input": args}, name, "", []


def result_payload(output: Any) -> tuple[dict[str, Any], str, int | None]:
    """``(hashed payload, output text, exit code)`` of a tool output, in any of its shapes.

    Timing lines are dropped before hashing: the same command with the same output
    must give the same hash (the loop detector compares them).
    """
    if isinstance(output, str) and output[:1] == "{":
        with contextlib.suppress(orjson.JSONDecodeError):
            output = orjson.loads(output)
    code: int | None = None
    if isinstance(output, dict):
        meta = output.get("metadata")
        raw_code = meta.get("exit_code") if isinstance(meta, dict) else output.get("exit_code")
        code = raw_code if isinstance(raw_code, int) and not isinstance(raw_code, bool) else None
        if output.get("success") is False and code is None:
            code = 1
        text = next(
            (output[k] for k in ("output", "stdout", "content") if isinstance(output.get(k), str)), ""
        )
        if isinstance(output.get("stderr"), str) and output["stderr"]:
            text = f"{text}\n{output['stderr']}"
    elif isinstance(output, str):
        text = output
    else:
        text = "" if output is None else str(output)
    match = _EXITED.search(text)
    if match and code is None:
        code = int(match.group(1))
    body = text.split("\nOutput:\n", 1)[1] if "\nOutput:\n" in text else text
    return {"output": _VOLATILE.sub("", body), "exit_code": code}, text, code


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else 0


class CodexMapper(TranscriptMapper):
    """Codex rollout records -> events (see the module docstring)."""

    def __init__(self, agent: str | None = None, *, skip_until: str | None = None) -> None:
        super().__init__(agent)
        self.thread_id: str | None = None
        self.parent_id: str | None = None
        self.spawn_call: str | None = None
        self._skip_until = skip_until  # a sub-agent rollout repeats its parent's history up to this call
        self._totals = [0, 0]  # tokens, cached input already counted
        self._exit_codes: OrderedDict[str, int] = OrderedDict()
        self._turn: str | None = None
        self._stops = 0
        self._user_ref: str | None = None  # the last prompt, so its second record is not a second prompt

    def _map(self, obj: dict[str, Any]) -> None:
        kind = obj.get("type")
        payload = obj.get("payload")
        t = self.clock(parse_time(obj.get("timestamp")))
        if not isinstance(payload, dict):
            self.counts[
                "unknown" if kind not in ("session_meta", "response_item", "event_msg") else "malformed"
            ] += 1
            return
        if kind == "session_meta":
            self._meta(payload)
            self.counts["skipped"] += 1
            return
        if self._skip_until is not None:
            if payload.get("call_id") == self._skip_until and payload.get("type") == "function_call":
                self._skip_until = None
            self.counts["skipped"] += 1
            return
        if kind == "response_item":
            self._item(payload, t)
        elif kind == "event_msg":
            self._event(payload, t)
        elif kind in _SKIP_RECORDS:
            turn = payload.get("turn_id")
            if isinstance(turn, str):
                self._turn = turn
            self.counts["skipped"] += 1
        else:
            self.counts["unknown"] += 1

    def _meta(self, payload: dict[str, Any]) -> None:
        if self.thread_id is not None:
            return
        tid = payload.get("id")
        self.thread_id = tid if isinstance(tid, str) else None
        source = payload.get("source")
        spawn = source.get("subagent") if isinstance(source, dict) else None
        spawn = spawn.get("thread_spawn") if isinstance(spawn, dict) else None
        if isinstance(spawn, dict):
            parent, call = spawn.get("parent_thread_id"), spawn.get("spawn_call_id")
            self.parent_id = parent if isinstance(parent, str) else None
            self.spawn_call = call if isinstance(call, str) else None

    def _line_id(self, k: int = 0) -> str:
        n = self.counts["lines"]
        return f"L{n}" if not k else f"L{n}.{k}"

    def _item(self, item: dict[str, Any], t: float) -> None:
        itype = item.get("type")
        if itype == "message":
            if item.get("role") != "assistant":
                self.counts["skipped"] += 1
                return
            content = item.get("content")
            texts = [
                str(b.get("text"))
                for b in (content if isinstance(content, list) else [])
                if isinstance(b, dict) and isinstance(b.get("text"), str) and b["text"].strip()
            ]
            for k, text in enumerate(texts):
                said = content_refs(text, sketch=self.sketch)
                self.emit(
                    self.event(self._line_id(k), t, "communicate", self.agent, role="assistant", **said)
                )
            return
        if itype in ("function_call", "custom_tool_call", "local_shell_call"):
            call_id = item.get("call_id") or item.get("id")
            name = item.get("name") or ("local_shell" if itype == "local_shell_call" else None)
            if not isinstance(call_id, str) or not isinstance(name, str):
                self.counts["malformed"] += 1
                return
            args = item.get("arguments", item.get("input", item.get("action")))
            self._call(call_id, name, args, t)
            return
        if itype in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                self.counts["malformed"] += 1
                return
            self._result(call_id, item.get("output"), t)
            return
        self.counts["skipped" if itype in _SKIP_ITEMS else "unknown"] += 1

    def _call(self, call_id: str, name: str, args: Any, t: float) -> None:
        if name in _SPAWN_TOOLS:
            parsed = args
            if isinstance(args, str):
                try:
                    parsed = orjson.loads(args)
                except orjson.JSONDecodeError:
                    parsed = {}
            task = parsed.get("task_name") if isinstance(parsed, dict) else None
            sub = task if isinstance(task, str) and task else f"agent-{call_id[-8:]}"
            self.emit(self.event(f"{call_id}.spawn", t, "spawn", sub))
            refs = content_refs({"name": name, "input": parsed}, sketch=self.sketch)
            self.emit(self.event(call_id, t, "delegate", self.agent, to=sub, tool=name, **refs))
            self.facts.tool_calls += 1
            self.remember(call_id, name, sub, "agent", sub)
            return
        tool, payload, label, kind, edits = tool_call(name, args)
        self.call(call_id, t, tool, payload, label=label, kind=kind, edits=edits)

    def _result(self, call_id: str, output: Any, t: float, *, error: bool | None = None) -> None:
        payload, text, code = result_payload(output)
        known = self._exit_codes.pop(call_id, None)
        if code is None and known is not None:
            # a PostToolUse hook's output is the bare text: the exit code comes from the
            # command's end event, and goes into the hash so both copies hash the same
            code = payload["exit_code"] = known
        failed = error if error is not None else code is not None and code != 0
        self.result(call_id, t, payload, error=failed, output=text, exit_code=code)

    def _event(self, msg: dict[str, Any], t: float) -> None:
        etype = msg.get("type")
        if etype == "user_message":
            text = msg.get("message")
            if isinstance(text, str) and text.strip():
                said = content_refs(text, sketch=self.sketch)
                self._user_ref = said["content_ref"]
                self.emit(self.event(self._line_id(), t, "communicate", "user", role="human", **said))
                return
        elif etype == "token_count":
            self._token_count(msg.get("info"))
        elif etype == "exec_command_end":
            self._exit_code(msg.get("call_id"), msg.get("exit_code"))
        elif etype == "item_completed":
            item = msg.get("item")
            if isinstance(item, dict) and self._item_completed(item, t):
                return
        elif etype == "task_started":
            turn = msg.get("turn_id")
            self._turn = turn if isinstance(turn, str) else self._turn
        elif etype == "task_complete":
            turn = msg.get("turn_id")
            last = msg.get("last_agent_message")
            self.propose_stop(
                None, last if isinstance(last, str) else None, turn if isinstance(turn, str) else None
            )
            return
        self.counts["skipped"] += 1

    def _exit_code(self, call_id: Any, code: Any) -> None:
        if isinstance(call_id, str) and isinstance(code, int) and not isinstance(code, bool):
            self._exit_codes[call_id] = code
            if len(self._exit_codes) > _EXIT_CODES_KEPT:
                self._exit_codes.popitem(last=False)

    def _item_completed(self, item: dict[str, Any], t: float) -> bool:
        """Codex 0.169's ``item_completed`` events: a command's exit code, the user's prompt.

        The ``CommandExecution`` item is written before the ``PostToolUse`` hook runs
        (the ``function_call_output`` line only after it), so the hook learns the exit
        code here. The prompt (``UserMessage``) is a ``communicate`` by the user, as an
        older rollout's ``user_message`` event (a copy right after one is skipped).
        Whether an event was emitted.
        """
        kind = item.get("type")
        if kind == "CommandExecution":
            self._exit_code(item.get("id"), item.get("exit_code"))
            return False
        if kind != "UserMessage":
            return False
        content = item.get("content")
        text = "\n".join(
            str(b.get("text"))
            for b in (content if isinstance(content, list) else [])
            if isinstance(b, dict) and isinstance(b.get("text"), str)
        )
        if not text.strip():
            return False
        said = content_refs(text, sketch=self.sketch)
        if said["content_ref"] == self._user_ref:
            return False
        self._user_ref = said["content_ref"]
        self.emit(self.event(self._line_id(), t, "communicate", "user", role="human", **said))
        return True

    def _token_count(self, info: Any) -> None:
        total = info.get("total_token_usage") if isinstance(info, dict) else None
        if not isinstance(total, dict):
            return
        cached = _int(total.get("cached_input_tokens"))
        now = [max(0, _int(total.get("input_tokens")) - cached) + _int(total.get("output_tokens")), cached]
        delta = [a - b for a, b in zip(now, self._totals, strict=True)]
        self._totals = now
        if min(delta) >= 0:
            self.usage(delta[0], delta[1])  # a total that shrank (a new context) adds nothing

    # ------------------------------------------------------------------ hooks

    def propose_stop(
        self, ts: float | None, last_message: str | None = None, turn_id: str | None = None
    ) -> None:
        """The turn ends (a ``Stop``/``SubagentStop`` hook, or ``task_complete``): a proposed stop."""
        self._user_ref = None  # the next turn's prompt may repeat this one's
        turn = turn_id or self._turn
        if turn is None:
            self._stops += 1
        eid = f"{turn}.stop" if turn else f"stop-{self._stops}"
        ref = content_ref(last_message) if isinstance(last_message, str) and last_message.strip() else None
        stop = self.event(
            eid, self.clock(ts), "stop", self.agent, reason="information_complete", proposed=True
        )
        if ref is not None:
            stop["content_ref"] = ref
        self.emit(stop)

    def tool_event(
        self, call_id: str, name: str, tool_input: Any, tool_response: Any, ts: float | None, *, error: bool
    ) -> None:
        """A tool call seen in a ``PreToolUse``/``PostToolUse`` hook's input (``tool_response``
        ``None``: not run yet); ids as in the rollout, so it counts once."""
        t = self.clock(ts)
        if not self.seen(call_id) and not self.pending_tool(call_id):
            self._call(call_id, name, tool_input, t)
        if tool_response is not None and not self.seen(f"{call_id}.out"):
            self._result(call_id, tool_response, t, error=True if error else None)

    # ------------------------------------------------------------------ state

    def _dump_extra(self) -> dict[str, Any]:
        return {
            "totals": self._totals,
            "exit_codes": list(self._exit_codes.items()),
            "turn": self._turn,
            "stops": self._stops,
            "skip_until": self._skip_until,
            "thread": [self.thread_id, self.parent_id, self.spawn_call],
            "user_ref": self._user_ref,
        }

    def _load_extra(self, data: Mapping[str, Any]) -> None:
        totals = data.get("totals")
        if isinstance(totals, list) and len(totals) == 2 and all(isinstance(x, int) for x in totals):
            self._totals = totals
        for row in data.get("exit_codes") or []:
            if (
                isinstance(row, list)
                and len(row) == 2
                and isinstance(row[0], str)
                and isinstance(row[1], int)
            ):
                self._exit_codes[row[0]] = row[1]
        turn, stops, skip = data.get("turn"), data.get("stops"), data.get("skip_until")
        self._turn = turn if isinstance(turn, str) else None
        self._stops = stops if isinstance(stops, int) else 0
        self._skip_until = skip if isinstance(skip, str) else None
        user_ref = data.get("user_ref")
        self._user_ref = user_ref if isinstance(user_ref, str) else None
        thread = data.get("thread")
        if isinstance(thread, list) and len(thread) == 3:
            self.thread_id, self.parent_id, self.spawn_call = (
                x if isinstance(x, str) else None for x in thread
            )


# --------------------------------------------------------------------------- files


def _meta_of(path: Path) -> dict[str, Any]:
    """The ``session_meta`` payload of a rollout (its first lines), or ``{}``."""
    with path.open("rb") as fh:
        for _ in range(8):
            line = fh.readline(4 * 1024 * 1024)
            if not line:
                break
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if (
                isinstance(obj, dict)
                and obj.get("type") == "session_meta"
                and isinstance(obj.get("payload"), dict)
            ):
                payload: dict[str, Any] = obj["payload"]
                return payload
    return {}


def _rollouts(sources: Sequence[str | os.PathLike[str]] | str | os.PathLike[str]) -> list[Path]:
    if isinstance(sources, str | os.PathLike):
        sources = [sources]
    out: list[Path] = []
    for source in sources:
        path = Path(source)
        if path.is_file():
            out.append(path)
        elif path.is_dir():
            found = sorted(p for p in path.rglob("*.jsonl") if p.is_file())
            if not found:
                raise fail("no .jsonl rollout files in this folder", file=path)
            out.extend(found)
        else:
            raise fail("no such file or folder", file=path)
    return out


def read(
    sources: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    labels: str | os.PathLike[str] | None = None,
    *,
    on_error: OnError = None,
) -> Iterator[Trace]:
    """Yield one :class:`Trace` per thread (files, or folders searched recursively);
    a sub-agent's rollout is merged into its parent's trace when both are given.

    >>> traces = read("~/.codex/sessions/2026/05")  # doctest: +SKIP
    """
    rewards = read_labels(labels) if labels is not None else {}
    files = _rollouts(sources)
    metas: dict[Path, dict[str, Any]] = {}
    for path in files:
        try:
            metas[path] = _meta_of(path)
        except OSError as exc:
            report(fail(f"cannot read: {exc.strerror or exc}", file=path), on_error)
    ids = {str(m.get("id")): p for p, m in metas.items() if isinstance(m.get("id"), str)}
    children: dict[Path, list[Path]] = {}
    roots: list[Path] = []
    for path, meta in metas.items():
        spawn = ((meta.get("source") or {}) if isinstance(meta.get("source"), dict) else {}).get("subagent")
        spawn = spawn.get("thread_spawn") if isinstance(spawn, dict) else None
        parent = spawn.get("parent_thread_id") if isinstance(spawn, dict) else None
        if isinstance(parent, str) and parent in ids:
            children.setdefault(ids[parent], []).append(path)
        else:
            roots.append(path)
    for path in roots:
        try:
            main = CodexMapper()
            parts: list[tuple[TranscriptMapper, list[dict[str, Any]]]] = [(main, map_file(path, main))]
            for child in children.get(path, []):
                meta = metas[child]
                spawn_call = (
                    ((meta.get("source") or {}).get("subagent") or {}).get("thread_spawn") or {}
                ).get("spawn_call_id")
                skip = (
                    spawn_call
                    if isinstance(spawn_call, str) and spawn_call.encode() in child.read_bytes()
                    else None
                )
                sub = CodexMapper(agent=str(meta.get("id") or child.stem), skip_until=skip)
                parts.append((sub, map_file(child, sub)))
            thread = main.thread_id or path.stem
            yield build_trace(thread, "codex", parts, file=path, reward=rewards.get(thread))
        except OSError as exc:
            report(fail(f"cannot read: {exc.strerror or exc}", file=path), on_error)
        except ImporterError as err:
            report(err, on_error)
