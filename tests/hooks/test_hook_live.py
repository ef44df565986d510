"""The hook end to end: ``python -m stopserve hook claude-code|codex`` run as the harness runs
it (hook JSON on stdin, a transcript that grows between calls) against a REAL service on
loopback, started with ``--no-model``: the default safety nets alone (``SafetyConfig()``:
the loop detector on) with ``min_turns`` 2, as a team that wants every run verified before it
ends would set (``STOPSERVE_SAFETY``), so nothing here depends on the served model."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _hookkit import ClaudeSession, CodexSession, records, run_hook
from servers import LiveServer, free_port
from sketchkit import similar, traceback_at

from stopserve.safety import LoopConfig

ALWAYS_GO_ON = ("--safety", '{"min_turns": 50}')  # a policy that wants every stop refused


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    verify = {"STOPSERVE_SAFETY": '{"min_turns": 2}'}  # a premature (one-step) stop is refused
    with LiveServer(log_dir=tmp_path_factory.mktemp("service-logs"), no_model=True, env=verify) as live:
        yield live


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


def test_a_premature_stop_is_blocked_and_a_finished_run_let_through(
    server: LiveServer, tmp_path: Path, state: Path
) -> None:
    s = ClaudeSession(tmp_path / "proj", "sess-premature")
    s.user("Fix the crash in app.py")
    s.say("Done, I fixed it.")
    first = run_hook("claude-code", s.stop(), url=server.url, state=state)
    assert first.rc == 0 and first.answer is not None and first.answer["decision"] == "block"
    assert "no tool was used yet" in first.answer["reason"]
    assert "only 1 step" in first.answer["reason"]
    # the agent goes on: edits, runs the tests, and stops again
    s.edit("toolu_e1", "src/app.py")
    s.bash("toolu_t1", "python -m pytest -q", "4 passed in 0.02s")
    s.say("Fixed the crash; the tests pass.")
    second = run_hook("claude-code", s.stop(active=True), url=server.url, state=state)
    assert second.rc == 0 and second.answer is None, second.stderr
    outcomes = [(r["event"], r["outcome"], r["action"]) for r in records(state)]
    assert outcomes == [("Stop", "block", "continue"), ("Stop", "allow", "stop")]


def test_the_reason_names_files_edited_after_the_last_passing_tests(
    server: LiveServer, tmp_path: Path, state: Path
) -> None:
    s = ClaudeSession(tmp_path / "proj", "sess-edits")
    s.user("Add a --verbose flag")
    s.bash("toolu_t1", "pytest tests/ -q", "12 passed in 0.31s")
    s.edit("toolu_e1", "src/cli.py")
    s.edit("toolu_e2", "src/cli.py")
    s.say("Added the flag.")
    result = run_hook("claude-code", s.stop(), url=server.url, state=state, args=ALWAYS_GO_ON)
    assert result.answer is not None
    reason = result.answer["reason"]
    assert "files were edited after the last passing test run (src/cli.py)" in reason
    assert "`pytest tests/ -q`" in reason


def test_the_block_cap_holds_within_a_turn_and_resets_on_a_new_one(
    server: LiveServer, tmp_path: Path, state: Path
) -> None:
    s = ClaudeSession(tmp_path / "proj", "sess-cap")
    s.user("Refactor the parser")
    s.say("Refactored.")
    answers = []
    for active in (False, True, True, True):
        answers.append(
            run_hook(
                "claude-code", s.stop(active=active), url=server.url, state=state, args=ALWAYS_GO_ON
            ).answer
        )
        s.say("Still refactored.")
    assert [a is not None for a in answers] == [True, True, False, False]  # default cap: 2 in a row
    assert (
        "at most 1 more time" in answers[0]["reason"] and "let the next stop through" in answers[1]["reason"]
    )
    s.user("Now also rename the module")  # a new turn: the harness sends stop_hook_active false
    s.say("Renamed.")
    assert (
        run_hook("claude-code", s.stop(), url=server.url, state=state, args=ALWAYS_GO_ON).answer is not None
    )
    none = run_hook(
        "claude-code", s.stop(), url=server.url, state=state, args=(*ALWAYS_GO_ON, "--max-blocks", "0")
    )
    assert none.answer is None
    assert records(state)[-1]["outcome"] == "allow (block cap reached)"


def test_a_looping_run_is_ended_from_a_tool_hook(server: LiveServer, tmp_path: Path, state: Path) -> None:
    s = ClaudeSession(tmp_path / "proj", "sess-loop")
    s.user("Make the tests pass")
    command = {"command": "pytest -x tests/test_io.py", "description": "run the failing test"}
    response = {"stdout": "1 failed: test_roundtrip", "stderr": "", "interrupted": False, "isImage": False}
    answers = []
    loop = LoopConfig()
    first = loop.repeated_action_observation  # the same call with the same output: a loop at first,
    n = first + loop.nudge  # nudged until n
    for i in range(n + 1):
        call_id = f"toolu_loop{i}"
        s.call(call_id, "Bash", command)
        if i % 2:  # sometimes the result is in the transcript before the hook runs, sometimes not
            s.result(call_id, response)
        answers.append(
            run_hook(
                "claude-code", s.post_tool(call_id, "Bash", command, response), url=server.url, state=state
            )
        )
        if not i % 2:
            s.result(call_id, response)
    assert [a.answer is None for a in answers[: first - 1]] == [True] * (first - 1)
    for nudged in answers[first - 1 : n - 1]:  # the model reads a nudge beside the result
        assert nudged.answer is not None, answers
        context = nudged.answer["hookSpecificOutput"]
        assert (
            context["hookEventName"] == "PostToolUse"
            and "try something different" in context["additionalContext"]
        )
    told = answers[n - 1].answer  # after the call: the model is told to report and finish
    assert told is not None and told["decision"] == "block"
    assert "loop detected" in told["reason"] and "pytest -x tests/test_io.py" in told["reason"]
    assert "Do not call more tools" in told["reason"]
    last = records(state)[n - 1]
    assert (last["safety_net"], last["pattern"]) == ("loop_detector", "repeated_action_observation")
    # each call counted once although it was seen twice (hook input and transcript)
    assert last["turn"] == n
    # its next call is refused and the turn ended (Claude Code: continue false), the user told why
    s.call("toolu_loop9", "Bash", command)
    ended = run_hook("claude-code", s.pre_tool("toolu_loop9", "Bash", command), url=server.url, state=state)
    assert ended.answer is not None and ended.answer["continue"] is False
    assert ended.answer["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert ended.answer["systemMessage"].startswith("stopserve ended the run: loop detected")


def test_server_down_lets_the_agent_stop_within_the_timeout(tmp_path: Path, state: Path) -> None:
    s = ClaudeSession(tmp_path / "proj", "sess-down")
    s.user("hi")
    s.say("Hello.")
    refused = run_hook("claude-code", s.stop(), url=f"http://127.0.0.1:{free_port()}", state=state)
    assert refused.rc == 0 and refused.answer is None
    assert "unreachable" in refused.stderr and "the agent may stop" in refused.stderr
    # a service that takes the connection and never answers: the call's time runs out
    with socket.socket() as sink:
        sink.bind(("127.0.0.1", 0))
        sink.listen(8)
        url = f"http://127.0.0.1:{sink.getsockname()[1]}"
        hung = run_hook("claude-code", s.stop(), url=url, state=state, args=("--timeout", "0.5"))
    assert hung.rc == 0 and hung.answer is None and "the agent may stop" in hung.stderr
    assert hung.seconds < 30  # a hang guard; the bound itself is the logged time below
    rec = records(state)[-1]
    assert "error" in rec and rec["ms"] <= 500 + 100  # the hard deadline at --timeout, plus teardown
    log = (state / "hook.log").read_text()
    assert "unreachable" in log and ("did not answer" in log or "timeout" in log)


def test_shadow_mode_never_blocks_and_the_report_joins_labels(
    server: LiveServer, tmp_path: Path, state: Path
) -> None:
    shadow = ("--mode", "shadow")
    s = ClaudeSession(tmp_path / "proj", "sess-shadow")
    s.user("Write the changelog")
    s.say("Written.")
    assert run_hook("claude-code", s.stop(), url=server.url, state=state, args=shadow).answer is None
    command = {"command": "make docs"}
    response = {"stdout": "error: missing file", "stderr": "", "interrupted": False, "isImage": False}
    for i in range(LoopConfig().repeated_action_observation + LoopConfig().nudge + 1):  # past the nudges
        s.call(f"toolu_d{i}", "Bash", command)
        result = run_hook(
            "claude-code",
            s.post_tool(f"toolu_d{i}", "Bash", command, response),
            url=server.url,
            state=state,
            args=shadow,
        )
        assert result.answer is None
    ok = ClaudeSession(tmp_path / "proj", "sess-shadow-ok")
    ok.user("Bump the version")
    ok.edit("toolu_v", "pyproject.toml")
    ok.bash("toolu_t", "pytest -q", "3 passed")
    ok.say("Bumped; tests pass.")
    assert run_hook("claude-code", ok.stop(), url=server.url, state=state, args=shadow).answer is None
    recs = records(state)
    assert recs[0]["outcome"] == "would block" and recs[0]["would_block"] is True and "reason_text" in recs[0]
    assert any(r.get("outcome") == "would end" for r in recs)
    # labels: the would-block session failed, the other did not
    for sid, reward in (("sess-shadow", "0"), ("sess-shadow-ok", "1")):
        label = subprocess.run(
            [
                sys.executable,
                "-m",
                "stopserve",
                "label",
                sid,
                "--reward",
                reward,
                "--url",
                server.url,
                "--state-dir",
                str(state),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert label.returncode == 0, label.stderr
        assert "posted" in label.stdout
    report = subprocess.run(
        [sys.executable, "-m", "stopserve", "hook", "report", "--state-dir", str(state), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    numbers = json.loads(report.stdout)
    assert (numbers["stops"], numbers["would_block"], numbers["would_end"]) == (2, 1, 2)
    assert numbers["would_block_rate"] == 0.5
    assert (numbers["blocked_labelled"], numbers["blocked_failed"]) == (1, 1)
    assert (numbers["unblocked_labelled"], numbers["unblocked_failed"]) == (1, 0)
    text = subprocess.run(
        [sys.executable, "-m", "stopserve", "hook", "report", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "with a block:    1 of 1 failed (100.0%)" in text


def test_label_closes_the_run_and_the_session_becomes_a_trace(
    server: LiveServer, tmp_path: Path, state: Path
) -> None:
    s = ClaudeSession(tmp_path / "proj", "sess-label")
    s.user("Fix the typo")
    s.edit("toolu_1", "README.md")
    s.bash("toolu_2", "make check", "ok")
    s.say("Fixed.")
    assert run_hook("claude-code", s.stop(), url=server.url, state=state).answer is None
    argv = [
        sys.executable,
        "-m",
        "stopserve",
        "label",
        "sess-label",
        "--reward",
        "1",
        "--url",
        server.url,
        "--state-dir",
        str(state),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    trace_log = done.stdout.split("-> ")[1].split(";")[0]
    traces = [json.loads(line) for line in Path(trace_log).read_text().splitlines()]
    (trace,) = [t for t in traces if t["trace_id"] == "sess-label"]
    assert trace["rewards"] == {"team": 1.0} and trace["system"] == "claude-code"
    assert [e["type"] for e in trace["events"]][:3] == ["communicate", "tool_use", "return"]
    labels = (state / "labels.jsonl").read_text()
    assert '"session_id":"sess-label"' in labels
    # the closed run: the next hook call does not ask, and lets the agent stop
    s.user("one more thing")
    s.say("Done.")
    after = run_hook("claude-code", s.stop(), url=server.url, state=state)
    assert after.answer is None and "outcome was posted" in records(state)[-1]["error"]
    unknown = subprocess.run(
        [*argv[:4], "never-seen", *argv[5:]], capture_output=True, text=True, check=False
    )
    assert unknown.returncode == 1 and "recorded locally" in unknown.stderr


def test_a_subagent_stop_is_its_own_run(server: LiveServer, tmp_path: Path, state: Path) -> None:
    main = ClaudeSession(tmp_path / "proj", "sess-sub")
    main.user("Survey the code base")
    main.call("toolu_task", "Task", {"description": "survey", "subagent_type": "Explore", "prompt": "look"})
    sub = ClaudeSession(tmp_path / "proj", "sess-sub", agent_id="a91f")
    sub.user("look")
    sub.say("Nothing to report.")
    blocked = run_hook("claude-code", sub.stop(), url=server.url, state=state)
    assert blocked.answer is not None and blocked.answer["decision"] == "block"
    rec = records(state)[-1]
    assert (rec["event"], rec["run_id"]) == ("SubagentStop", "sess-sub:a91f")
    sub.bash("toolu_s1", "grep -rn TODO src", "src/a.py:3: TODO")
    sub.bash("toolu_s2", "wc -l src/a.py", "40 src/a.py")
    sub.say("One TODO, in src/a.py.")
    assert run_hook("claude-code", sub.stop(active=True), url=server.url, state=state).answer is None


def test_malformed_transcript_lines_are_skipped_and_counted(
    server: LiveServer, tmp_path: Path, state: Path
) -> None:
    s = ClaudeSession(tmp_path / "proj", "sess-garbage")
    s.user("Clean up")
    s.line("{this is not json")
    s.line('["an", "array"]')
    s.line({"type": "from-a-future-version", "uuid": "z"})
    s.bash("toolu_1", "ls", "a b")
    s.bash("toolu_2", "rm b", "")
    s.say("Cleaned.")
    result = run_hook("claude-code", s.stop(), url=server.url, state=state)
    assert result.rc == 0 and result.answer is None
    lines = records(state)[-1]["lines"]
    assert (lines["malformed"], lines["unknown"]) == (2, 1)


def test_bad_hook_input_fails_open(tmp_path: Path, state: Path) -> None:
    for raw in (
        b"not json",
        b'{"hook_event_name": "Stop"}',
        b'{"hook_event_name": "PostToolUse", "session_id": "s"}',
    ):
        result = run_hook("claude-code", raw, url="http://127.0.0.1:9", state=state)
        assert result.rc == 0 and result.answer is None and "bad hook input" in result.stderr
    assert "session_id" in (state / "hook.log").read_text()


def test_codex_stop_and_loop(server: LiveServer, tmp_path: Path, state: Path) -> None:
    s = CodexSession(tmp_path / "sessions", "019e0000-aaaa-7000-8000-000000000001")
    s.user("add input validation")
    last = s.say("Added validation.")
    blocked = run_hook("codex", s.stop(last), url=server.url, state=state)
    assert blocked.answer is not None and blocked.answer["decision"] == "block"
    answers = []
    first = LoopConfig().repeated_action_error  # the same call failing: a loop at first, nudged,
    n = first + LoopConfig().nudge  # then ended at n
    for i in range(n + 1):
        s.shell_call(f"call_{i}", "cargo test")
        out = s.shell_output(f"call_{i}", 101, "test result: FAILED. 0 passed; 1 failed")
        answers.append(
            run_hook("codex", s.post_tool(f"call_{i}", "cargo test", out), url=server.url, state=state).answer
        )
    assert answers[: first - 1] == [None] * (first - 1)
    for nudged in answers[first - 1 : n - 1]:  # the nudge, then the output unchanged
        assert nudged is not None and nudged["decision"] == "block", answers
        assert "try something different" in nudged["reason"] and "The output, unchanged:" in nudged["reason"]
    ended = answers[n - 1]
    # exit code 101 each time: the same failing call, n times in a row. Codex acts on no
    # `continue: false` from a tool hook: the model is told (the reason replaces the output)
    assert ended is not None and ended["decision"] == "block"
    assert "the same call failed again and again (last: Bash: cargo test)" in ended["reason"]
    assert "Do not call more tools" in ended["reason"]
    assert records(state)[n]["pattern"] == "repeated_action_error"
    # and every further tool call of the turn is refused before it runs
    s.shell_call("call_9", "ls")
    refused = run_hook("codex", s.pre_tool("call_9", "ls"), url=server.url, state=state).answer
    assert refused is not None and refused["hookSpecificOutput"]["permissionDecision"] == "deny"


def test_a_run_the_service_dropped_is_told_apart_from_a_closed_one(tmp_path: Path, state: Path) -> None:
    with LiveServer(log_dir=tmp_path / "logs", no_model=True, env={"STOPSERVE_MAX_RUNS": "1"}) as srv:
        s = ClaudeSession(tmp_path / "proj", "sess-dropped")
        s.user("Fix the typo")
        s.bash("toolu_1", "make check", "ok")
        s.say("Fixed.")
        assert run_hook("claude-code", s.stop(), url=srv.url, state=state).rc == 0
        other = ClaudeSession(tmp_path / "proj2", "sess-other")  # the store holds one run: this one wins
        other.user("Something else")
        other.say("On it.")
        assert run_hook("claude-code", other.stop(), url=srv.url, state=tmp_path / "state2").rc == 0
        s.user("one more thing")
        s.say("Done.")
        dropped = run_hook("claude-code", s.stop(), url=srv.url, state=state)
        assert dropped.rc == 0 and dropped.answer is None  # the agent may stop: fail open
        error = records(state)[-1]["error"]
        assert "run_evicted" in error and "outcome was posted" not in error
        s.say("And now?")
        again = run_hook("claude-code", s.stop(), url=srv.url, state=state)
        assert again.answer is None
        assert records(state)[-1]["error"] == (
            "run closed on the service (the service dropped it (run_evicted)); not asked"
        )


def test_the_shipped_default_lets_a_finished_session_stop(tmp_path: Path, state: Path) -> None:
    """The default model takes no proposed stop as a reason to stop (``proposal: refused``):
    its "continue" is no objection, so the hook lets the agent's own stop stand."""
    with LiveServer(log_dir=tmp_path / "logs") as live:  # the shipped default, no configuration
        s = ClaudeSession(tmp_path / "proj", "sess-default")
        s.user("Fix the crash in app.py")
        s.edit("toolu_e1", "src/app.py")
        s.bash("toolu_t1", "python -m pytest -q", "4 passed in 0.02s")
        s.say("Fixed the crash; the tests pass.")
        stop = run_hook("claude-code", s.stop(), url=live.url, state=state)
    assert stop.rc == 0 and stop.answer is None, stop.stdout
    last = records(state)[-1]
    assert last["event"] == "Stop" and last["outcome"] == "allow"
    assert last["action"] == "continue" and last["proposal"] == "refused"


def test_a_session_has_no_time_budget_unless_the_hook_sets_one(
    server: LiveServer, tmp_path: Path, state: Path
) -> None:
    # begun yesterday afternoon, resumed this morning: five hours on the session's clock
    command = {"command": "pytest -q", "description": "run the tests"}
    response = {"stdout": "3 passed in 0.1s", "stderr": "", "interrupted": False, "isImage": False}

    def session(name: str) -> ClaudeSession:
        s = ClaudeSession(tmp_path / "proj", name)
        s.offset = -5 * 3600.0
        s.user("Add the export command")
        s.edit("toolu_e1", "src/export.py")
        s.offset = 0.0
        s.call("toolu_t1", "Bash", command)
        return s

    s = session("sess-resumed")
    call = s.post_tool("toolu_t1", "Bash", command, response)
    goes_on = run_hook("claude-code", call, url=server.url, state=state)
    assert goes_on.rc == 0 and goes_on.answer is None, goes_on.stderr
    assert records(state)[-1]["action"] == "continue"
    # a team that wants a session's time bounded says so on the hook
    s = session("sess-bounded")
    bounded = ("--safety", '{"max_seconds": 3600}')
    call = s.post_tool("toolu_t1", "Bash", command, response)
    told = run_hook("claude-code", call, url=server.url, state=state, args=bounded)
    assert told.answer is not None and told.answer["decision"] == "block", told.stderr
    last = records(state)[-1]
    assert (last["reason"], last["safety_net"]) == ("budget_exhausted", "max_seconds")


def _labelled_trace(session: str, url: str, state: Path) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        "stopserve",
        "label",
        session,
        "--reward",
        "0",
        "--url",
        url,
        "--state-dir",
        str(state),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    trace_log = done.stdout.split("-> ")[1].split(";")[0]
    (trace,) = [
        t for t in map(json.loads, Path(trace_log).read_text().splitlines()) if t["trace_id"] == session
    ]
    return trace


def test_the_hook_posts_sketches_and_no_sketch_leaves_them_out(
    server: LiveServer, tmp_path: Path, state: Path
) -> None:
    command = {"command": "python manage.py migrate", "description": "migrate"}
    traces = {}
    for flag in ((), ("--no-sketch",)):
        session = f"sess-sketch{len(flag)}"
        s = ClaudeSession(tmp_path / "proj", session)
        s.user("Migrate the database")
        for i in range(3):  # the same failure, at another time, pid, address and line
            response = {"stdout": traceback_at(i), "stderr": "", "interrupted": False, "isImage": False}
            s.call(f"toolu_m{i}", "Bash", command)
            hook_input = s.post_tool(f"toolu_m{i}", "Bash", command, response)
            assert run_hook("claude-code", hook_input, url=server.url, state=state, args=flag).rc == 0
            s.result(f"toolu_m{i}", response)
        traces[flag] = _labelled_trace(session, server.url, state)
    outs = [e for e in traces[()]["events"] if e["type"] == "return"]
    assert len(outs) == 3 and len({e["content_ref"] for e in outs}) == 3  # three different outputs
    assert (
        similar(outs[0]["sketch"], outs[1]["sketch"]) == similar(outs[0]["sketch"], outs[2]["sketch"]) == 1.0
    )
    calls = [e for e in traces[()]["events"] if e["type"] == "tool_use"]
    assert (
        similar(calls[0]["sketch"], calls[1]["sketch"]) == 1.0
        and similar(calls[0]["sketch"], outs[0]["sketch"]) < 0.2
    )
    assert not any("sketch" in e for e in traces[("--no-sketch",)]["events"])


def test_the_hook_posts_what_each_result_shows_about_progress(
    server: LiveServer, tmp_path: Path, state: Path
) -> None:
    failing = (Path(__file__).parents[1] / "signals" / "data" / "tools" / "pytest-q-fail.txt").read_text()
    session = "sess-progress"
    s = ClaudeSession(tmp_path / "proj", session)
    s.user("Fix the calculator")
    edit = {"file_path": "/w/calc.py", "old_string": "a", "new_string": "b"}
    s.call("toolu_e1", "Edit", edit)
    edited = {"filePath": "/w/calc.py", "oldString": "a", "newString": "b"}
    assert (
        run_hook("claude-code", s.post_tool("toolu_e1", "Edit", edit, edited), url=server.url, state=state).rc
        == 0
    )
    s.result("toolu_e1", edited)
    command = {"command": "python -m pytest -q", "description": "run the tests"}
    s.call("toolu_t1", "Bash", command)
    hook_input = s.post_tool_failure("toolu_t1", "Bash", command, "Exit code 1\n" + failing)
    assert run_hook("claude-code", hook_input, url=server.url, state=state).rc == 0
    s.result("toolu_t1", "Exit code 1\n" + failing, error=True)
    events = {e["id"]: e for e in _labelled_trace(session, server.url, state)["events"]}
    assert events["toolu_e1.out"]["progress"] == {"files_changed": 1, "source": "edit_tool"}
    run = events["toolu_t1.out"]["progress"]
    assert (run["tests_passed"], run["tests_failed"], run["exit_code"], run["source"]) == (1, 3, 1, "pytest")
