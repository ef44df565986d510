"""What the real harnesses showed (issue 24), each pinned here without the binaries: the hook
process run as a harness runs it, against a real ``--no-model`` service on loopback.

The live runs themselves are in tests/harness (they need the npm packages)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from _hookkit import ClaudeSession, CodexSession, records, run_hook
from servers import LiveServer

from stopserve.cli import main
from stopserve.hooks.report import report
from stopserve.safety import LoopConfig


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    logs = tmp_path_factory.mktemp("service")
    env = {"STOPSERVE_HOOK_STATE_DIR": str(logs / "hook-state"), "STOPSERVE_SAFETY": '{"min_turns": 2}'}
    with LiveServer(log_dir=logs, no_model=True, env=env) as live:
        yield live


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


def test_codex_a_failing_command_is_a_failure_although_the_hook_sees_only_its_text(
    server: LiveServer, tmp_path: Path, state: Path
) -> None:
    """Item 4: Codex's PostToolUse has the bare output; the exit code is in the rollout's
    item_completed event, written before the hook runs (the output line only after it)."""
    s = CodexSession(tmp_path / "sessions", "019e0000-bbbb-7000-8000-000000000004")
    s.user("read the config")
    for i in range(LoopConfig().repeated_action_error + LoopConfig().nudge):  # past the nudges
        s.shell_call(f"call_{i}", "cat /nonexistent/config.yaml")
        body = s.command_done(f"call_{i}", 1, "cat: /nonexistent/config.yaml: No such file or directory\n")
        answer = run_hook(
            "codex",
            s.post_tool(f"call_{i}", "cat /nonexistent/config.yaml", body),
            url=server.url,
            state=state,
        ).answer
        s.shell_output(f"call_{i}", 1, body)  # the rollout's copy, after the hook
    assert answer is not None
    rec = records(state)[-1]
    assert rec["pattern"] == "repeated_action_error", rec  # failed, not "returned the same output"
    assert "failed again and again" in answer["reason"]


def test_a_result_seen_again_keeps_the_facts_of_its_call(
    server: LiveServer, tmp_path: Path, state: Path
) -> None:
    """Item 5: a result the hook sent, repeated by the transcript, no longer overwrites the facts
    (the reason read "the last tool call failed (: Exit code 1)")."""
    s = ClaudeSession(tmp_path / "proj", "sess-facts")
    s.user("read the config")
    command = {"command": "cat /nonexistent/config.yaml", "description": "read it"}
    s.call("toolu_f1", "Bash", command)
    error = "Exit code 1\ncat: /nonexistent/config.yaml: No such file or directory"
    run_hook(
        "claude-code", s.post_tool_failure("toolu_f1", "Bash", command, error), url=server.url, state=state
    )
    s.result("toolu_f1", "Error: " + error, error=True)  # the transcript's copy, read by the next call
    s.say("Done.")
    go_on = ("--safety", '{"min_turns": 50}')
    blocked = run_hook("claude-code", s.stop(), url=server.url, state=state, args=go_on).answer
    assert blocked is not None and blocked["decision"] == "block"
    assert "the last tool call failed (cat /nonexistent/config.yaml: Exit code 1)" in blocked["reason"]
    assert "(: " not in blocked["reason"]


def test_a_min_turns_veto_says_so_not_the_model_numbers(
    server: LiveServer, tmp_path: Path, state: Path
) -> None:
    """Item 6: the veto's reason named the model's numbers, which argue for stopping."""
    from stopserve.hooks.reason import block_reason
    from stopserve.importers._transcript import Facts

    vetoed = {"action": "continue", "turn": 1, "v_stop": -0.06, "q_continue": 0.18, "q_stop": 0.24}
    text = block_reason(vetoed, Facts(), blocks_left=1, safety={"min_turns": 2})
    assert "quality" not in text and "after only 1 step, before the minimum (2)" in text
    s = ClaudeSession(tmp_path / "proj", "sess-veto")
    s.user("hi")
    s.say("Hello.")
    live = run_hook("claude-code", s.stop(), url=server.url, state=state).answer
    assert live is not None and "before the minimum" in live["reason"]


def test_a_call_cut_by_the_deadline_is_logged_with_its_run(tmp_path: Path, state: Path) -> None:
    """Item 7: the log read "claude-code ? run=? -> error" and nothing reached decisions.jsonl."""
    with socket.socket() as sink:
        sink.bind(("127.0.0.1", 0))
        sink.listen(8)
        s = ClaudeSession(tmp_path / "proj", "sess-deadline")
        s.user("hi")
        s.say("Hello.")
        url = f"http://127.0.0.1:{sink.getsockname()[1]}"
        run_hook("claude-code", s.stop(), url=url, state=state, args=("--timeout", "0.3"))
    (rec,) = records(state)
    assert rec["run_id"] == "sess-deadline" and rec["event"] == "Stop" and rec["outcome"] == "failed open"
    assert "run=sess-deadline" in (state / "hook.log").read_text()


def test_the_report_counts_ended_turns_by_effect() -> None:
    """Item 7: "runs ended: 28" for a run that never ended (28 answers, none acted on)."""
    base = {"session_id": "s", "run_id": "s", "mode": "enforce", "turn_key": "p1"}
    ignored = [{**base, "event": "PostToolUseFailure", "would_end": True, "outcome": "end"}] * 28
    n = report(ignored, {})
    assert (n["would_end"], n["end_turns"], n["ended"], n["went_on"], n["calls_after_end"]) == (
        28,
        1,
        0,
        1,
        27,
    )
    honoured = [
        {**base, "event": "PostToolUse", "would_end": True, "outcome": "end"},
        {**base, "event": "PreToolUse", "would_end": True, "outcome": "refuse (run ended this turn)"},
        {**base, "event": "Stop", "outcome": "allow (run ended this turn)"},
    ]
    n = report(honoured, {})
    assert (n["end_turns"], n["ended"], n["went_on"]) == (1, 1, 0)


@pytest.mark.parametrize(
    "bad",
    [
        ("--safety", '{"min_turns": 2,}'),
        ("--safety", "@/missing/safety.json"),
        ("--max-blocks", "abc"),
        ("--no-such-option",),
    ],
)
def test_a_bad_argument_never_exits_2(bad: tuple[str, ...], tmp_path: Path, state: Path) -> None:
    """Item 9: both harnesses read exit 2 as "block"; the hook exits 0 and says why."""
    s = ClaudeSession(tmp_path / "proj", "sess-args")
    s.user("hi")
    s.say("Hello.")
    result = run_hook("claude-code", s.stop(), url="http://127.0.0.1:9", state=state, args=bad)
    assert result.rc == 0 and result.answer is None
    assert "lets the agent go on" in result.stderr
    (rec,) = records(state)
    assert rec["outcome"] == "failed open" and "bad arguments" in rec["error"]


def test_install_checks_the_options_it_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 9: hook install takes --safety, --lambda, --timeout, and refuses a bad one at once."""
    project = str(tmp_path)
    assert main(["hook", "install", "claude-code", "--project", project, "--safety", '{"min_turnz": 2}']) == 2
    assert "min_turnz" in capsys.readouterr().err and not (tmp_path / ".claude").exists()
    args = ["--safety", '{"min_turns": 2}', "--lambda", "0.5", "--timeout", "1.5"]
    assert main(["hook", "install", "claude-code", "--project", project, *args]) == 0
    data = json.loads((tmp_path / ".claude" / "settings.json").read_text())
    (handler,) = data["hooks"]["Stop"][0]["hooks"]
    assert (
        """--safety '{"min_turns":2}' """ in handler["command"] + " " and "--lambda 0.5" in handler["command"]
    )
    assert "--timeout 1.5" in handler["command"] and handler["timeout"] == 5
    assert set(data["hooks"]) == {"Stop", "SubagentStop", "PreToolUse", "PostToolUse", "PostToolUseFailure"}


def _post(url: str, payload: dict[str, object], query: str = "") -> httpx.Response:
    return httpx.post(f"{url}/v1/hooks/claude-code{query}", json=payload, timeout=10)


def test_the_http_hook_gives_the_command_hooks_answers(server: LiveServer, tmp_path: Path) -> None:
    s = ClaudeSession(tmp_path / "proj", "sess-http")
    s.user("Fix the crash")
    s.say("Done.")
    blocked = _post(server.url, s.stop())
    assert blocked.status_code == 200 and blocked.json()["decision"] == "block"
    assert "no tool was used yet" in blocked.json()["reason"]
    command = {"command": "echo same", "description": "again"}
    answers = []
    for i in range(LoopConfig().repeated_action_observation + LoopConfig().nudge):  # past the nudges
        s.call(f"toolu_h{i}", "Bash", command)
        answers.append(
            _post(server.url, s.post_tool(f"toolu_h{i}", "Bash", command, {"stdout": "same"})).json()
        )
    assert answers[:2] == [{}, {}] and any(a.get("decision") == "block" for a in answers)
    s.call("toolu_h9", "Bash", command)
    ended = _post(server.url, s.pre_tool("toolu_h9", "Bash", command)).json()
    assert ended["continue"] is False and ended["systemMessage"].startswith("stopserve ended the run")
    state = Path(server.env["STOPSERVE_HOOK_STATE_DIR"])
    mine = [r for r in records(state) if r.get("session_id") == "sess-http"]
    assert mine and all(r["via"] == "http" for r in mine)
    # shadow mode from the URL's query: decided and logged, never blocked
    shadow = _post(server.url, ClaudeSession(tmp_path / "p2", "sess-http-shadow").stop(), "?mode=shadow")
    assert shadow.json() == {}


def test_the_http_hook_without_the_transcript_decides_from_the_input(
    server: LiveServer, tmp_path: Path
) -> None:
    """A service that cannot read the user's transcript (another machine, a container)."""
    payload = {
        "session_id": "sess-no-transcript",
        "transcript_path": str(tmp_path / "elsewhere" / "missing.jsonl"),
        "cwd": "/nowhere",
        "permission_mode": "default",
        "prompt_id": "p1",
        "hook_event_name": "PostToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": "echo same"},
        "tool_response": {"stdout": "same", "stderr": ""},
    }
    n = LoopConfig().repeated_action_observation + LoopConfig().nudge  # past the nudges
    answers = [_post(server.url, {**payload, "tool_use_id": f"t{i}"}).json() for i in range(n)]
    assert any(a.get("decision") == "block" for a in answers)  # the loop is still seen
    state = Path(server.env["STOPSERVE_HOOK_STATE_DIR"])
    mine = [r for r in records(state) if r.get("session_id") == "sess-no-transcript"]
    assert mine and all(r.get("transcript") == "unread" for r in mine)


def test_the_http_hook_refuses_a_bad_query_or_input_by_name(server: LiveServer) -> None:
    bad = _post(server.url, {"hook_event_name": "Stop", "session_id": "s"}, "?mode=loud")
    assert bad.status_code == 422 and "query.mode" in bad.text
    worse = httpx.post(f"{server.url}/v1/hooks/claude-code", content=b"not json", timeout=10)
    assert worse.status_code == 422 and "not JSON" in worse.text


def test_the_http_hook_answers_within_its_time_when_a_run_is_locked(
    server: LiveServer, tmp_path: Path
) -> None:
    """The service's hook core waits for a run's lock no longer than the hook's time budget."""
    from stopserve.hooks.state import StateDir

    state = StateDir(Path(server.env["STOPSERVE_HOOK_STATE_DIR"]))
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with state.lock("sess-locked", time.monotonic() + 10):
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    try:
        start = time.monotonic()
        answer = _post(server.url, ClaudeSession(tmp_path / "p", "sess-locked").stop(), "?timeout=0.3")
        assert answer.status_code == 200 and answer.json() == {} and time.monotonic() - start < 3
    finally:
        release.set()
        t.join(5)


@pytest.mark.parametrize("harness", ["claude-code", "codex"])
def test_the_hook_s_own_parser_reads_what_the_full_one_does(harness: str) -> None:
    from stopserve.cli import build_parser
    from stopserve.cli.hooks import hook_parser

    argv = ["--url", "http://h:1", "--mode", "shadow", "--timeout", "1.5", "--max-blocks", "1"]
    argv += ["--lambda", "0.2", "--safety", '{"min_turns": 2}', "--end-on-model-stop", "--state-dir", "/s"]
    for extra in ([], argv):
        full = vars(build_parser().parse_args(["hook", harness, *extra]))
        fast = vars(hook_parser(harness).parse_args(extra))
        assert fast == full


def test_a_failed_call_hashes_the_same_in_the_hook_and_in_the_transcript(tmp_path: Path) -> None:
    """Item 8: PostToolUseFailure's ``error`` lacks the "Error: " of the transcript's toolUseResult."""
    from stopserve.hooks.protocol import parse_input
    from stopserve.importers._transcript import map_file
    from stopserve.importers.claude_code import ClaudeCodeMapper

    s = ClaudeSession(tmp_path / "proj", "sess-hash")
    s.user("read it")
    command = {"command": "cat /nonexistent/config.yaml", "description": "read it"}
    s.call("toolu_x", "Bash", command)
    error = "Exit code 1\ncat: /nonexistent/config.yaml: No such file or directory"
    s.result("toolu_x", "Error: " + error, error=True)  # as Claude Code 2.1.328 writes it
    imported = [e for e in map_file(s.path, ClaudeCodeMapper()) if e["id"] == "toolu_x.out"]
    inp = parse_input(
        json.dumps(s.post_tool_failure("toolu_x", "Bash", command, error)).encode(), "claude-code"
    )
    live = ClaudeCodeMapper()
    live.tool_event("toolu_x", "Bash", inp.tool_input, inp.tool_response, time.time(), error=True)
    hooked = [e for e in live.drain() if e["id"] == "toolu_x.out"]
    assert hooked[0]["content_ref"] == imported[0]["content_ref"] and hooked[0]["error"] is True
