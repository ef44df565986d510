"""Codex CLI, the real binary (``codex exec --json``), with stopserve's hooks installed by
``stopserve hook install codex`` and a scripted model (Responses API) on loopback.

Codex acts on no ``continue: false`` from a tool hook, so a looping turn is ended by
telling the model after the call (the reason replaces the output it reads) and
refusing every further call of the turn from ``PreToolUse``; the turn then reaches
``Stop``. ``codex exec`` runs only trusted hooks: most tests pass
``--dangerously-bypass-hook-trust``, the trust test runs without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harnesses import HarnessRun, binary, hook_records, run_codex
from scenarios import FAILING, SUCCEEDING, finished, heeds_nudges, hung_port, loop, verify_then_stop
from servers import LiveServer, free_port

from stopserve.safety import LoopConfig

# a loop must be ended within this many tool calls: the threshold, its nudges, one refused call
MAX_CALLS = LoopConfig().repeated_action_observation + LoopConfig().nudge + 1


def _install(url: str, state: Path, *extra: str) -> list[str]:
    return ["--url", url, "--state-dir", str(state), *extra]


def _turn_completed(run: HarnessRun) -> None:
    assert run.rc == 0, run.stderr[-3000:]
    assert any(e.get("type") == "turn.completed" for e in run.events), run.stdout[-3000:]


def _told(run: HarnessRun) -> list[str]:
    return [line for line in run.user_messages() if "stopserve stopped this turn" in line]


def test_a_loop_of_a_failing_command_is_ended(codex: Path, service: LiveServer, tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = run_codex(tmp_path / "home", loop(FAILING), install=_install(service.url, state))
    _turn_completed(run)
    assert run.tool_calls() <= MAX_CALLS, run.steps
    said = _told(run)
    assert said and "the same call failed again and again" in said[0], run.user_messages()
    records = hook_records(state)
    ends = [r for r in records if r.get("outcome") == "end"]
    # item 4: the failing command is recorded as failing (exit code from the rollout, not the hook)
    assert ends and ends[0]["event"] == "PostToolUse" and ends[0]["pattern"] == "repeated_action_error"
    assert "(: " not in ends[0]["reason_text"] and "Chunk ID" not in ends[0]["reason_text"]  # item 5
    stop = [r for r in records if r["event"] == "Stop"]
    assert stop and stop[-1]["outcome"] == "allow (run ended this turn)"


def test_a_loop_of_a_succeeding_command_is_ended(codex: Path, service: LiveServer, tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = run_codex(tmp_path / "home", loop(SUCCEEDING), install=_install(service.url, state))
    _turn_completed(run)
    assert run.tool_calls() <= MAX_CALLS, run.steps
    said = _told(run)
    assert said and "the same call returned the same output" in said[0]


def test_a_stubborn_model_is_refused_every_further_call(
    codex: Path, service: LiveServer, tmp_path: Path
) -> None:
    state = tmp_path / "state"

    def stubborn(view: object) -> object:  # never obeys: the same call, 12 times, then gives up
        from scenarios import _shell
        from scripted import Say

        assert hasattr(view, "results")
        return Say("Giving up.") if len(view.results) >= 12 else _shell("responses", FAILING)

    run = run_codex(tmp_path / "home", stubborn, install=_install(service.url, state))  # type: ignore[arg-type]
    _turn_completed(run)
    records = hook_records(state)
    ran = [r for r in records if r["event"] == "PostToolUse"]
    refused = [r for r in records if r["event"] == "PreToolUse" and r["outcome"].startswith("refuse")]
    # the loop is ended at its threshold's failure after the nudges; the rest are refused
    n = LoopConfig().repeated_action_error + LoopConfig().nudge
    assert len(ran) == n and len(refused) == 12 - n, [(r["event"], r["outcome"]) for r in records]


def test_a_finished_run_is_let_through(codex: Path, service: LiveServer, tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = run_codex(tmp_path / "home", finished, install=_install(service.url, state))
    _turn_completed(run)
    records = hook_records(state)
    assert [r["outcome"] for r in records if r["event"] == "Stop"] == ["allow"]
    assert not any(r.get("would_block") or r.get("would_end") for r in records)


def test_a_premature_stop_is_blocked_then_let_through(
    codex: Path, strict_service: LiveServer, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    run = run_codex(tmp_path / "home", verify_then_stop, install=_install(strict_service.url, state))
    _turn_completed(run)
    stops = [r for r in hook_records(state) if r["event"] == "Stop"]
    assert stops[0]["outcome"] == "block", stops
    assert "run the tests" in stops[0]["reason_text"] and "before the minimum" in stops[0]["reason_text"]
    assert stops[-1]["outcome"] == "allow", stops  # by the service: min_turns reached
    last = [e["item"]["text"] for e in run.events if e.get("item", {}).get("type") == "agent_message"]
    assert last and last[-1].startswith("Done: app.py has add(), and its test passes"), last


def test_service_down_or_hung_never_holds_the_run(codex: Path, tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    state = tmp_path / "down-state"
    run = run_codex(tmp_path / "down", finished, install=_install(down, state))
    _turn_completed(run)
    assert all("unreachable" in r["error"] for r in hook_records(state))
    with hung_port() as port:
        state = tmp_path / "hung-state"
        run = run_codex(tmp_path / "hung", finished, install=_install(f"http://127.0.0.1:{port}", state))
    _turn_completed(run)
    records = hook_records(state)
    assert records and all("timeout" in r["error"] or "did not answer" in r["error"] for r in records)
    assert max(r["ms"] for r in records) < 1000, records  # each call cut at --timeout 0.8 s
    # 3 hook calls (PreToolUse, PostToolUse, Stop) at <= 0.8 s each, plus the run itself
    assert run.seconds < 3 * 0.8 + 8, run.seconds


def _app_server_hooks(codex_home: Path) -> list[dict[str, object]]:
    """Codex's own view of the installed hooks (``codex app-server``, ``hooks/list``)."""
    exe = binary("codex")
    assert exe is not None
    env = {"PATH": os.environ["PATH"], "HOME": str(codex_home.parent), "CODEX_HOME": str(codex_home)}
    requests = [
        {
            "id": 1,
            "method": "initialize",
            "params": {"clientInfo": {"name": "stopserve-tests", "version": "0"}},
        },
        {"method": "initialized"},
        {"id": 2, "method": "hooks/list", "params": {"cwds": [str(codex_home.parent)]}},
    ]
    proc = subprocess.Popen(
        [str(exe), "app-server"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        for req in requests:
            proc.stdin.write(json.dumps(req) + "\n")
            proc.stdin.flush()
        for line in proc.stdout:
            answer = json.loads(line)
            if answer.get("id") == 2:
                return [h for entry in answer["result"]["data"] for h in entry["hooks"]]
    finally:
        proc.kill()
        proc.wait(10)
    raise AssertionError("codex app-server gave no hooks/list answer")


def _doctor(home: Path) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STOPSERVE_", "CODEX_"))}
    env.update(HOME=str(home), CODEX_HOME=str(home / ".codex"))
    proc = subprocess.run(
        [sys.executable, "-m", "stopserve", "hook", "doctor", "codex"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc.returncode, proc.stdout


def test_codex_exec_runs_no_untrusted_hook_and_doctor_says_so(
    codex: Path, service: LiveServer, tmp_path: Path
) -> None:
    home, state = tmp_path / "home", tmp_path / "state"
    run = run_codex(home, finished, install=_install(service.url, state), bypass_trust=False)
    _turn_completed(run)
    assert "--dangerously-bypass-hook-trust" in run.extra["install"]  # install said how
    assert hook_records(state) == []  # Codex ran none of them, and said nothing
    rc, out = _doctor(home)
    assert rc == 1 and "not trusted" in out and "never run yet" in out, out
    # Codex's own hashes are the ones stopserve computes
    hooks = _app_server_hooks(home / ".codex")
    assert hooks and {h["trustStatus"] for h in hooks} == {"untrusted"}
    # trusted by `stopserve hook install codex --trust`: Codex runs them, no bypass needed
    run = run_codex(home, finished, install=[*_install(service.url, state), "--trust"], bypass_trust=False)
    _turn_completed(run)
    assert {h["trustStatus"] for h in _app_server_hooks(home / ".codex")} == {"trusted"}
    assert [r["outcome"] for r in hook_records(state) if r["event"] == "Stop"] == ["allow"]
    rc, out = _doctor(home)
    assert rc == 0 and "Codex trusts all 4" in out, out
    # another option changes the command: Codex's trust no longer holds, and doctor says so
    run = run_codex(
        home, finished, install=[*_install(service.url, state), "--mode", "shadow"], bypass_trust=False
    )
    assert {h["trustStatus"] for h in _app_server_hooks(home / ".codex")} == {"modified"}
    assert "trusted again" in run.extra["install"]
    rc, out = _doctor(home)
    assert rc == 1 and "changed since it was trusted" in out, out


def test_a_loop_is_nudged_first_and_a_model_that_heeds_it_is_not_ended(
    codex: Path, service: LiveServer, tmp_path: Path
) -> None:
    """At the threshold the hook answers ``decision: block``: the model reads the nudge, then the output."""
    state = tmp_path / "state"
    run = run_codex(tmp_path / "home", heeds_nudges(FAILING), install=_install(service.url, state))
    _turn_completed(run)
    records = hook_records(state)
    nudges = [r for r in records if r.get("outcome") == "nudge"]
    assert nudges and nudges[0]["event"] == "PostToolUse", [(r["event"], r.get("outcome")) for r in records]
    told = [
        r["view"].results[-1]
        for r in run.model.log
        if any("try something different" in x for x in r["view"].results)
    ]
    assert told and "The output, unchanged:" in told[0] and "No such file" in told[0], told
    assert not any(r.get("outcome") in ("end",) or r["outcome"].startswith("refuse") for r in records), (
        records
    )
    assert run.tool_calls() == LoopConfig().repeated_action_error + 1, run.steps  # then ls -la
