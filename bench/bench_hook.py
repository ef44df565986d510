"""Hook cost: what one stopserve hook call costs the harness, against bare Python, in the same run.

``python bench/bench_hook.py [--size tiny|quick|full] [--out F.json]`` measures, against a
real ``stopserve serve --no-model`` on loopback:

Standalone (rounds interleaved, median and p90 over the rounds):

- ``python -c pass``: the interpreter alone, the command hook's baseline;
- the command hook: ``python -m stopserve hook claude-code`` as a fresh process with a
  ``PostToolUse`` input, the transcript growing by two lines a call;
- the command hook with ``--no-sketch``: the same call without sketching the texts (what the
  sketches cost the hook: their import and their computation);
- the HTTP hook: one ``POST /v1/hooks/claude-code`` with the same input (a new loopback
  connection each time, as a harness without keep-alive pays it);
- for reference, the imports of the hook's path and of ``stopserve.client``.

Inside a real harness run (Claude Code, the binary ``tests/harness`` uses, when installed):
one scripted run per hook kind, each tool call different (no loop), with the hook on
``PostToolUse``; each call's time as Claude Code itself logs it (``--debug-file``: a command
hook's "finished ... (N ms)", an HTTP hook's POST to response). A ``python -c pass`` hook in
the same runs is the baseline.

Targets (issue 24): HTTP hook p50 <= 10 ms; command hook p50 <= 2x ``python -c pass``.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from _common import ROOT, Section, Target, parser, percentile

sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "harness"))

from servers import LiveServer

ENV = {k: v for k, v in os.environ.items() if not k.startswith("STOPSERVE_")}
ROUNDS = {"tiny": 5, "quick": 15, "full": 40}
HARNESS_CALLS = {"tiny": 3, "quick": 10, "full": 25}


def _wall(argv: list[str], stdin: bytes = b"") -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, input=stdin, capture_output=True, env=ENV, check=True, cwd=ROOT)
    return (time.perf_counter() - t0) * 1000


def _post(url: str, body: bytes) -> float:
    host, port = url.removeprefix("http://").split(":")
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", "/v1/hooks/claude-code", body=body, headers={"content-type": "application/json"})
    response = conn.getresponse()
    response.read()
    conn.close()
    ms = (time.perf_counter() - t0) * 1000
    assert response.status == 200, response.status
    return ms


def _summary(ms: list[float]) -> dict[str, float]:
    return {"n": len(ms), "p50": statistics.median(ms), "p90": percentile(ms, 90)} if ms else {"n": 0}


def standalone(rounds: int, srv: LiveServer, tmp: Path) -> dict[str, dict[str, float]]:
    py = sys.executable
    cases: dict[str, list[float]] = {
        "python -c pass": [],
        "command hook": [],
        "command hook --no-sketch": [],
        "HTTP hook": [],
        "hook imports": [],
        "client imports": [],
    }
    for kind in ("command", "plain", "http"):
        (tmp / f"{kind}.jsonl").write_text("")
    state = tmp / "state"
    hook = [py, "-m", "stopserve", "hook", "claude-code", "--url", srv.url, "--state-dir", str(state)]
    plain = [*hook, "--no-sketch"]  # the same call without sketching the texts
    for i in range(rounds):
        payloads = {}
        for kind in ("command", "plain", "http"):
            transcript = tmp / f"{kind}.jsonl"
            call_id = f"toolu_{kind}_{i}"
            block = {"type": "tool_use", "id": call_id, "name": "Bash", "input": {"command": f"echo {i}"}}
            message = {"id": f"m{i}", "role": "assistant", "content": [block], "usage": {"output_tokens": 5}}
            line = {
                "type": "assistant",
                "uuid": f"a{kind}{i}",
                "timestamp": "2026-05-01T10:00:00Z",
                "message": message,
            }
            with transcript.open("a") as fh:
                fh.write(json.dumps(line) + "\n")
            payloads[kind] = json.dumps(
                {
                    "session_id": f"bench-{kind}",
                    "transcript_path": str(transcript),
                    "cwd": str(tmp),
                    "permission_mode": "default",
                    "prompt_id": "p1",
                    "hook_event_name": "PostToolUse",
                    "tool_name": "Bash",
                    "tool_input": {"command": f"echo {i}"},
                    "tool_use_id": call_id,
                    "tool_response": {"stdout": str(i), "stderr": "", "interrupted": False, "isImage": False},
                }
            ).encode()
        cases["python -c pass"].append(_wall([py, "-c", "pass"]))
        cases["command hook"].append(_wall(hook, payloads["command"]))
        cases["command hook --no-sketch"].append(_wall(plain, payloads["plain"]))
        cases["HTTP hook"].append(_post(srv.url, payloads["http"]))
        cases["hook imports"].append(
            _wall(
                [
                    py,
                    "-c",
                    "import stopserve.hooks.run, stopserve.importers.claude_code, stopserve.hooks.reason",
                ]
            )
        )
        cases["client imports"].append(_wall([py, "-c", "import stopserve.client"]))
    return {name: _summary(ms) for name, ms in cases.items()}


_CMD_DONE = re.compile(
    r"Hooks: PostToolUse:Bash \[(?P<cmd>[^\]]*)\] finished with status \d+ \((?P<ms>\d+)ms\)"
)
_STAMP = re.compile(r"^(\S+Z) \[DEBUG\] Hooks: (HTTP hook POST to|HTTP hook response status)")


def _from_debug_log(log: str) -> dict[str, list[float]]:
    """Each PostToolUse hook's time as Claude Code logged it: command hooks by command, HTTP hooks."""
    out: dict[str, list[float]] = {"command hook": [], "python -c pass": [], "HTTP hook": []}
    for m in _CMD_DONE.finditer(log):
        key = (
            "command hook"
            if "stopserve hook" in m["cmd"]
            else "python -c pass"
            if "-c pass" in m["cmd"]
            else ""
        )
        if key:
            out[key].append(float(m["ms"]))
    start: datetime | None = None
    for line in log.splitlines():
        m = _STAMP.match(line)
        if not m:
            continue
        ts = datetime.fromisoformat(m[1].replace("Z", "+00:00"))
        if m[2] == "HTTP hook POST to":
            start = ts
        elif start is not None:
            out["HTTP hook"].append((ts - start).total_seconds() * 1000)
            start = None
    return out


def in_harness(calls: int, srv: LiveServer, tmp: Path) -> dict[str, dict[str, float]] | str:
    """Per-call hook times inside real Claude Code runs, or why there are none."""
    from harnesses import binary, run_claude
    from scripted import Say, Step, Tool, View

    if binary("claude") is None:
        return "Claude Code not installed (tests/harness/package.json; .ci/run installs it)"

    def script(view: View) -> Step:
        if len(view.results) >= calls:
            return Say("Done.")
        return Tool("Bash", {"command": f"echo call {len(view.results)}", "description": "step"})

    found: dict[str, list[float]] = {"command hook": [], "python -c pass": [], "HTTP hook": []}
    baseline = {"type": "command", "command": f"{sys.executable} -c pass", "timeout": 5}
    for kind in ("command", "http"):
        home = tmp / f"harness-{kind}"
        # the baseline hook beside ours on the same event, in the same run
        settings = {"hooks": {"PostToolUse": [{"hooks": [baseline]}]}}
        extra = ["--http"] if kind == "http" else ["--state-dir", str(home / "state")]
        run = run_claude(home, script, settings=settings, install=["--url", srv.url, *extra])
        if run.rc != 0:
            return f"the Claude Code run failed ({run.rc}): {run.stderr[-500:]}"
        for key, ms in _from_debug_log((home / "claude-debug.log").read_text(errors="replace")).items():
            found[key] += ms
    return {name: _summary(ms) for name, ms in found.items()}


def main() -> None:
    args = parser(__doc__.split("\n")[0]).parse_args()
    sec = Section(
        "Hook: one stopserve hook call, command and HTTP, standalone and inside Claude Code", sys.argv
    )
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        logs = tmp / "logs"
        env = {"STOPSERVE_HOOK_STATE_DIR": str(tmp / "service-hook-state")}
        with LiveServer(log_dir=logs, no_model=True, env=env) as srv:
            alone = standalone(ROUNDS[args.size], srv, tmp)
            inside = in_harness(HARNESS_CALLS[args.size], srv, tmp)
    sec.data = {"standalone": alone, "in_harness": inside if isinstance(inside, dict) else None}
    base = alone["python -c pass"]["p50"]
    sec.add(
        f"Standalone: {ROUNDS[args.size]} rounds, interleaved, each case a fresh process (the HTTP hook: "
        "a fresh loopback connection) against a live `stopserve serve --no-model`.",
        "",
    )
    rows: list[list[Any]] = [[name, s["p50"], s["p90"], s["p50"] / base] for name, s in alone.items()]
    sec.table(["case", "p50 ms", "p90 ms", "p50 / python -c pass"], rows)
    cmd_ratio = alone["command hook"]["p50"] / base
    sec.targets.append(
        Target(
            "HTTP hook p50, standalone",
            f"{alone['HTTP hook']['p50']:.1f} ms",
            "<= 10 ms",
            alone["HTTP hook"]["p50"] <= 10,
        )
    )
    sec.targets.append(
        Target("command hook p50 / python -c pass, standalone", f"{cmd_ratio:.2f}x", "<= 2x", cmd_ratio <= 2)
    )
    if isinstance(inside, dict):
        sec.add(
            f"Inside Claude Code ({HARNESS_CALLS[args.size]} tool calls a run, one run per hook kind, "
            "each call's time from Claude Code's own debug log, a `python -c pass` hook beside ours as the "
            "baseline):",
            "",
        )
        hbase = inside["python -c pass"].get("p50") or float("nan")
        sec.table(
            ["case", "calls", "p50 ms", "p90 ms", "p50 / python -c pass"],
            [
                [n, s["n"], s.get("p50"), s.get("p90"), (s.get("p50") or float("nan")) / hbase]
                for n, s in inside.items()
            ],
        )
        http50 = inside["HTTP hook"].get("p50")
        ratio = (inside["command hook"].get("p50") or float("nan")) / hbase
        sec.targets.append(
            Target(
                "HTTP hook p50, inside Claude Code",
                f"{http50:.1f} ms" if http50 is not None else "-",
                "<= 10 ms",
                None if http50 is None else http50 <= 10,
            )
        )
        sec.targets.append(
            Target(
                "command hook p50 / python -c pass, inside Claude Code", f"{ratio:.2f}x", "<= 2x", ratio <= 2
            )
        )
    else:
        sec.skip(f"inside a harness: {inside}")
    sec.emit(args.out)


if __name__ == "__main__":
    main()
