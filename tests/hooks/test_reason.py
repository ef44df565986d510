"""The reason texts: built from the decision and the transcript's facts, each case once."""

from __future__ import annotations

from stopserve.hooks.reason import block_reason, end_reason
from stopserve.importers._transcript import Facts

NO_MODEL = {"action": "continue", "turn": 1, "v_stop": None}
MODEL = {"action": "continue", "turn": 7, "v_stop": 0.18, "q_continue": 0.74, "q_stop": 0.52}


def facts(**kw: object) -> Facts:
    return Facts(**kw)  # type: ignore[arg-type]


def test_the_next_step_comes_from_the_transcript() -> None:
    edited = facts(last_test="pytest -q", last_test_passed=True, tool_calls=4)
    edited.edited(
        ["src/a.py", "src/b.py", "src/a.py", "/very/long/path/to/some/deeply/nested/module/c.py", "d.py"]
    )
    text = block_reason(MODEL, edited, blocks_left=1)
    assert text.startswith("Not finished yet: files were edited after the last passing test run")
    assert "(src/a.py, src/b.py, …/module/c.py and 1 more)" in text and "`pytest -q`" in text
    failed = facts(last_test="npm test", last_test_passed=False, tool_calls=2)
    assert "the last test run (`npm test`) failed; fix the failures" in block_reason(
        MODEL, failed, blocks_left=1
    )
    untested = facts(tool_calls=1)
    untested.edited(["app.py"])
    assert "files were edited (app.py) but no test run was seen" in block_reason(
        MODEL, untested, blocks_left=1
    )
    error = facts(tool_calls=3, last_call_failed=True, last_error="Bash: make: No rule to make target")
    assert "the last tool call failed (Bash: make: No rule" in block_reason(MODEL, error, blocks_left=1)
    assert "no tool was used yet" in block_reason(NO_MODEL, facts(), blocks_left=1)
    assert "check the result against the task once more" in block_reason(
        MODEL, facts(tool_calls=5), blocks_left=1
    )


def test_the_why_comes_from_the_decision() -> None:
    assert "quality 0.74, vs 0.52 now" in block_reason(MODEL, facts(), blocks_left=1)
    assert "value of stopping +0.30" in block_reason(
        {"action": "continue", "v_stop": 0.3}, facts(), blocks_left=1
    )
    assert "only 1 step," in block_reason(NO_MODEL, facts(), blocks_left=1)
    assert "only 3 steps," in block_reason({**NO_MODEL, "turn": 3}, facts(), blocks_left=1)
    assert "at most 2 more times" in block_reason(NO_MODEL, facts(), blocks_left=2)
    assert "will let the next stop through" in block_reason(NO_MODEL, facts(), blocks_left=0)


def test_end_reasons() -> None:
    loop = {
        "action": "stop",
        "reason": "loop_detected",
        "safety_net": "loop_detector",
        "pattern": "monologue",
    }
    text = end_reason(loop, facts(last_call="Bash: ls"))
    assert (
        "loop detected, the same message was repeated" in text
        and "(last: Bash: ls)" in text
        and "[monologue]" in text
    )
    budget = {"action": "stop", "reason": "budget_exhausted", "safety_net": "max_tokens", "limit": "tokens"}
    assert end_reason(budget, facts()) == "stopserve ended the run: the tokens budget is spent [max_tokens]."
    model = {"action": "stop", "reason": "no_progress", "v_stop": -0.4}
    assert "expects no more progress (value of stopping -0.40)" in end_reason(model, facts())
