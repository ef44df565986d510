"""``stopserve hook claude-code|codex``: one hook call, start to answer, bounded in time.

What a call does, in order:

1. parse the hook input from stdin (:func:`~stopserve.hooks.protocol.parse_input`);
2. lock the run's state, read the transcript lines added since the last call (the
   byte offset is in the state), map them to events with the same mapper the
   importer uses, add what the hook input itself says (a tool call and its result,
   the proposed stop) and any events an earlier call could not deliver;
3. ``POST /v1/runs/{run_id}/decide`` with ``proposed_stop`` on ``Stop``/``SubagentStop``
   (the service's own ``POST /v1/hooks/claude-code`` runs this same code and decides
   in process: :mod:`stopserve.hooks.serve`);
4. answer: block a stop the service wants to go on past (at most ``--max-blocks``
   times in a row within a turn, counting again from 0 when ``stop_hook_active`` is
   false), end the run from a tool hook when a safety net fired, the way the harness
   honours it (:func:`~stopserve.hooks.protocol.end_output`), and refuse every further
   tool call of that turn; in ``--mode shadow`` only log what would have been done;
5. save the state atomically, log one line (also when the call failed or ran out of
   time: the record then says how far it got).

It fails open: on a timeout (``--timeout``, 0.8 s by default, measured from the
start of this code; a hard ``SIGALRM`` deadline backs up the socket timeouts), an
unreachable or failing service, a bad input, or any error, it prints nothing and
exits 0 -- the agent may stop -- and says why in ``hook.log`` and on stderr (which
Claude Code shows the user in verbose mode only, never the model).

Only the standard library, orjson and the light mapper modules are imported: no
pydantic, numpy, httpx or FastAPI (``bench/bench_hook.py`` measures the cost).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote, urlsplit

import orjson

from stopserve.errors import HookInputError
from stopserve.hooks import DEFAULT_MAX_BLOCKS
from stopserve.hooks.protocol import (
    MAX_INPUT_BYTES,
    Harness,
    HookInput,
    block_output,
    end_output,
    nudge_output,
    parse_input,
)
from stopserve.hooks.state import StateDir
from stopserve.importers._transcript import TranscriptMapper, read_lines

__all__ = ["Decide", "HookOptions", "ServiceError", "classify_error", "hook_main", "post_json", "run_hook"]

#: What a session's calls ask of the service's config: no turn limit or time budget (a session is
#: no run with an end of its own); ``--safety`` keys go on top.
SESSION_SAFETY: Final[dict[str, Any]] = {"max_turns": None, "max_seconds": None}
#: events kept for the service while it cannot be reached (the newest win)
MAX_PENDING: Final = 2000
#: transcript bytes read per call (the rest waits for the next call)
READ_BYTES: Final = 8 * 1024 * 1024


_DECISION_KEYS: Final = (
    "action",
    "reason",
    "v_stop",
    "q_continue",
    "q_stop",
    "turn",
    "safety_net",
    "pattern",
    "limit",
    "degraded",
    "proposal",
    "message",
    "nudge",
)


class _DeadlineError(Exception):
    """The call's time is up."""


@dataclass(frozen=True)
class HookOptions:
    """How the hook decides and answers (the command's options, or the HTTP hook's query)."""

    harness: Harness
    mode: str = "enforce"
    max_blocks: int = DEFAULT_MAX_BLOCKS
    lam: float | None = None
    safety: Mapping[str, Any] | None = None
    end_on_model_stop: bool = False
    #: events carry sketches of their text beside its hash (``--no-sketch``: hashes only)
    sketch: bool = True


#: ``(run_id, decide body, seconds left) -> decision`` (raises :class:`ServiceError`)
Decide = Callable[[str, Mapping[str, Any], float], dict[str, Any]]


class ServiceError(Exception):
    """The service did not give a decision; ``final`` when resending would not help.

    ``closed`` says why the service will never take this run again (None: it may).
    """

    def __init__(self, message: str, *, final: bool = False, closed: str | None = None) -> None:
        super().__init__(message)
        self.final = final
        self.closed = closed


@contextlib.contextmanager
def _hard_deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`_DeadlineError` in this thread after ``seconds`` (POSIX main thread only)."""
    if not hasattr(signal, "setitimer"):  # pragma: no cover - Windows: socket timeouts only
        yield
        return

    def ring(signum: int, frame: Any) -> None:
        raise _DeadlineError(f"no answer within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


#: the most of an answer the hook reads
MAX_ANSWER_BYTES: Final = 4 * 1024 * 1024


class HTTPError(OSError):
    """The service's answer was not HTTP the hook can read."""


def post_json(url: str, path: str, body: Mapping[str, Any], timeout: float) -> tuple[int, Any]:
    """POST ``body`` as JSON to ``url`` + ``path``: ``(status, parsed JSON or None)``.

    Raises ``OSError`` (refused, reset, timed out, an answer that is not HTTP). Plain
    ``http://`` is spoken over a socket here: ``http.client`` costs the hook process
    18 ms of imports (``email``, ``ssl``) on every call (bench/bench_hook.py);
    ``https://`` goes through ``http.client``.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url must be http(s)://host[:port], got {url!r}")
    data = orjson.dumps(body)
    target = parts.path.rstrip("/") + path
    if parts.scheme == "https":
        return _post_https(parts.hostname, parts.port, target, data, timeout)
    host = parts.hostname
    head = (
        f"POST {target} HTTP/1.1\r\nHost: {parts.netloc}\r\ncontent-type: application/json\r\n"
        f"accept: application/json\r\ncontent-length: {len(data)}\r\nconnection: close\r\n\r\n"
    )
    with socket.create_connection((host, parts.port or 80), timeout=max(timeout, 0.001)) as sock:
        sock.sendall(head.encode("latin-1") + data)
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_ANSWER_BYTES:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    status, raw = _parse_answer(b"".join(chunks))
    try:
        return status, orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return status, None


def _parse_answer(raw: bytes) -> tuple[int, bytes]:
    """``(status, body)`` of a whole HTTP/1.1 answer (the server closed the connection)."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status_line = lines[0].split(b" ", 2)
    if (
        not sep
        or len(status_line) < 2
        or not status_line[0].startswith(b"HTTP/")
        or not status_line[1].isdigit()
    ):
        raise HTTPError(f"not an HTTP answer: {raw[:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        out, rest = [], body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            n = int(size_line.split(b";")[0] or b"0", 16)
            if n == 0:
                break
            out.append(rest[:n])
            rest = rest[n + 2 :]
        body = b"".join(out)
    elif b"content-length" in headers:
        body = body[: int(headers[b"content-length"])]
    return int(status_line[1]), body


def _post_https(host: str, port: int | None, target: str, data: bytes, timeout: float) -> tuple[int, Any]:
    import http.client

    conn = http.client.HTTPSConnection(host, port, timeout=max(timeout, 0.001))
    try:
        conn.request(
            "POST",
            target,
            body=data,
            headers={"content-type": "application/json", "accept": "application/json"},
        )
        response = conn.getresponse()
        raw = response.read(MAX_ANSWER_BYTES)
    except http.client.HTTPException as exc:
        raise HTTPError(f"not an HTTP answer: {exc}") from None
    finally:
        conn.close()
    try:
        return response.status, orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return response.status, None


def classify_error(status: int, data: Any) -> ServiceError:
    """The :class:`ServiceError` for an error answer (``status`` and its JSON error body)."""
    error = data.get("error") if isinstance(data, dict) else None
    detail = error.get("message") if isinstance(error, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    message = f"service answered HTTP {status}" + (f": {detail}" if detail else "")
    if status == 409:
        # by the error's type (stopserve.error_table; not imported: the hook stays light)
        why = "the service dropped it (run_evicted)" if kind == "run_evicted" else "its outcome was posted"
        message += f" (the run: {why}; not asking again)"
        return ServiceError(message, final=True, closed=why)
    # 4xx: these events will never be taken as they are; 5xx/429: resend them next time
    return ServiceError(message, final=400 <= status < 500 and status != 429)


def http_decide(url: str) -> Decide:
    """Decide through the service's ``POST /v1/runs/{run_id}/decide`` at ``url``."""

    def decide(run_id: str, body: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        try:
            status, data = post_json(url, f"/v1/runs/{quote(run_id, safe='')}/decide", body, timeout)
        except TimeoutError:
            raise ServiceError(f"service at {url} did not answer within {timeout:.2f} s") from None
        except OSError as exc:
            raise ServiceError(f"service at {url} unreachable: {exc}") from None
        if status == 200 and isinstance(data, dict) and data.get("action") in ("continue", "stop"):
            return data
        raise classify_error(status, data)

    return decide


def _mapper_class(harness: str) -> type[TranscriptMapper]:
    if harness == "codex":
        from stopserve.importers.codex import CodexMapper

        return CodexMapper
    from stopserve.importers.claude_code import ClaudeCodeMapper

    return ClaudeCodeMapper


def _read_transcript(path: str, st: dict[str, Any], mapper: TranscriptMapper) -> list[dict[str, Any]]:
    """Events of the lines added to ``path`` since the offset in ``st`` (which moves on)."""
    offset = st.get("offset", 0)
    if not isinstance(offset, int) or offset < 0:
        offset = 0
    try:
        size = os.path.getsize(path)
    except OSError:
        return []  # not written yet: the next call reads it
    if size < offset:
        st["log"].append(f"transcript shrank below the last offset ({size} < {offset}); reading it anew")
        offset = 0
    lines, st["offset"], too_long = read_lines(path, offset, READ_BYTES)
    return mapper.feed_lines(lines, too_long)


def run_hook(
    raw: bytes,
    opts: HookOptions,
    state: StateDir,
    deadline: float,
    *,
    decide: Decide,
    record: dict[str, Any],
) -> dict[str, Any] | None:
    """One call: the answer to give (``None``: nothing); ``record`` is filled as it goes.

    A transcript this process cannot read (the service in a container, say): it decides
    from the hook input alone (what that loses: docs/hooks.md).
    """
    inp = parse_input(raw, opts.harness)
    record.update(
        event=inp.event, session_id=inp.session_id, run_id=inp.run_id, mode=opts.mode, turn_key=inp.turn
    )
    if inp.tool_name:
        record["tool"] = inp.tool_name
    if inp.kind == "other":
        record["outcome"] = "ignored"
        return None
    with state.lock(inp.run_id, deadline):
        st = state.load(inp.run_id)
        if st is None:
            state.sweep()
            st = {"v": 1, "session_id": inp.session_id, "created": time.time(), "blocks": 0, "pending": []}
        st["log"] = []
        cls = _mapper_class(opts.harness)
        transcript = inp.transcript
        mapper = cls.load(st["mapper"]) if isinstance(st.get("mapper"), dict) else cls(agent=inp.agent)
        mapper.sketch = opts.sketch
        if transcript and st.get("transcript") not in (None, transcript):
            st["log"].append(f"transcript changed from {st['transcript']}; reading {transcript} anew")
            st["offset"] = 0
        events: list[dict[str, Any]] = []
        if transcript and os.access(transcript, os.R_OK):
            events = _read_transcript(transcript, st, mapper)
        elif transcript and not (
            os.path.isdir(os.path.dirname(transcript)) and not os.path.exists(transcript)
        ):
            # not merely "not written yet" (its folder is there): this process cannot read it
            record["transcript"] = "unread"
            if not st.get("unread_noted"):
                st["log"].append(
                    f"transcript {transcript}: cannot read it here; deciding from the hook input alone"
                )
                st["unread_noted"] = True
        st["transcript"] = transcript
        now = time.time()
        if inp.kind == "tool" and inp.tool_use_id and inp.tool_name:
            mapper.tool_event(
                inp.tool_use_id,
                inp.tool_name,
                inp.tool_input,
                inp.tool_response,
                now,
                error=inp.event == "PostToolUseFailure",
            )
        elif inp.kind == "stop":
            mapper.propose_stop(now, inp.last_assistant_message, inp.turn_id)
        events.extend(mapper.drain())
        pending = [e for e in st.get("pending", []) if isinstance(e, dict)] + events
        if len(pending) > MAX_PENDING:
            st["log"].append(f"dropped {len(pending) - MAX_PENDING} undelivered events (service away)")
            pending = pending[-MAX_PENDING:]
        if not inp.stop_hook_active and inp.kind == "stop":
            st["blocks"] = 0  # a fresh turn: the consecutive-block count starts again
        record.update(events=len(events), lines=dict(mapper.counts))
        answer: dict[str, Any] | None = None
        decision: dict[str, Any] | None = None
        if closed := st.get("closed"):
            why = closed if isinstance(closed, str) else "its outcome was posted"  # older state: True
            record["error"] = f"run closed on the service ({why}); not asked"
        else:
            body: dict[str, Any] = {"events": pending, "proposed_stop": inp.kind == "stop"}
            if not st.get("started"):
                body.update(task_id=inp.session_id, system=opts.harness, topology="harness")
            if opts.lam is not None:
                body["lambda"] = opts.lam
            # a session is open-ended (resumed tomorrow, hundreds of tool calls in a day's work): no
            # turn limit or time budget unless asked for; the loop detector and the rest stay as served
            body["safety"] = {**SESSION_SAFETY, **(opts.safety or {})}
            try:
                decision = decide(inp.run_id, body, deadline - time.monotonic())
                pending = []
                st["started"] = True
            except ServiceError as exc:
                record["error"] = str(exc)
                if exc.final:
                    st["log"].append(f"dropped {len(pending)} events the service refused: {exc}")
                    pending = []
                if exc.closed:
                    st["closed"] = exc.closed
        st["pending"] = pending
        answer = _answer(inp, decision, mapper, st=st, opts=opts, record=record)
        st["mapper"] = mapper.dump()
        st["updated"] = time.time()
        notes = st.pop("log")
        state.save(inp.run_id, st)
    for note in notes:
        state.log(f"{opts.harness} {inp.event} run={inp.run_id}: {note}")
    return answer


def _answer(
    inp: HookInput,
    decision: dict[str, Any] | None,
    mapper: TranscriptMapper,
    *,
    st: dict[str, Any],
    opts: HookOptions,
    record: dict[str, Any],
) -> dict[str, Any] | None:
    """What to give for this decision (``None``: nothing), and the record of it.

    A run ended in this turn stays ended: every further tool call of the turn is
    refused (Codex reads ``continue: false`` from no tool hook; Claude Code not from
    ``PostToolUseFailure``), and its ``Stop`` is let through.
    """
    from stopserve.hooks.reason import block_reason, end_text, fired

    if decision is not None:
        record.update({k: decision.get(k) for k in _DECISION_KEYS})
    shadow = opts.mode == "shadow"
    ended = st.get("ended")
    ended_here = isinstance(ended, dict) and (ended.get("turn") == inp.turn or inp.turn is None)
    if inp.kind == "stop":
        if ended_here:
            st.pop("ended", None)
            st["blocks"] = 0
            record["outcome"] = "allow (run ended this turn)"
            return None
        if not inp.stop_hook_active:
            st.pop("ended", None)
        if decision is None:
            return None
        if decision["action"] == "stop" or decision.get("proposal") == "refused":
            # refused: the policy takes no proposed stop as a reason to stop, and has none to go on
            # (no model keeps the run going, no min_turns): the agent's own stop stands
            st["blocks"] = 0
            record["outcome"] = "allow"
            return None
        blocks = int(st.get("blocks") or 0)
        if blocks >= opts.max_blocks:
            record["outcome"] = "allow (block cap reached)"
            record["would_block"] = True
            return None
        reason = block_reason(
            decision, mapper.facts, blocks_left=opts.max_blocks - blocks - 1, safety=opts.safety
        )
        record.update(would_block=True, reason_text=reason)
        if shadow:
            record["outcome"] = "would block"
            return None
        st["blocks"] = blocks + 1
        record["outcome"] = "block"
        return block_output(reason)
    if ended_here and not shadow:
        assert isinstance(ended, dict)
        what = str(ended.get("what") or "the run was stopped")
        reason = end_text(what, harness=inp.harness, event=inp.event, loop=bool(ended.get("loop")))
        record.update(would_end=True, reason_text=reason, outcome="refuse (run ended this turn)")
        ended["refused"] = int(ended.get("refused") or 0) + 1
        return end_output(inp, reason)
    if decision is None:
        return None
    if decision["action"] != "stop" or not (decision.get("safety_net") or opts.end_on_model_stop):
        nudge = decision.get("nudge") if decision["action"] == "continue" else None
        told = nudge_output(inp, nudge) if isinstance(nudge, str) and nudge else None
        if told is None:
            record["outcome"] = "continue"
            return None
        record.update(reason_text=nudge, outcome="would nudge" if shadow else "nudge")
        return None if shadow else told
    what = fired(decision, mapper.facts)
    loop = decision.get("reason") == "loop_detected"
    reason = end_text(what, harness=inp.harness, event=inp.event, loop=loop)
    record.update(would_end=True, reason_text=reason)
    if shadow:
        record["outcome"] = "would end"
        return None
    st["ended"] = {"turn": inp.turn, "what": what, "loop": loop, "at": inp.event}
    record["outcome"] = "end"
    return end_output(inp, reason)


def hook_main(opts: HookOptions, *, url: str, timeout: float, state_dir: str | Path | None = None) -> int:
    """One call of the hook (``stopserve hook claude-code|codex``): the hook input JSON on stdin,
    the answer on stdout; always 0 (fails open) but 1 when stdin is a terminal."""
    start = time.monotonic()
    deadline = start + timeout
    state = StateDir(state_dir)
    answer: dict[str, Any] | None = None
    record: dict[str, Any] = {"ts": time.time(), "harness": opts.harness, "mode": opts.mode}
    if sys.stdin is None or sys.stdin.isatty():
        print(
            f"stopserve hook {opts.harness}: reads the hook input JSON on stdin; "
            f"install it with `stopserve hook install {opts.harness}` (docs/hooks.md)",
            file=sys.stderr,
        )
        return 1
    try:
        with _hard_deadline(timeout):
            raw = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
            answer = run_hook(raw, opts, state, deadline, decide=http_decide(url), record=record)
    except _DeadlineError as exc:
        answer, record["error"] = None, f"timeout: {exc}"
    except HookInputError as exc:
        answer, record["error"] = None, f"bad hook input: {exc}"
    except TimeoutError as exc:
        answer, record["error"] = None, f"timeout: {exc}"
    except Exception as exc:  # fail open: nothing may keep the agent from stopping
        answer, record["error"] = None, f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):
            import traceback  # only on this path: the hook's imports are its cost

            state.log("traceback: " + traceback.format_exc().replace("\n", "\n  "))
    finish(state, record, start)
    if "error" in record:
        with contextlib.suppress(Exception):
            print(f"stopserve hook: {record['error']}; the agent may stop", file=sys.stderr)
    if answer is not None:
        sys.stdout.write(orjson.dumps(answer).decode() + "\n")
        sys.stdout.flush()
    return 0


def finish(state: StateDir, record: dict[str, Any], start: float) -> None:
    """Time the call and log it (never raises: logging must not fail a call)."""
    record["ms"] = round((time.monotonic() - start) * 1000, 1)
    if "error" in record and "outcome" not in record:
        record["outcome"] = "failed open"
    with contextlib.suppress(Exception):
        _log(state, record)


def _log(state: StateDir, record: dict[str, Any]) -> None:
    where = f"run={record.get('run_id', '?')}"
    what = record.get("outcome") or "-"
    extra = f" action={record['action']}" if "action" in record else ""
    if record.get("safety_net"):
        extra += f" net={record['safety_net']}"
    error = f" error: {record['error']}" if "error" in record else ""
    event = record.get("event", "?")
    state.log(f"{record['harness']} {event} {where}{extra} -> {what} ({record['ms']} ms){error}")
    # every call the hook answered or failed on, also one that ran out of time before knowing its run
    if record.get("outcome") != "ignored":
        state.append("decisions.jsonl", record)
