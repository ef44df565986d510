"""``stopserve hook report --html``: the report's views of a hook's own log (real hook calls)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hooks._hookkit import ClaudeSession, run_hook
from servers import LiveServer

from stopserve.safety import LoopConfig


def test_hook_report_html_shows_sessions_blocks_and_the_loop_a_tool_hook_ended(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with LiveServer(log_dir=tmp_path / "logs", no_model=True) as server:
        s = ClaudeSession(tmp_path / "proj", "sess-loop")
        s.user("Make the tests pass")
        command = {"command": "pytest -x tests/test_io.py", "description": "run the failing test"}
        response = {"stdout": "1 failed", "stderr": "", "interrupted": False, "isImage": False}
        for i in range(LoopConfig().repeated_action_observation + LoopConfig().nudge):  # past the nudges
            s.call(f"toolu_{i}", "Bash", command)
            call = s.post_tool(f"toolu_{i}", "Bash", command, response)
            run_hook("claude-code", call, url=server.url, state=state)
            s.result(f"toolu_{i}", response)
        s.say("I could not fix it.")
        run_hook("claude-code", s.stop(), url=server.url, state=state)
    out = tmp_path / "hook.html"
    done = subprocess.run(
        [sys.executable, "-m", "stopserve", "hook", "report", "--state-dir", str(state), "--html", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    html = out.read_text()
    assert "<title>stopserve hook report</title>" in html
    assert 'id="hook-sessions">1<' in html
    assert 'id="n-runs">1<' in html and 'id="n-loops">1<' in html
    assert "repeated_action_observation" in html
    assert "PostToolUse -\\u003e end" in html  # the timeline's note (its JSON escapes ">")
