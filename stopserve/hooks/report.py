"""``stopserve hook report`` and ``stopserve label``: measure before trusting the hook.

The report reads the hook's ``decisions.jsonl`` (every decision, in both modes) and
``labels.jsonl`` (outcomes given with ``stopserve label``) and says:

* how many stops the hook saw and how many it blocked (would have blocked, in
  shadow mode), and in how many sessions;
* how many runs a tool hook ended -- by effect, not by answer: a turn with an end
  answer counts as ended when no tool call ran after it in that turn, else as one
  that went on (the harness did not act on the answer), with the calls that ran;
* how many calls failed open (service away, timeouts, bad arguments, errors);
* among labelled sessions, how often a session with a (would-be) block failed,
  next to how often one without failed: a hook worth enforcing blocks in sessions
  that fail.

``stopserve label SESSION_ID --reward X`` posts ``{"rewards": {"team": X}}`` to the
service's outcome endpoint for that run (closing it: the service logs the whole
session as a trace for training), with any events the hook could not deliver yet,
and records the label locally for the report.
"""

from __future__ import annotations

import math
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

import orjson

from stopserve.errors import ConfigError
from stopserve.hooks.state import StateDir

__all__ = ["label", "report", "show_report"]


def report(
    decisions: Iterable[Mapping[str, Any]], labels: Mapping[str, float], *, fail_below: float = 0.5
) -> dict[str, Any]:
    """The report's numbers from decision records and session labels."""
    stops = blocks = tool_calls = ends = failed_open = 0
    sessions: set[str] = set()
    blocked_sessions: set[str] = set()
    modes: dict[str, int] = defaultdict(int)
    # (run, turn) -> tool calls that ran after its first end answer (None: no end answer yet)
    after_end: dict[tuple[str, str], int] = {}
    shadow_ends: set[tuple[str, str]] = set()
    for rec in decisions:
        if rec.get("error"):
            failed_open += 1  # also a call that failed before it knew its session
        sid = rec.get("session_id")
        if not isinstance(sid, str):
            continue
        sessions.add(sid)
        modes[str(rec.get("mode"))] += 1
        event = rec.get("event")
        if event in ("Stop", "SubagentStop"):
            stops += 1
            if rec.get("would_block"):
                blocks += 1
                blocked_sessions.add(sid)
        elif event in ("PreToolUse", "PostToolUse", "PostToolUseFailure"):
            key = (str(rec.get("run_id", sid)), str(rec.get("turn_key")))
            outcome = str(rec.get("outcome") or "")
            if event != "PreToolUse":
                tool_calls += 1
                if key in after_end and not outcome.startswith("refuse"):
                    after_end[key] += 1  # a call ran although this turn was to end
            if rec.get("would_end"):
                ends += 1
                if outcome == "end" and key not in after_end:
                    after_end[key] = 0
                elif outcome == "would end":
                    shadow_ends.add(key)
    labelled = {s: r for s, r in labels.items() if s in sessions}
    with_block = [r for s, r in labelled.items() if s in blocked_sessions]
    without = [r for s, r in labelled.items() if s not in blocked_sessions]

    def rate(n: int, d: int) -> float | None:
        return n / d if d else None

    went_on = [n for n in after_end.values() if n > 0]
    return {
        "modes": dict(modes),
        "sessions": len(sessions),
        "stops": stops,
        "would_block": blocks,
        "would_block_rate": rate(blocks, stops),
        "sessions_with_block": len(blocked_sessions),
        "tool_calls": tool_calls,
        "would_end": ends,
        "end_turns": len(after_end),
        "ended": len(after_end) - len(went_on),
        "went_on": len(went_on),
        "calls_after_end": sum(went_on),
        "would_end_turns": len(shadow_ends),
        "failed_open": failed_open,
        "labelled_sessions": len(labelled),
        "fail_below": fail_below,
        "blocked_labelled": len(with_block),
        "blocked_failed": sum(1 for r in with_block if r < fail_below),
        "blocked_fail_rate": rate(sum(1 for r in with_block if r < fail_below), len(with_block)),
        "unblocked_labelled": len(without),
        "unblocked_failed": sum(1 for r in without if r < fail_below),
        "unblocked_fail_rate": rate(sum(1 for r in without if r < fail_below), len(without)),
    }


def _installed(state_dir: str | None) -> None:
    """One line per harness: installed, trusted (Codex), ever run (``stopserve hook doctor`` in full)."""
    from stopserve.hooks.doctor import summary

    for line in summary(state_dir=state_dir):
        print(line)


def _labels(state: StateDir) -> dict[str, float]:
    out: dict[str, float] = {}
    for rec in state.records("labels.jsonl"):
        sid, reward = rec.get("session_id"), rec.get("reward")
        if isinstance(sid, str) and isinstance(reward, int | float):
            out[sid] = float(reward)
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def show_report(*, state_dir: str | None = None, fail_below: float = 0.5, as_json: bool = False) -> int:
    """What ``stopserve hook report`` prints: block rate, failures of blocked sessions (labels),
    the installed hooks; one JSON object with ``as_json``."""
    state = StateDir(state_dir)
    numbers = report(state.records("decisions.jsonl"), _labels(state), fail_below=fail_below)
    if as_json:
        print(orjson.dumps(numbers).decode())
        return 0
    if not numbers["sessions"] and not numbers["failed_open"]:
        print(f"no hook decisions logged in {state.root} yet")
        _installed(state_dir)
        return 0
    n = numbers
    print(
        f"state: {state.root}  "
        f"(calls by mode: {', '.join(f'{k} {v}' for k, v in sorted(n['modes'].items()))})"
    )
    print(f"sessions: {n['sessions']}   stops seen: {n['stops']}")
    print(
        f"stops blocked (or would be, in shadow mode): {n['would_block']} ({_pct(n['would_block_rate'])}),"
        f" in {n['sessions_with_block']} session(s)"
    )
    print(f"tool calls seen: {n['tool_calls']}   end answers given: {n['would_end']}")
    print(
        f"turns ended: {n['ended']} of {n['end_turns']} with an end answer (no tool ran after it)"
        + (f"; {n['would_end_turns']} would have been (shadow mode)" if n["would_end_turns"] else "")
    )
    if n["went_on"]:
        print(
            f"  WENT ON after the end answer: {n['went_on']} turn(s), {n['calls_after_end']} tool call(s) ran"
            " after it: the harness did not act on it (stopserve hook doctor)"
        )
    print(f"calls that failed open (service away, timeout, bad arguments, error): {n['failed_open']}")
    _installed(state_dir)
    if not n["labelled_sessions"]:
        print("no labels yet: give outcomes with `stopserve label SESSION_ID --reward X`")
        return 0
    print(f"labelled sessions: {n['labelled_sessions']} (failed = reward below {n['fail_below']:g})")
    print(
        f"  with a block:    {n['blocked_failed']} of {n['blocked_labelled']} failed"
        f" ({_pct(n['blocked_fail_rate'])})"
    )
    print(
        f"  without a block: {n['unblocked_failed']} of {n['unblocked_labelled']} failed"
        f" ({_pct(n['unblocked_fail_rate'])})"
    )
    return 0


def label(session_id: str, reward: float, *, url: str, state_dir: str | None = None) -> int:
    """Post a session's outcome to the service at ``url`` and record it locally (``stopserve
    label``): 0 when posted, 1 when only recorded."""
    from stopserve.hooks.protocol import _run_id
    from stopserve.hooks.run import post_json

    if not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
        raise ConfigError(f"reward must be a number in [0, 1], got {reward}")
    state = StateDir(state_dir)
    run_id = _run_id(session_id)
    st = state.load(run_id) or {}
    pending = [e for e in st.get("pending", []) if isinstance(e, dict)]
    body: dict[str, Any] = {"rewards": {"team": reward}, "events": pending}
    state.append("labels.jsonl", {"ts": time.time(), "session_id": session_id, "reward": reward})
    try:
        status, data = post_json(url, f"/v1/runs/{quote(run_id, safe='')}/outcome", body, timeout=10.0)
    except Exception as exc:  # OSError, http.client.HTTPException, a bad --url
        print(
            f"recorded locally in {state.root / 'labels.jsonl'}; "
            f"not posted: service at {url} unreachable ({exc})",
            file=sys.stderr,
        )
        return 1
    if status == 200 and isinstance(data, dict):
        where = data.get("trace_log") or "no trace log (the service runs without a log dir)"
        print(
            f"session {session_id}: outcome {reward:g} posted; {data.get('n_events')} events, "
            f"{data.get('n_decisions')} decisions -> {where}; recorded in {state.root / 'labels.jsonl'}"
        )
        if st:
            st["closed"] = True
            st["pending"] = []
            state.save(run_id, st)
        return 0
    error = data.get("error") if isinstance(data, dict) else None
    detail = error.get("message") if isinstance(error, dict) else f"HTTP {status}"
    hint = ""
    if status == 404:
        hint = (
            " (the service no longer holds this run: it expired, the service restarted, or it never saw it)"
        )
    print(
        f"recorded locally in {state.root / 'labels.jsonl'}; not posted: {detail}{hint}",
        file=sys.stderr,
    )
    return 1
