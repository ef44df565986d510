"""Serving: decide throughput and latency under wrk, against a bare FastAPI endpoint.

Every server is started the same way (``python -m uvicorn --factory``, one worker, same
loop/http/log flags) and all of them run side by side for the whole benchmark; wrk
visits them in turn at each concurrency, so each ratio compares measurements taken
seconds apart. Servers: a raw ASGI static responder (ceiling of uvicorn; shows wrk is
not the bottleneck), two bare FastAPI routes with the same path and body, one taking a
``dict`` and one declaring the body as ``stopserve.api.DecideRequest`` (the model stopserve
parses, so event validation is in both: the baseline the targets use), and stopserve with
the decision log off, on with fsync 'interval', and on with fsync 'always'. Targets:
throughput >= 0.8x bare (typed), p99 <= 1.5x bare (typed).

One contender is not shipped: the ASGI fast path the service answered decide calls with
before issue 16 (``fastpath_app`` in ``_apps.py``), run with fsync 'interval' beside the
shipped routes so the section says, from the same run, what the plain routes cost.

``--baseline-code DIR`` serves another commit's code (``git archive C stopserve bench models |
tar -x -C DIR``) as one more server, with fsync 'interval', so a change is measured before and
after in the same run.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import BENCH, ROOT, Section, Target, details, load, parser
from _model import model_dir

THROUGHPUT_RATIO = 0.8
P99_RATIO = 1.5
RUN_LEN = 20
UVICORN_FLAGS = [
    "--host", "127.0.0.1", "--workers", "1", "--loop", "uvloop", "--http", "httptools",
    "--no-access-log", "--log-level", "warning", "--app-dir", str(BENCH), "--factory",
]  # fmt: skip


def ensure_wrk() -> str | None:
    """Path of wrk, installing the Debian package when missing and possible."""
    found = shutil.which("wrk")
    if found:
        return found
    if shutil.which("apt-get") and os.geteuid() == 0:
        print("installing wrk (apt-get install -y wrk)", file=sys.stderr)
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "wrk"], capture_output=True, check=False, timeout=300
        )
    return shutil.which("wrk")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def probe_body(run_id: str) -> bytes:
    """The same body shape decide.lua sends (first request of a run)."""
    events = [
        {"id": "u0", "t": 0.0, "type": "tool_use", "agent": "coder", "tool": "bash", "tokens": 900,
         "usd": 0.001, "content_ref": f"c{run_id}-0"},
        {"id": "r0", "t": 0.5, "type": "return", "agent": "coder", "to": "orchestrator", "tokens": 200,
         "usd": 0.0004, "content_ref": f"o{run_id}-0"},
    ]  # fmt: skip
    return json.dumps({"events": events}).encode()


@dataclass
class Server:
    """One uvicorn process serving ``factory`` on a loopback port."""

    name: str
    factory: str
    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path | None = None
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    error: str | None = None
    probe: dict[str, Any] | None = None
    argv: list[str] | None = None  # a whole command line instead of uvicorn + factory ("{port}" filled in)
    code: Path = ROOT  # the checkout whose stopserve and bench/_apps.py the server runs

    def start(self, workdir: Path) -> None:
        self.port = free_port()
        env = {**os.environ, **self.env, "PYTHONPATH": str(self.code)}
        self._err = (workdir / f"{self.name.replace(' ', '_')}.stderr").open("wb")
        flags = [*UVICORN_FLAGS]
        flags[flags.index("--app-dir") + 1] = str(self.code / "bench")
        cmd = [sys.executable, "-m", "uvicorn", self.factory, "--port", str(self.port), *flags]
        if self.argv is not None:
            cmd = [a.replace("{port}", str(self.port)) for a in self.argv]
        self.proc = subprocess.Popen(
            cmd,
            cwd=self.code,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self._err,
        )

    def wait_ready(self, timeout: float = 90.0) -> bool:
        """POST one real decide body until it answers 200 (model loaded, route works)."""
        assert self.proc is not None
        url = f"http://127.0.0.1:{self.port}/v1/runs/probe-{self.port}/decide"
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.error = f"exited with code {self.proc.returncode}: {self.stderr_tail()}"
                return False
            req = urllib.request.Request(
                url, data=probe_body(f"probe{self.port}"), headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=5) as resp:
                    self.probe = json.loads(resp.read())
                    return True
            except urllib.error.HTTPError as exc:
                self.error = f"probe answered HTTP {exc.code}: {exc.read()[:500].decode(errors='replace')}"
                return False
            except (OSError, ValueError) as exc:
                last = str(exc)
                time.sleep(0.2)
        self.error = f"not ready after {timeout:.0f}s ({last}): {self.stderr_tail()}"
        return False

    def stderr_tail(self) -> str:
        self._err.flush()
        text = Path(self._err.name).read_text(errors="replace").strip().splitlines()
        return " / ".join(text[-5:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if hasattr(self, "_err"):
            self._err.close()


def run_wrk(wrk: str, port: int, conns: int, seconds: float, prefix: str) -> dict[str, Any]:
    """One wrk run; the figures decide.lua prints, plus requests/s."""
    cmd = [
        wrk, "-t1", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--timeout", "10s",
        "-s", str(BENCH / "decide.lua"), f"http://127.0.0.1:{port}", "--", str(RUN_LEN), prefix,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            out: dict[str, Any] = json.loads(line.removeprefix("BENCH_JSON "))
            out["rps"] = out["requests"] / (out["duration_us"] / 1e6)
            out["errors"] = sum(v for k, v in out.items() if k.startswith("errors_"))
            return out
    raise RuntimeError(f"wrk printed no figures (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the median over rounds (rounds interleave the servers, so drift hits all)."""
    out: dict[str, Any] = {}
    for key in runs[0]:
        vals = sorted(r[key] for r in runs)
        out[key] = vals[len(vals) // 2]
    out["rounds"] = len(runs)
    return out


def logged_lines(log_dir: Path | None) -> int | None:
    """Decision lines the server wrote (every line of every JSON Lines file in its log dir)."""
    if log_dir is None or not log_dir.exists():
        return None
    n = 0
    for path in log_dir.rglob("*"):
        if path.is_file() and ".jsonl" in path.name:
            with path.open("rb") as fh:
                n += sum(1 for _ in fh)
    return n


def pyspy_profile(pid: int, wrk: str, port: int, seconds: float, workdir: Path) -> str:
    """Sample the server with py-spy while wrk loads it; top frames by own and total time."""
    beside = Path(sys.executable).with_name("py-spy")  # pip's script dir may not be on PATH (pyenv)
    spy = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    if spy is None:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "py-spy"], capture_output=True, check=False
        )
        spy = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    if spy is None:
        return "(py-spy not available: pip install py-spy)"
    raw = workdir / f"pyspy-{port}.txt"
    rec = subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "250",
         "--format", "raw", "--output", str(raw), "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    time.sleep(0.5)
    run_wrk(wrk, port, 32, seconds, f"prof{port}")
    _, err = rec.communicate(timeout=seconds + 60)
    if not raw.exists():
        return f"(py-spy failed: {err.decode(errors='replace')[-400:]})"
    return summarize_collapsed(raw.read_text())


def summarize_collapsed(text: str, top: int = 18) -> str:
    """Own-time and total-time shares per frame from py-spy's collapsed stacks."""
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    for line in text.splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        frames = stack.split(";")
        samples += count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for f in set(frames):
            total[f] = total.get(f, 0) + count
    if not samples:
        return "(no samples)"
    out = [f"{samples} samples; own time (where the CPU is):"]
    for f, c in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"  {100 * c / samples:5.1f}%  {f}")
    out.append("total time (own + callees), stopserve frames:")
    ours = [(f, c) for f, c in total.items() if "stopserve" in f or "bench" in f]
    for f, c in sorted(ours, key=lambda kv: -kv[1])[:top]:
        out.append(f"  {100 * c / samples:5.1f}%  {f}")
    return "\n".join(out)


BARE = "bare FastAPI, DecideRequest body"  # the baseline of the targets: same body model as stopserve
BARE_DICT = "bare FastAPI, dict body"
SHIPPED = "stopserve, log interval"
CONTENDER = "contender: ASGI fast path, log interval"  # not shipped: bench/_apps.py fastpath_app
BASELINE = "baseline code: stopserve, log interval"  # --baseline-code DIR: the same server, older code


def main(argv: list[str] | None = None) -> int:
    p = parser((__doc__ or "").splitlines()[0])
    p.add_argument(
        "--baseline-code",
        type=Path,
        metavar="DIR",
        help="also serve the stopserve in DIR (an export of an older commit: stopserve, bench, models) "
        "with fsync 'interval', beside this code's",
    )
    args = p.parse_args(argv)
    sec = Section("Serving: decide over HTTP against bare FastAPI", sys.argv)
    wrk = ensure_wrk()
    app_mod = load("stopserve.service.app", "create_app")
    if wrk is None:
        sec.skip("not available yet: wrk (apt-get install -y wrk)")
        sec.emit(args.out)
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="stopserve-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    size = args.size
    conns = {"tiny": (4,), "quick": (1, 32, 128), "full": (1, 32, 128)}[size]
    seconds = {"tiny": 1.0, "quick": 3.0, "full": 2.0}[size]
    n_rounds = {"tiny": 1, "quick": 1, "full": 3}[size]

    servers = [
        Server("static ASGI", "_apps:static_app"),
        Server(BARE_DICT, "_apps:bare_app"),
        Server(BARE, "_apps:bare_typed_app"),
    ]
    if size != "tiny":
        servers.append(Server("bare FastAPI, sync def", "_apps:bare_sync_app"))
    if isinstance(app_mod, str):
        sec.skip(app_mod)
    else:
        mdir, how = model_dir(workdir, size)
        base_env = {"BENCH_MODEL_DIR": str(mdir) if mdir else ""}
        sec.add(f"stopserve model: {how if mdir else 'none, safety nets only (' + how + ')'}.", "")
        modes = [("off", None), ("interval", "interval"), ("always", "always")]
        if size == "tiny":
            modes = [("always", "always")]
        for label, fsync in modes:
            log_dir = workdir / f"serve-log-{label}" if fsync else None
            if log_dir is not None:
                shutil.rmtree(log_dir, ignore_errors=True)
            env = {
                **base_env,
                "BENCH_LOG_DIR": str(log_dir) if log_dir else "",
                "BENCH_FSYNC": fsync or "interval",
            }
            servers.append(Server(f"stopserve, log {label}", "_apps:stopserve_app", env, log_dir))
            if label == "interval" and args.baseline_code is not None:
                base_log = workdir / "serve-log-baseline"
                shutil.rmtree(base_log, ignore_errors=True)
                code = args.baseline_code.resolve()
                old_env = {**env, "BENCH_LOG_DIR": str(base_log)}
                servers.append(Server(BASELINE, "_apps:stopserve_app", old_env, base_log, code=code))
            if label == "interval" and size != "tiny":
                # the path the service no longer ships, measured beside the one it does (issue 16)
                fast_log = workdir / "serve-log-fastpath"
                shutil.rmtree(fast_log, ignore_errors=True)
                servers.append(
                    Server(CONTENDER, "_apps:fastpath_app", {**env, "BENCH_LOG_DIR": str(fast_log)}, fast_log)
                )
        if size != "tiny":
            # as users start it: `stopserve serve`, its own uvicorn settings, same model (not in targets)
            shipped_log = workdir / "serve-log-cli"
            shutil.rmtree(shipped_log, ignore_errors=True)
            model_opt = ["--model", str(mdir)] if mdir else ["--no-model"]
            servers.append(
                Server(
                    "`stopserve serve` CLI defaults",
                    "",
                    log_dir=shipped_log,
                    argv=[sys.executable, "-m", "stopserve.cli", "serve", "--port", "{port}",
                          "--log-dir", str(shipped_log), *model_opt],
                )
            )  # fmt: skip
    try:
        for s in servers:
            s.start(workdir)
        up = []
        for s in servers:
            if s.wait_ready():
                up.append(s)
            else:
                sec.skip(f"{s.name}: could not start: {s.error}")
        sent = {s.name: 1 for s in up}  # the readiness probe
        for s in up if size != "tiny" else ():  # warm up: first requests pay for imports and caches
            sent[s.name] += run_wrk(wrk, s.port, 8, 1, f"warm{s.port}")["requests"]
        rounds: dict[str, dict[int, list[dict[str, Any]]]] = {}
        for rnd in range(n_rounds):
            for c in conns:
                for s in up:
                    r = run_wrk(wrk, s.port, c, seconds, f"c{c}r{rnd}p{s.port}")
                    rounds.setdefault(s.name, {}).setdefault(c, []).append(r)
                    sent[s.name] += r["requests"]
                    print(
                        f"{s.name} c={c}: {r['rps']:.0f} req/s p99 {r['p99_us'] / 1e3:.2f} ms",
                        file=sys.stderr,
                    )
        results = {name: {c: median_run(rs) for c, rs in per.items()} for name, per in rounds.items()}
        time.sleep(1.5)  # let 'interval' flush before counting log lines
        requests_sent = sent
        logged = {s.name: logged_lines(s.log_dir) for s in up}
        report(sec, up, results, conns, seconds, n_rounds, requests_sent, logged)
        missed = [t for t in sec.targets if t.met is False]
        if missed and size != "tiny":
            target = next((s for s in up if s.name == SHIPPED), None)
            if target is not None and target.proc is not None:
                prof = pyspy_profile(target.proc.pid, wrk, target.port, min(seconds, 8.0), workdir)
                sec.add(*details(f"py-spy profile of {SHIPPED} under wrk -c32", prof))
    finally:
        for s in servers:
            s.stop()
    sec.emit(args.out)
    return 0


def report(
    sec: Section,
    up: list[Server],
    results: dict[str, dict[int, dict[str, Any]]],
    conns: tuple[int, ...],
    seconds: float,
    n_rounds: int,
    requests_sent: dict[str, int],
    logged: dict[str, int | None],
) -> None:
    bare = results.get(BARE, {})
    bare_dict = results.get(BARE_DICT, {})
    rows = []
    for s in up:
        for c in conns:
            r = results[s.name][c]
            b = bare.get(c)
            rows.append(
                [s.name, c, r["rps"], r["p50_us"] / 1e3, r["p99_us"] / 1e3, r["errors"],
                 r["rps"] / b["rps"] if b else None, r["p99_us"] / b["p99_us"] if b else None]
            )  # fmt: skip
    sec.add(
        f"wrk 1 thread, {n_rounds} round(s) of {seconds:.0f} s per row (median of the rounds), "
        "`bench/decide.lua`: every run sequential (its next call waits for its answer), about one live "
        f"run per connection, each retired after {RUN_LEN} calls; two events with fresh ids per request "
        "(one decision point each). All servers run side by side "
        f"(`python -m uvicorn --factory` with `{' '.join(UVICORN_FLAGS[:-3])}`) and wrk "
        "visits them in turn, so each ratio compares measurements seconds apart. Errors = connect, read, "
        "write, timeout and HTTP 4xx/5xx answers.",
        "",
        "Baseline: two bare FastAPI endpoints answer a constant on the same path. The issue asks for one "
        'that "accepts the same body": the ratios and the targets are computed against the one that declares '
        "the body as `stopserve.api.DecideRequest` (the same pydantic model stopserve parses, so both "
        "validate the events); the one taking a plain `dict` is kept in the table for comparison.",
        "",
    )
    sec.table(
        [
            "server",
            "connections",
            "req/s",
            "p50 ms",
            "p99 ms",
            "errors",
            "throughput / bare (typed)",
            "p99 / bare (typed)",
        ],
        rows,
    )
    static = results.get("static ASGI", {})
    if static and bare:
        best = max(
            (results[s.name][c]["rps"] for s in up if s.name.startswith("stopserve") for c in conns),
            default=None,
        )
        top = max(r["rps"] for r in static.values())
        if best:
            sec.add(
                f"Load generator headroom: the static responder reached {top:,.0f} req/s, "
                f"{top / best:.1f}x the best stopserve rate ({best:,.0f} req/s), through the same wrk, "
                "so wrk is not what limits the stopserve figures.",
                "",
            )
    if bare_dict and bare:
        ratios = ", ".join(
            f"{bare[c]['rps'] / bare_dict[c]['rps']:.2f}x at {c}" for c in conns if c in bare_dict
        )
        sec.add(
            f"The typed bare route reaches {ratios} the throughput of the `dict` one: the price of "
            "validating the events with the same pydantic model.",
            "",
        )
    sync = results.get("bare FastAPI, sync def", {})
    if sync and bare_dict:
        ratios = ", ".join(f"{sync[c]['rps'] / bare_dict[c]['rps']:.2f}x at {c}" for c in conns if c in sync)
        sec.add(
            "The same `dict` bare route written as a plain `def` (FastAPI then runs it in its worker "
            f"thread pool) reaches {ratios} the throughput of the `async def` one: the price of the "
            "thread hop alone.",
            "",
        )
    shipped, contender = results.get(SHIPPED, {}), results.get(CONTENDER, {})
    if shipped and contender:
        sec.add(
            "What the shipped decide path (plain async FastAPI routes) costs against the ASGI fast path "
            "it replaced (issue 16; `fastpath_app` in `bench/_apps.py`, same engine, same decision log "
            "with fsync 'interval'), from the rows above:",
            "",
        )
        sec.table(
            ["connections", "routes req/s", "fast path req/s", "routes / fast path (throughput)",
             "routes p99 ms", "fast path p99 ms", "routes / fast path (p99)"],
            [
                [c, shipped[c]["rps"], contender[c]["rps"], shipped[c]["rps"] / contender[c]["rps"],
                 shipped[c]["p99_us"] / 1e3, contender[c]["p99_us"] / 1e3,
                 shipped[c]["p99_us"] / contender[c]["p99_us"]]
                for c in conns if c in shipped and c in contender
            ],
        )  # fmt: skip
        sec.data["routes_over_fastpath"] = {
            str(c): shipped[c]["rps"] / contender[c]["rps"] for c in conns if c in shipped and c in contender
        }
    baseline = results.get(BASELINE, {})
    if shipped and baseline:
        sec.add(
            "This code against the baseline code (`--baseline-code`: the same server, model and flags, "
            "fsync 'interval', an older commit's `stopserve`), from the rows above:",
            "",
        )
        sec.table(
            ["connections", "this code req/s", "baseline req/s", "this / baseline (throughput)",
             "this p99 ms", "baseline p99 ms", "this / baseline (p99)"],
            [
                [c, shipped[c]["rps"], baseline[c]["rps"], shipped[c]["rps"] / baseline[c]["rps"],
                 shipped[c]["p99_us"] / 1e3, baseline[c]["p99_us"] / 1e3,
                 shipped[c]["p99_us"] / baseline[c]["p99_us"]]
                for c in conns if c in shipped and c in baseline
            ],
        )  # fmt: skip
        sec.data["over_baseline"] = {
            str(c): shipped[c]["rps"] / baseline[c]["rps"] for c in conns if c in shipped and c in baseline
        }
    log_rows = []
    for s in up:
        if s.log_dir is not None:
            log_rows.append([s.name, requests_sent[s.name], logged[s.name]])
    if log_rows:
        sec.add(
            "Decision log check: lines in the log folder after the runs, against requests wrk completed "
            "(the log may hold more: requests still in flight when wrk stopped are answered and logged).",
            "",
        )
        sec.table(["server", "requests completed", "log lines"], log_rows)
    if "`stopserve serve` CLI defaults" in results:
        sec.add(
            "`stopserve serve` CLI defaults: started by its own command (`stopserve serve --model M "
            "--log-dir D`: uvicorn defaults, decision log on with the default fsync policy), not with the "
            "flags above, so it is shown for information and left out of the targets.",
            "",
        )
    for s in up:
        if not s.name.startswith("stopserve") or not bare:  # the baseline code is not judged
            continue
        thr = min(results[s.name][c]["rps"] / bare[c]["rps"] for c in conns)
        p99 = max(results[s.name][c]["p99_us"] / bare[c]["p99_us"] for c in conns)
        sec.targets.append(
            Target(f"{s.name}: throughput / bare (worst over connections)", f"{thr:.2f}x",
                   f">= {THROUGHPUT_RATIO}x", thr >= THROUGHPUT_RATIO)
        )  # fmt: skip
        sec.targets.append(
            Target(f"{s.name}: p99 / bare p99 (worst over connections)", f"{p99:.2f}x", f"<= {P99_RATIO}x",
                   p99 <= P99_RATIO)
        )  # fmt: skip
    sec.data["results"] = {k: {str(c): r for c, r in v.items()} for k, v in results.items()}
    sec.data["logged_lines"] = logged
    sec.data["requests"] = requests_sent
    for s in up:
        if s.probe is not None:
            sec.data.setdefault("probe_answers", {})[s.name] = s.probe


if __name__ == "__main__":
    raise SystemExit(main())
