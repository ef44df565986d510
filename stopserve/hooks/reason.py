"""Reason texts a person and the agent can act on, built from what drove the decision.

Two inputs: the service's decision (``reason``, ``v_stop``, ``q_continue``,
``q_stop``, ``turn``, ``safety_net``, ``pattern``, ``limit``) and the simple facts the
hook read from the transcript (:class:`~stopserve.importers._transcript.Facts`:
files edited since the last test run, the last test run's result, the last tool
error). The decision says *that* the agent should go on or stop; the facts say
*what* to do next.

>>> from stopserve.importers._transcript import Facts
>>> f = Facts(last_test="pytest", last_test_passed=True)
>>> f.edited(["app.py"])
>>> block_reason({"action": "continue", "turn": 5, "v_stop": None}, f, blocks_left=1)[:60]
'Not finished yet: files were edited after the last passing t'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from stopserve.importers._transcript import Facts

__all__ = ["block_reason", "end_reason", "end_text", "fired"]

_PATTERNS: Final = {
    "repeated_action_observation": "the same call returned the same output again and again",
    "repeated_action_error": "the same call failed again and again",
    "monologue": "the same message was repeated with nothing in between",
    "alternating_actions": "two calls alternated without getting anywhere",
    "repeated_cycle": "the same stretch of steps came back unchanged",
}


def _files(paths: Sequence[str], total: int) -> str:
    shown = []
    for path in paths[:3]:
        parts = path.replace("\\", "/").split("/")
        shown.append(path if len(path) <= 48 or len(parts) < 3 else "…/" + "/".join(parts[-2:]))
    more = total - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _todo(facts: Facts) -> str:
    """The next step the transcript suggests."""
    test = f" (`{facts.last_test}`)" if facts.last_test else ""
    if facts.n_edited_after_test and facts.last_test is not None:
        files = _files(facts.edited_after_test, facts.n_edited_after_test)
        if facts.last_test_passed:
            return f"files were edited after the last passing test run ({files}); run the tests{test} again"
        return f"the last test run{test} failed and files were edited since ({files}); run the tests again"
    if facts.last_test_passed is False:
        return f"the last test run{test} failed; fix the failures, or say why they cannot pass"
    if facts.n_edited_after_test:
        files = _files(facts.edited_after_test, facts.n_edited_after_test)
        return f"files were edited ({files}) but no test run was seen; run the tests"
    if facts.last_call_failed and facts.last_error:
        return f"the last tool call failed ({facts.last_error}); deal with the error or explain it"
    if not facts.tool_calls:
        return "no tool was used yet; check the answer against the task (run it, or read the code or docs)"
    return "check the result against the task once more (run it or test it)"


def _why_continue(decision: Mapping[str, Any], safety: Mapping[str, Any] | None) -> str:
    """Why the service wants the agent to go on.

    A stop the model itself would take (``q_continue`` not above ``q_stop``, or a
    ``v_stop`` not above 0) that the service still answers *continue* was vetoed by
    ``min_turns``: the reason says so, not the model's numbers, which argue the other way.
    """
    q, s, v = (_number(decision.get(k)) for k in ("q_continue", "q_stop", "v_stop"))
    model_would_stop = (q is not None and s is not None and q <= s) or (
        q is None and v is not None and v <= 0
    )
    if decision.get("reason") == "min_turns" or model_would_stop or (q is None and v is None):
        turn = decision.get("turn")
        steps = f"{turn} step{'s' if turn != 1 else ''}" if isinstance(turn, int) else "few steps"
        wanted = safety.get("min_turns") if isinstance(safety, Mapping) else None
        minimum = f" ({wanted})" if isinstance(wanted, int) and not isinstance(wanted, bool) else ""
        return f"the stop came after only {steps}, before the minimum{minimum} the stop policy asks for"
    if q is not None and s is not None:
        return f"the stop policy expects a better result from going on (quality {q:.2f}, vs {s:.2f} now)"
    assert v is not None
    return f"the stop policy expects going on to pay off (value of stopping {v:+.2f})"


def block_reason(
    decision: Mapping[str, Any],
    facts: Facts,
    *,
    blocks_left: int,
    safety: Mapping[str, Any] | None = None,
) -> str:
    """The reason given with ``{"decision": "block"}``: the next step, then why.

    ``blocks_left``: how many more times this turn the hook may block (said so that
    the agent knows an honest "done, because ..." will get through); ``safety``: the
    hook's own ``--safety`` config, when it sent one (to name its ``min_turns``).
    """
    todo = _todo(facts)
    why = _why_continue(decision, safety)
    again = (
        "stopserve will let the next stop through"
        if blocks_left <= 0
        else f"stopserve blocks at most {blocks_left} more time{'s' if blocks_left != 1 else ''} this turn"
    )
    return (
        f"Not finished yet: {todo} before finishing. Why: {why}. "
        f"If the task is really done, say what you checked and finish ({again})."
    )


def end_reason(
    decision: Mapping[str, Any], facts: Facts, *, harness: str = "claude-code", event: str = "PreToolUse"
) -> str:
    """The reason a tool hook gives when the run is to end (the model and the user read it)."""
    return end_text(
        fired(decision, facts), harness=harness, event=event, loop=decision.get("reason") == "loop_detected"
    )


def end_text(what: str, *, harness: str, event: str, loop: bool = False) -> str:
    """The end reason for ``what`` fired, worded for what the answer does there.

    Claude Code's ``PreToolUse`` ends the run (the user is shown the text); elsewhere the
    hook can only tell the model and refuse its next calls, so the text asks it to report
    and finish.
    """
    if harness == "claude-code" and event == "PreToolUse":
        advice = " Try a different approach, or ask the user." if loop else ""
        return f"stopserve ended the run: {what}.{advice}"
    return (
        f"stopserve stopped this turn: {what}. Do not call more tools: tell the user what you "
        "found and what is in the way, then finish (stopserve refuses further tool calls this turn)."
    )


def fired(decision: Mapping[str, Any], facts: Facts) -> str:
    """What made the service stop the run, in words (with the loop's pattern and last call)."""
    return _what_fired(decision, facts)


def _what_fired(decision: Mapping[str, Any], facts: Facts) -> str:
    reason = decision.get("reason")
    net = decision.get("safety_net")
    if reason == "loop_detected":
        pattern = decision.get("pattern")
        what = _PATTERNS.get(str(pattern), "a loop")
        last = f" (last: {facts.last_call})" if facts.last_call else ""
        return f"loop detected, {what}{last} [{pattern}]"
    if reason == "budget_exhausted":
        limit = decision.get("limit") or "a"
        return f"the {limit} budget is spent [{net}]"
    if net:
        return f"safety net {net} fired [{reason}]"
    v = _number(decision.get("v_stop"))
    value = f" (value of stopping {v:+.2f})" if v is not None else ""
    return f"the stop policy expects no more progress{value} [{reason}]"
