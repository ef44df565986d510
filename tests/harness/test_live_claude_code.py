"""Claude Code, the real binary (``claude -p ... --output-format stream-json``), with stopserve's
hooks installed by ``stopserve hook install claude-code`` and a scripted model on loopback.

The service runs ``--no-model``: the default safety nets (the loop detector) decide the
loops, ``min_turns`` (``strict_service``) the premature stop; nothing depends on a
model's numbers.
"""

from __future__ import annotations

import re
from pathlib import Path

from harnesses import HarnessRun, hook_records, run_claude
from scenarios import FAILING, SUCCEEDING, finished, heeds_nudges, hung_port, loop, subagent, verify_then_stop
from scripted import Tool
from servers import LiveServer, free_port

from stopserve.safety import LoopConfig

# a loop must be ended within this many tool calls: the threshold, its nudges, one refused call
MAX_CALLS = LoopConfig().repeated_action_observation + LoopConfig().nudge + 1


def _install(url: str, state: Path, *extra: str) -> list[str]:
    return ["--url", url, "--state-dir", str(state), *extra]


def _ended_by_stopserve(run: HarnessRun) -> str:
    result = run.result()
    assert result["terminal_reason"] == "hook_stopped", result
    shown = [m for m in run.user_messages() if "stopserve ended the run" in m]
    assert shown, f"the user was not told why: {run.user_messages()}"
    return shown[-1]


def test_a_loop_of_a_failing_command_is_ended(claude: Path, service: LiveServer, tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = run_claude(tmp_path / "home", loop(FAILING), install=_install(service.url, state))
    said = _ended_by_stopserve(run)
    # Claude Code ignores continue:false from PostToolUseFailure: the next call's PreToolUse ends it
    assert run.tool_calls() <= MAX_CALLS, run.steps
    assert "loop detected, the same call failed again and again" in said and FAILING in said
    records = hook_records(state)
    ends = [r for r in records if r.get("outcome") == "end"]
    assert ends and ends[0]["event"] == "PostToolUseFailure" and ends[0]["pattern"] == "repeated_action_error"
    assert records[-1]["event"] == "PreToolUse" and records[-1]["outcome"].startswith("refuse")
    # item 5: the facts of a result seen twice (hook, then transcript) are those of its call
    assert "(: " not in said and ": Exit code 1" not in said


def test_a_loop_of_a_succeeding_command_is_ended(claude: Path, service: LiveServer, tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = run_claude(tmp_path / "home", loop(SUCCEEDING), install=_install(service.url, state))
    said = _ended_by_stopserve(run)
    assert run.tool_calls() <= MAX_CALLS, run.steps
    assert "the same call returned the same output" in said
    ends = [r for r in hook_records(state) if r.get("outcome") == "end"]
    assert ends[0]["event"] == "PostToolUse"


def test_a_finished_run_is_let_through(claude: Path, service: LiveServer, tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = run_claude(tmp_path / "home", finished, install=_install(service.url, state))
    result = run.result()
    assert result["terminal_reason"] != "hook_stopped" and result["result"].startswith("Done")
    records = hook_records(state)
    assert [r["outcome"] for r in records if r["event"] == "Stop"] == ["allow"]
    assert not any(r.get("would_block") or r.get("would_end") for r in records)


def test_a_premature_stop_is_blocked_then_let_through(
    claude: Path, strict_service: LiveServer, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    run = run_claude(tmp_path / "home", verify_then_stop, install=_install(strict_service.url, state))
    result = run.result()
    assert result["result"].startswith("Done: app.py has add(), and its test passes"), result
    stops = [r for r in hook_records(state) if r["event"] == "Stop"]
    assert stops[0]["outcome"] == "block"
    reason = stops[0]["reason_text"]
    assert "files were edited" in reason and "run the tests" in reason, reason
    assert "before the minimum" in reason and "quality" not in reason  # item 6: min_turns, said so
    assert stops[-1]["outcome"] == "allow", stops  # by the service: min_turns reached
    assert any(isinstance(s, Tool) and "pytest" in str(s.input) for s in run.steps)


def test_a_subagent_is_its_own_run(claude: Path, service: LiveServer, tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = run_claude(tmp_path / "home", subagent, install=_install(service.url, state))
    assert run.result()["result"].startswith("Done: the sub-agent"), run.result()
    records = hook_records(state)
    sub = [r for r in records if r["event"] == "SubagentStop"]
    assert sub and sub[0]["outcome"] == "allow" and ":" in sub[0]["run_id"], records
    session = sub[0]["run_id"].split(":")[0]
    inside = [r for r in records if r["event"] == "PostToolUse" and r["run_id"] == sub[0]["run_id"]]
    assert inside and inside[0]["tool"] == "Bash"  # the sub-agent's call, counted in its own run
    assert any(r["event"] == "Stop" and r["run_id"] == session for r in records)


def _hook_ms(run: HarnessRun) -> list[int]:
    """How long each stopserve hook took as Claude Code measured it (its debug log)."""
    log = (run.home / "claude-debug.log").read_text(errors="replace")
    return [
        int(m)
        for m in re.findall(r"stopserve hook claude-code[^\]]*\] finished with status \d+ \((\d+)ms\)", log)
    ]


def test_service_down_or_hung_never_holds_the_run(claude: Path, tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    state = tmp_path / "down-state"
    run = run_claude(tmp_path / "down", finished, install=_install(down, state))
    assert run.result()["result"].startswith("Done")
    assert all("unreachable" in r["error"] for r in hook_records(state))
    with hung_port() as port:
        state = tmp_path / "hung-state"
        run = run_claude(tmp_path / "hung", finished, install=_install(f"http://127.0.0.1:{port}", state))
    assert run.result()["result"].startswith("Done")
    records = hook_records(state)
    assert records and all(
        r["error"].startswith("timeout") or "did not answer" in r["error"] for r in records
    )
    measured = _hook_ms(run)
    assert measured and max(measured) < 800 + 1500, measured  # cut at --timeout 0.8 s (+ process start)


def test_http_hooks_end_a_loop_through_the_service(claude: Path, service: LiveServer, tmp_path: Path) -> None:
    home = tmp_path / "home"
    # a user whose settings restrict HTTP hooks: install adds the service's pattern
    settings = {"allowedHttpHookUrls": ["https://hooks.example.invalid/*"]}
    run = run_claude(home, loop(FAILING), settings=settings, install=["--url", service.url, "--http"])
    said = _ended_by_stopserve(run)
    assert run.tool_calls() <= MAX_CALLS and "loop detected" in said
    state = Path(service.env["STOPSERVE_HOOK_STATE_DIR"])
    via = [r for r in hook_records(state) if r.get("session_id") == run.result()["session_id"]]
    assert via and all(r.get("via") == "http" for r in via)
    assert not (home / ".cache").exists() or not list((home / ".cache").rglob("decisions.jsonl"))


def _nudged_requests(run: HarnessRun) -> list[int]:
    """Which model requests (by index) carried a nudge."""
    import json

    return [i for i, r in enumerate(run.model.log) if "try something different" in json.dumps(r["view"].body)]


def test_a_loop_is_nudged_first_and_a_model_that_heeds_it_is_not_ended(
    claude: Path, service: LiveServer, tmp_path: Path
) -> None:
    """At the threshold the hook answers ``additionalContext``: Claude Code hands it to the model."""
    for command, event in ((SUCCEEDING, "PostToolUse"), (FAILING, "PostToolUseFailure")):
        state = tmp_path / f"state-{event}"
        run = run_claude(
            tmp_path / f"home-{event}", heeds_nudges(command), install=_install(service.url, state)
        )
        records = hook_records(state)
        nudges = [r for r in records if r.get("outcome") == "nudge"]
        assert nudges and nudges[0]["event"] == event, [(r["event"], r.get("outcome")) for r in records]
        assert "try something different" in nudges[0]["reason_text"]
        assert _nudged_requests(run), "the model never read the nudge"
        assert not any(r.get("outcome") in ("end", "refuse (run ended this turn)") for r in records), records
        assert run.result().get("terminal_reason") != "hook_stopped", run.result()
        assert run.tool_calls() == LoopConfig().repeated_action_observation + 1, run.steps  # then ls -la
