"""Claude Code's HTTP hooks, served by the service itself: ``POST /v1/hooks/claude-code``.

Claude Code 2.1 runs hooks of ``"type": "http"``: it POSTs the same JSON a command
hook reads on stdin and reads the same answer from the response body (an empty body:
nothing to say). :class:`HookEndpoint` runs the command hook's own code
(:func:`stopserve.hooks.run.run_hook`: the same state directory, decisions, reasons
and records) and decides in process, so a tool call costs one loopback request
instead of a Python process.

The hook's options come from the URL's query (``hook install claude-code --http``
writes them): ``mode``, ``max_blocks``, ``timeout``, ``lambda``, ``safety`` (JSON),
``end_on_model_stop``. Fail-open holds on the harness's side: Claude Code goes on
when the request fails, times out (the handler's ``timeout``) or answers non-2xx,
and the endpoint answers ``{}`` whenever the hook core fails open.

Where the service cannot read the transcript (a container without the user's
home), it decides from the hook input alone (docs/hooks.md says what that loses).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.from_thread
import orjson

from stopserve.errors import ConfigError, HookInputError, Issue, StopServeError
from stopserve.hooks import DEFAULT_MAX_BLOCKS, DEFAULT_TIMEOUT
from stopserve.hooks.protocol import Harness
from stopserve.hooks.run import HookOptions, ServiceError, classify_error, finish, run_hook
from stopserve.hooks.state import StateDir

__all__ = ["HookEndpoint", "options_from_query"]

#: the longest a request may ask for (a harness handler's timeout is seconds, not minutes)
MAX_TIMEOUT: Final = 60.0

AsyncDecide = Callable[[str, Mapping[str, Any]], Coroutine[Any, Any, dict[str, Any]]]


def _bad(name: str, message: str) -> ConfigError:
    return ConfigError(f"hook URL: {message}", [Issue(message, path=f"query.{name}")])


def options_from_query(harness: Harness, query: Mapping[str, str]) -> tuple[HookOptions, float]:
    """The hook's options and its time budget (seconds) from the URL's query; a bad one raises
    :class:`ConfigError` naming the parameter."""
    known = {"mode", "max_blocks", "timeout", "lambda", "safety", "end_on_model_stop", "no_sketch"}
    for name in query:
        if name not in known:
            raise _bad(name, f"unknown option {name!r} (known: {', '.join(sorted(known))})")
    mode = query.get("mode", "enforce")
    if mode not in ("enforce", "shadow"):
        raise _bad("mode", f"mode must be enforce or shadow, got {mode!r}")

    def number(name: str, default: float, *, whole: bool = False, positive: bool = False) -> float:
        text = query.get(name)
        if text is None:
            return default
        try:
            value = int(text) if whole else float(text)
        except ValueError:
            raise _bad(name, f"{name} must be a {'whole ' if whole else ''}number, got {text!r}") from None
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise _bad(
                name, f"{name} must be a number {'above' if positive else 'of at least'} 0, got {text!r}"
            )
        return value

    safety: dict[str, Any] | None = None
    if "safety" in query:
        try:
            parsed = orjson.loads(query["safety"])
        except orjson.JSONDecodeError as exc:
            raise _bad("safety", f"safety is not valid JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise _bad("safety", f"safety must be a JSON object, got {type(parsed).__name__}")
        safety = parsed
    opts = HookOptions(
        harness=harness,
        mode=mode,
        max_blocks=int(number("max_blocks", DEFAULT_MAX_BLOCKS, whole=True)),
        lam=number("lambda", -1.0) if "lambda" in query else None,
        safety=safety,
        end_on_model_stop=query.get("end_on_model_stop", "0") not in ("0", "false"),
        sketch=query.get("no_sketch", "0") in ("0", "false"),
    )
    return opts, min(number("timeout", DEFAULT_TIMEOUT, positive=True), MAX_TIMEOUT)


class HookEndpoint:
    """The hook core behind ``POST /v1/hooks/claude-code``, deciding through ``decide``.

    ``decide`` is the engine's decide for a request body given as a dict; the core runs
    in a worker thread (it takes the run's file lock and reads the transcript) and calls
    back into the event loop for the decision.
    """

    def __init__(self, state_dir: str | Path | None, decide: AsyncDecide) -> None:
        self.state = StateDir(state_dir)
        self._decide = decide

    async def handle(
        self, raw: bytes, query: Mapping[str, str], harness: Harness = "claude-code"
    ) -> dict[str, Any]:
        """The answer to give (``{}``: nothing to say); a bad query or hook input raises."""
        opts, timeout = options_from_query(harness, query)
        return await anyio.to_thread.run_sync(self._run, raw, opts, timeout)

    def _run(self, raw: bytes, opts: HookOptions, timeout: float) -> dict[str, Any]:
        start = time.monotonic()
        deadline = start + timeout
        record: dict[str, Any] = {
            "ts": time.time(),
            "harness": opts.harness,
            "mode": opts.mode,
            "via": "http",
        }
        answer: dict[str, Any] | None = None
        try:
            answer = run_hook(raw, opts, self.state, deadline, decide=self._decide_sync, record=record)
        except HookInputError as exc:
            record["error"] = f"bad hook input: {exc}"
            finish(self.state, record, start)
            raise
        except TimeoutError as exc:
            record["error"] = f"timeout: {exc}"
        except Exception as exc:  # fail open, as the command hook does
            record["error"] = f"{type(exc).__name__}: {exc}"
        finish(self.state, record, start)
        return answer or {}

    def _decide_sync(self, run_id: str, body: Mapping[str, Any], seconds_left: float) -> dict[str, Any]:
        if seconds_left <= 0:
            raise ServiceError("no time left to decide")
        try:
            return anyio.from_thread.run(self._decide, run_id, body)
        except StopServeError as exc:
            from stopserve.error_table import error_detail, status_of

            status, _ = status_of(exc)
            raise classify_error(status, {"error": error_detail(exc).model_dump()}) from None
