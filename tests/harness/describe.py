"""What each live scenario does in each real harness, as a table: ``python tests/harness/describe.py``.

The same scenarios as the tests in this folder (same scripted models, same services), run
once each and described: the tool calls the model asked for and how many ran, the hook's
answers in order, how the run ended, and what the user was shown. Needs the pinned
binaries (see harnesses.py). Prints markdown.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from harnesses import HarnessRun, binary, hook_records, run_claude, run_codex  # noqa: E402
from scenarios import FAILING, SUCCEEDING, finished, hung_port, loop, subagent, verify_then_stop  # noqa: E402
from servers import LiveServer, free_port  # noqa: E402


def _outcomes(records: list[dict[str, Any]]) -> str:
    short = {
        "continue": "ok",
        "allow": "allow",
        "block": "BLOCK",
        "end": "END",
        "refuse (run ended this turn)": "refuse",
        "allow (run ended this turn)": "allow(ended)",
        "failed open": "failed-open",
    }
    parts = [f"{r.get('event', '?')}:{short.get(str(r.get('outcome')), r.get('outcome'))}" for r in records]
    return " ".join(p.replace("PostToolUseFailure", "PostFail").replace("ToolUse", "") for p in parts)


def _ended(run: HarnessRun) -> str:
    result = [e for e in run.events if e.get("type") == "result"]
    if result:
        r = result[-1]
        return f"{r.get('terminal_reason')} ({r.get('subtype')}), result: {str(r.get('result'))[:60]!r}"
    said = [e["item"]["text"] for e in run.events if e.get("item", {}).get("type") == "agent_message"]
    done = any(e.get("type") == "turn.completed" for e in run.events)
    return f"{'turn.completed' if done else 'no turn.completed'}, last message: {(said or [''])[-1][:60]!r}"


def _shown(run: HarnessRun) -> str:
    lines = [m for m in run.user_messages() if "stopserve" in m]
    if not lines:
        return "-"
    text = lines[0].split("error=", 1)[-1]
    return f"{text[:110]}…" + (f" (x{len(lines)})" if len(lines) > 1 else "")


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="describe-"))
    rows: list[list[str]] = []
    with (
        LiveServer(
            log_dir=tmp / "svc", no_model=True, env={"STOPSERVE_HOOK_STATE_DIR": str(tmp / "hs")}
        ) as svc,
        LiveServer(
            log_dir=tmp / "strict",
            no_model=True,
            env={"STOPSERVE_SAFETY": '{"min_turns": 3}', "STOPSERVE_HOOK_STATE_DIR": str(tmp / "hs2")},
        ) as strict,
        hung_port() as hung,
    ):
        down = f"http://127.0.0.1:{free_port()}"
        scenarios: list[tuple[str, Callable[..., Any], str, list[str]]] = [
            ("loop, failing command", loop(FAILING), svc.url, []),
            ("loop, succeeding command", loop(SUCCEEDING), svc.url, []),
            ("finished run", finished, svc.url, []),
            ("edit then stop, min_turns 3", verify_then_stop, strict.url, []),
            ("sub-agent", subagent, svc.url, []),
            ("service down", finished, down, []),
            ("service hung", finished, f"http://127.0.0.1:{hung}", []),
            ("HTTP hooks, failing loop", loop(FAILING), svc.url, ["--http"]),
        ]
        for harness, runner in (("Claude Code", run_claude), ("Codex CLI", run_codex)):
            if binary("claude" if harness == "Claude Code" else "codex") is None:
                print(f"{harness}: not installed", file=sys.stderr)
                continue
            for i, (name, script, url, extra) in enumerate(scenarios):
                if harness == "Codex CLI" and (name == "sub-agent" or "HTTP" in name):
                    continue
                home = tmp / f"{harness[:5]}-{i}"
                state = home / "state"
                args = ["--url", url, *extra] + ([] if extra else ["--state-dir", str(state)])
                run = runner(home, script, install=args)
                records = hook_records(state if not extra else Path(svc.env["STOPSERVE_HOOK_STATE_DIR"]))
                ran = sum(1 for r in records if r.get("event") in ("PostToolUse", "PostToolUseFailure"))
                slowest = max((float(r.get("ms", 0)) for r in records), default=0.0)
                rows.append(
                    [
                        harness,
                        name,
                        f"{run.tool_calls()} asked, {ran} ran",
                        _outcomes(records),
                        _ended(run),
                        _shown(run),
                        f"{run.seconds:.1f} s (slowest hook {slowest:.0f} ms)",
                    ]
                )
    head = [
        "harness",
        "scenario",
        "tool calls",
        "hook answers, in order",
        "how the run ended",
        "the user saw",
    ]
    print("| " + " | ".join([*head, "time"]) + " |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in row) + " |")


if __name__ == "__main__":
    main()
