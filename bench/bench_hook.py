"""Hook process cost: what one ``stopserve hook`` call costs the harness, against bare Python.

``python bench/bench_hook.py [--n 30]`` times, each as a fresh process, interleaved, median
of ``n`` rounds:

- ``python -c pass``: the interpreter alone (the baseline every ratio is against);
- importing the hook's path (``stopserve.hooks.run`` and the Claude Code mapper);
- importing ``stopserve.client`` (what a hook built on the Python client would pay: pydantic, numpy, httpx);
- a whole hook call, ``python -m stopserve hook claude-code`` with a ``PostToolUse`` input,
  against a real ``stopserve serve --no-model`` on loopback, the transcript growing by two
  lines per call;

and reports each one's self time from ``-X importtime`` for the two import cases.
Prints a markdown table (milliseconds, ratio to the baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from servers import LiveServer  # noqa: E402

ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("STOPSERVE_")}, "PYTHONPATH": str(ROOT)}


def wall(argv: list[str], stdin: bytes = b"") -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, input=stdin, capture_output=True, env=ENV, check=True, cwd=ROOT)
    return (time.perf_counter() - t0) * 1000


def import_ms(module: str) -> float:
    """Cumulative import time of ``module`` (ms), from ``-X importtime``."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        capture_output=True,
        text=True,
        env=ENV,
        check=True,
    )
    for line in proc.stderr.splitlines():
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[2] == module:
            return int(parts[1]) / 1000
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=30, help="rounds")
    args = ap.parse_args()
    py = sys.executable
    cases: dict[str, list[float]] = {"bare": [], "hook imports": [], "client imports": [], "hook call": []}
    with tempfile.TemporaryDirectory() as tmp, LiveServer(log_dir=Path(tmp) / "logs", no_model=True) as srv:
        transcript = Path(tmp) / "s.jsonl"
        transcript.write_text("")
        state = Path(tmp) / "state"
        hook = [py, "-m", "stopserve", "hook", "claude-code", "--url", srv.url, "--state-dir", str(state)]
        for i in range(args.n):
            call_id = f"toolu_{i}"
            block = {"type": "tool_use", "id": call_id, "name": "Bash", "input": {"command": f"echo {i}"}}
            message = {"id": f"m{i}", "role": "assistant", "content": [block], "usage": {"output_tokens": 5}}
            line = {
                "type": "assistant",
                "uuid": f"a{i}",
                "timestamp": "2026-05-01T10:00:00Z",
                "message": message,
            }
            with transcript.open("a") as fh:
                fh.write(json.dumps(line) + "\n")
            payload = {
                "session_id": "bench",
                "transcript_path": str(transcript),
                "hook_event_name": "PostToolUse",
                "tool_name": "Bash",
                "tool_input": {"command": f"echo {i}"},
                "tool_use_id": call_id,
                "tool_response": {"stdout": str(i), "stderr": "", "interrupted": False, "isImage": False},
            }
            cases["bare"].append(wall([py, "-c", "pass"]))
            cases["hook imports"].append(
                wall(
                    [
                        py,
                        "-c",
                        "import stopserve.hooks.run, stopserve.importers.claude_code, stopserve.hooks.reason",
                    ]
                )
            )
            cases["client imports"].append(wall([py, "-c", "import stopserve.client"]))
            cases["hook call"].append(wall(hook, json.dumps(payload).encode()))
    base = statistics.median(cases["bare"])
    print(f"{args.n} rounds, interleaved; each a fresh `{Path(py).name}` process; median wall time.\n")
    print("| case | median ms | ratio to bare python | import time (-X importtime) |")
    print("|---|---|---|---|")
    imports = {
        "hook imports": import_ms("stopserve.hooks.run"),
        "client imports": import_ms("stopserve.client"),
    }
    for name, ms in cases.items():
        med = statistics.median(ms)
        imp = f"{imports[name]:.1f} ms" if name in imports else "-"
        print(f"| {name} | {med:.1f} | {med / base:.2f} | {imp} |")


if __name__ == "__main__":
    main()
