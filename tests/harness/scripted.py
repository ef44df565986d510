"""A scripted model API on a free loopback port: what the real harness binaries talk to in tests.

One server speaks both wire formats the harnesses use:

* ``POST /v1/messages`` -- Anthropic Messages, streamed as SSE (Claude Code, via
  ``ANTHROPIC_BASE_URL``); a non-streamed request gets one JSON message;
* ``POST /v1/responses`` -- OpenAI Responses, streamed as SSE (Codex CLI, via a
  ``model_providers`` entry with ``wire_api = "responses"``).

Each request is reduced to a :class:`View` (the tool results so far, the last user
text, whether tools were offered) and handed to the script, a function that returns
the next :class:`Step`: call a tool, or say something and end the turn. Requests the
harness makes on its own (titles, summaries: no tools offered) get a short text.

Every request and the step answered is kept in ``server.log`` for the test to read.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = ["ModelServer", "Say", "Step", "Tool", "View"]


@dataclass(frozen=True)
class Tool:
    """Call one tool (``name`` as the harness names it: ``Bash``, ``exec_command``, ...).

    Codex's ``apply_patch`` is a freeform tool: its ``input`` is ``{"patch": "*** Begin Patch ..."}``.
    """

    name: str
    input: dict[str, Any]


@dataclass(frozen=True)
class Say:
    """Say ``text`` and end the turn (no tool call)."""

    text: str


Step = Tool | Say


@dataclass
class View:
    """What the script sees of one model request."""

    api: str  # "anthropic" or "responses"
    tools_offered: list[str]
    results: list[str] = field(default_factory=list)  # tool result texts, in order
    user_texts: list[str] = field(default_factory=list)  # user (and harness) messages, in order
    system: str = ""
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def last_result(self) -> str:
        """The newest tool result's text ('' before any)."""
        return self.results[-1] if self.results else ""

    @property
    def last_user(self) -> str:
        """The newest user message's text."""
        return self.user_texts[-1] if self.user_texts else ""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict):
                if isinstance(block.get("text"), str):
                    parts.append(block["text"])
                elif "content" in block:
                    parts.append(_text(block["content"]))
        return "\n".join(parts)
    return ""


def anthropic_view(body: dict[str, Any]) -> View:
    """The view of an Anthropic Messages request."""
    tools = [t.get("name", "") for t in body.get("tools") or [] if isinstance(t, dict)]
    view = View("anthropic", tools, system=_text(body.get("system")), body=body)
    for message in body.get("messages") or []:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        texts = []
        for block in blocks:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_result":
                view.results.append(_text(block.get("content")))
            elif block.get("type") == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
        if texts:
            view.user_texts.append("\n".join(texts))
    return view


def responses_view(body: dict[str, Any]) -> View:
    """The view of an OpenAI Responses request."""
    tools = [t.get("name") or t.get("type", "") for t in body.get("tools") or [] if isinstance(t, dict)]
    view = View("responses", tools, system=str(body.get("instructions") or ""), body=body)
    for item in body.get("input") or []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind in ("function_call_output", "custom_tool_call_output"):
            out = item.get("output")
            view.results.append(out if isinstance(out, str) else json.dumps(out))
        elif kind == "message" and item.get("role") == "user":
            view.user_texts.append(_text(item.get("content")))
    return view


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def do_HEAD(self) -> None:
        self._empty(200)

    def do_GET(self) -> None:
        if self.path.startswith("/v1/models"):
            self._json(200, {"data": [], "models": []})
            return
        self._empty(404)

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            body = {}
        path = self.path.split("?", 1)[0]
        if path.endswith("/messages/count_tokens"):
            self._json(200, {"input_tokens": 100})
            return
        if path.endswith("/messages"):
            self._anthropic(body)
            return
        if path.endswith("/responses"):
            self._responses(body)
            return
        self._empty(404)

    # -- plumbing

    def _empty(self, status: int) -> None:
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def _json(self, status: int, data: dict[str, Any]) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _stream(self, chunks: list[bytes]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(chunk)
        self.wfile.flush()
        self.close_connection = True

    def _step(self, view: View) -> Step:
        srv = self.server
        with srv.lock:
            if not view.tools_offered:
                step: Step = Say("OK.")
                main = False
            else:
                step = srv.script(view)
                main = True
            srv.log.append({"api": view.api, "main": main, "view": view, "step": step})
        return step

    # -- Anthropic Messages

    def _anthropic(self, body: dict[str, Any]) -> None:
        step = self._step(anthropic_view(body))
        n = next(self.server.ids)
        model = str(body.get("model") or "claude-scripted")
        if isinstance(step, Tool):
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": f"toolu_{n:06d}",
                "name": step.name,
                "input": {},
            }
            stop_reason = "tool_use"
        else:
            block = {"type": "text", "text": ""}
            stop_reason = "end_turn"
        usage = {"input_tokens": 120, "output_tokens": 12, "cache_read_input_tokens": 0}
        if not body.get("stream"):
            full = (
                dict(block, input=step.input)
                if isinstance(step, Tool)
                else {"type": "text", "text": step.text}
            )
            self._json(
                200,
                {
                    "id": f"msg_{n:06d}",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [full],
                    "stop_reason": stop_reason,
                    "stop_sequence": None,
                    "usage": usage,
                },
            )
            return
        start = {
            "type": "message_start",
            "message": {
                "id": f"msg_{n:06d}",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": dict(usage, output_tokens=1),
            },
        }
        if isinstance(step, Tool):
            delta = {"type": "input_json_delta", "partial_json": json.dumps(step.input)}
        else:
            delta = {"type": "text_delta", "text": step.text}
        self._stream(
            [
                _sse("message_start", start),
                _sse(
                    "content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}
                ),
                _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
                _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
                _sse(
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                        "usage": {"output_tokens": 12},
                    },
                ),
                _sse("message_stop", {"type": "message_stop"}),
            ]
        )

    # -- OpenAI Responses

    def _responses(self, body: dict[str, Any]) -> None:
        step = self._step(responses_view(body))
        n = next(self.server.ids)
        rid = f"resp_{n:06d}"
        if isinstance(step, Tool) and step.name == "apply_patch":  # Codex's freeform tool
            item: dict[str, Any] = {
                "type": "custom_tool_call",
                "id": f"ctc_{n:06d}",
                "call_id": f"call_{n:06d}",
                "name": step.name,
                "input": step.input["patch"],
                "status": "completed",
            }
        elif isinstance(step, Tool):
            item = {
                "type": "function_call",
                "id": f"fc_{n:06d}",
                "call_id": f"call_{n:06d}",
                "name": step.name,
                "arguments": json.dumps(step.input),
                "status": "completed",
            }
        else:
            item = {
                "type": "message",
                "id": f"msg_{n:06d}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": step.text, "annotations": []}],
            }
        usage = {
            "input_tokens": 120,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 12,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 132,
        }
        response = {"id": rid, "object": "response", "status": "in_progress", "output": []}
        self._stream(
            [
                _sse("response.created", {"type": "response.created", "response": response}),
                _sse(
                    "response.output_item.added",
                    {"type": "response.output_item.added", "output_index": 0, "item": item},
                ),
                _sse(
                    "response.output_item.done",
                    {"type": "response.output_item.done", "output_index": 0, "item": item},
                ),
                _sse(
                    "response.completed",
                    {
                        "type": "response.completed",
                        "response": dict(response, status="completed", output=[item], usage=usage),
                    },
                ),
            ]
        )


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, script: Callable[[View], Step]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = script
        self.lock = threading.Lock()
        self.log: list[dict[str, Any]] = []
        self.ids = itertools.count(1)


class ModelServer:
    """The scripted model API in a background thread; ``url`` once entered."""

    def __init__(self, script: Callable[[View], Step]) -> None:
        self._server = _Server(script)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def log(self) -> list[dict[str, Any]]:
        """Each model request answered: ``{"api", "main", "view", "step"}``."""
        return self._server.log

    @property
    def steps(self) -> list[Step]:
        """The steps answered to the harness's main loop (requests that offered tools)."""
        return [r["step"] for r in self._server.log if r["main"]]

    def __enter__(self) -> ModelServer:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
