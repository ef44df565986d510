"""Reliability under issue 13's attacks: kill -9 and full-disk rounds, memory under the byte caps,
normal clients' p99 while hostile clients send maximum-size bodies.

Each figure comes from a real ``stopserve serve`` on loopback (tests/servers.py), driven by
the pieces of ``tests/reliability/harness.py`` (the same the reliability tests use):

- kill -9 rounds: client threads decide turn after turn; the server is SIGKILLed with
  requests in flight, restarted on the same log; every answered decision must be in the log.
- full-disk rounds: the log's disk fills mid-load (a small tmpfs; ``RLIMIT_FSIZE`` on the
  server where mounting is not permitted), then frees; the server is killed and restarted;
  every answered decision must be in the log, no line torn, no 5xx but the 503s the full
  disk is answered with.
- memory: peak resident memory (VmHWM) of the server with 10,000 live runs under the
  default byte caps, then with one hostile run pushed to its byte cap.
- p99: normal clients (their own process) decide while two hostile clients (their own
  process) post maximum-size bodies (8 MiB: 100k tiny events, or 2,000 padded events);
  the quiet p99 is measured in the same run, rounds interleaved.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, Section, Target, parser, percentile

sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "reliability"))

import httpx
import orjson
from harness import (
    Disk,
    Load,
    fill_hostile_run,
    hostile_bodies,
    hostile_senders,
    logged_decisions,
    rss_kib,
    turn,
)
from servers import LiveServer

from stopserve.settings import Settings

SIZES = {
    # kill rounds, answers per kill round, disk rounds, live runs, turns per run, p99 rounds, seconds
    "tiny": (1, 40, 1, 200, 2, 1, 2.0),
    "quick": (3, 600, 2, 10_000, 3, 2, 8.0),
    "full": (5, 2_000, 3, 10_000, 5, 3, 15.0),
}


def kill_rounds(work: Path, rounds: int, per_round: int) -> dict[str, Any]:
    logs = work / "kill-logs"
    answered: set[tuple[str, int]] = set()
    sent = errors = 0
    for k in range(rounds):
        server = LiveServer(log_dir=logs, no_model=True).start()
        load = Load(server.url, workers=4, tag=f"k{k}-").start()
        try:
            load.wait_for(per_round, timeout=120)
            server.kill()
        finally:
            load.stop()
            server.kill()
        answered |= set(load.received)
        sent += load.sent
        errors += load.server_errors
    with LiveServer(log_dir=logs, no_model=True):
        pass  # the restart repairs the log
    lost = len(answered - logged_decisions(logs))
    return {"rounds": rounds, "sent": sent, "answered": len(answered), "lost": lost, "5xx": errors}


def disk_rounds(work: Path, rounds: int, per_round: int) -> dict[str, Any]:
    answered: set[tuple[str, int]] = set()
    sent = errors = refused = 0
    kind = ""
    quarantined = 0
    for k in range(rounds):
        with Disk(work / f"disk{k}") as disk:
            kind = disk.kind
            logs = disk.root / "logs"
            server = LiveServer(log_dir=logs, no_model=True).start()
            assert server.proc is not None
            disk.pid = server.proc.pid
            load = Load(server.url, workers=4, tag=f"d{k}-").start()
            try:
                load.wait_for(per_round // 2, timeout=120)
                disk.fill()
                time.sleep(1.0)
                disk.free()
                load.wait_for(len(load.received) + per_round // 2, timeout=120)
                server.kill()
            finally:
                load.stop()
                server.kill()
            with LiveServer(log_dir=logs, no_model=True):
                pass
            got = set(load.received)
            lost = got - logged_decisions(logs)
            answered |= {(f"{k}/{r}", i) for r, i in got}
            quarantined += (logs / "decisions.quarantine").exists()
            sent += load.sent
            errors += load.server_errors
            refused += load.statuses.get(503, 0)
            if lost:
                return {"kind": kind, "lost": len(lost), "rounds": k + 1, "sent": sent, "5xx": errors}
    return {
        "kind": kind,
        "rounds": rounds,
        "sent": sent,
        "answered": len(answered),
        "lost": 0,
        "503 (disk full)": refused,
        "5xx": errors,
        "torn lines repaired": quarantined,
    }


def memory(work: Path, runs: int, turns: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with (
        LiveServer(log_dir=work / "mem-logs", no_model=True) as server,
        httpx.Client(base_url=server.url, timeout=120) as http,
    ):
        assert server.proc is not None
        pid = server.proc.pid
        out["rss_start_mib"] = rss_kib(pid)[0] / 1024
        per = min(500, runs)
        for t in range(turns):
            for b in range(0, runs, per):
                batch = {"runs": [{"run_id": f"r{b + i}", "events": turn(t)} for i in range(per)]}
                r = http.post(
                    "/v1/decide:batch",
                    content=orjson.dumps(batch),
                    headers={"content-type": "application/json"},
                )
                r.raise_for_status()
        out["live_runs"] = _metric(http, "stopserve_live_runs")
        out["store_mib_runs"] = _metric(http, "stopserve_store_bytes") / 2**20
        out["rss_peak_mib_runs"] = rss_kib(pid)[1] / 1024
        fill_hostile_run(http, 10_000)
        out["hostile_mib"] = _metric(http, "stopserve_store_bytes") / 2**20 - out["store_mib_runs"]
        out["store_mib_all"] = _metric(http, "stopserve_store_bytes") / 2**20
        out["rss_peak_mib_all"] = rss_kib(pid)[1] / 1024
    return out


def _metric(http: httpx.Client, name: str) -> float:
    text = http.get("/metrics").text
    return next(float(x.split()[1]) for x in text.splitlines() if x.startswith(name + " "))


def p99_rounds(
    work: Path, rounds: int, seconds: float, max_body: int, code: Path | None = None
) -> dict[str, Any]:
    """Normal clients' p99, quiet and under each hostile body of ``max_body`` bytes, rounds interleaved.

    ``code``: serve the stopserve found there (e.g. an export of an older commit) instead.
    """
    bodies = hostile_bodies(max_body)
    results: dict[str, list[dict[str, Any]]] = {"quiet": [], **{name: [] for name in bodies}}
    env = {"STOPSERVE_MAX_BODY_BYTES": str(max_body)}
    command = None
    if code is not None:
        env["PYTHONPATH"] = str(code)
        command = [sys.executable, "-P", "-m", "stopserve.cli"]  # -P: not the stopserve in the cwd
    logs = work / f"p99-logs-{'baseline' if code else 'this'}"
    with LiveServer(log_dir=logs, no_model=True, env=env, command=command) as server:
        for _ in range(rounds):
            for name, rows in results.items():
                if name == "quiet":
                    rows.append(_normal(server.url, seconds))
                else:
                    with hostile_process(server.url, name, max_body, 2) as hostile:
                        time.sleep(0.5)
                        row = _normal(server.url, seconds)
                    rows.append({**row, "hostile": hostile.counts})
        assert "Traceback" not in server.read_output(), server.read_output()[-3000:]
    return {name: _summary(rows) for name, rows in results.items()}


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    hostile: dict[str, int] = {}
    for r in rows:
        for key, n in r.get("hostile", {}).items():
            hostile[key] = hostile.get(key, 0) + n
    return {
        "p50_ms": statistics.median(r["p50_ms"] for r in rows),
        "p99_ms": statistics.median(r["p99_ms"] for r in rows),
        "requests": sum(r["requests"] for r in rows),
        "5xx": sum(r["5xx"] for r in rows),
        "hostile": hostile,
    }


def _normal(url: str, seconds: float) -> dict[str, Any]:
    """Two normal clients in their own process for ``seconds``."""
    proc = subprocess.run(
        [sys.executable, __file__, "--role", "normal", "--url", url, "--seconds", str(seconds)],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 120,
    )
    row: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return row


class hostile_process:
    """Hostile clients in their own process while the block runs."""

    def __init__(self, url: str, body: str, max_body: int, clients: int) -> None:
        self.argv = [sys.executable, __file__, "--role", "hostile", "--url", url, "--body", body]
        self.argv += ["--clients", str(clients), "--max-body", str(max_body)]
        self.proc: subprocess.Popen[str] | None = None
        self.counts: dict[str, int] = {}

    def __enter__(self) -> hostile_process:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=60)
        lines = out.strip().splitlines()
        self.counts = json.loads(lines[-1]) if lines else {}


def role_normal(url: str, seconds: float) -> None:
    load = Load(url, workers=2, tag="n-").start()
    time.sleep(seconds)
    load.stop()
    lat = sorted(load.latencies)
    print(
        json.dumps(
            {
                "requests": load.sent,
                "p50_ms": 1000 * percentile(lat, 50) if lat else float("nan"),
                "p99_ms": 1000 * percentile(lat, 99) if lat else float("nan"),
                "5xx": load.server_errors,
            }
        )
    )


def role_hostile(url: str, body_name: str, clients: int, max_body: int) -> None:
    import signal

    body = hostile_bodies(max_body)[body_name]
    stop = False

    def done(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, done)
    with hostile_senders(url, body, clients) as counts:
        while not stop:
            time.sleep(0.1)
    print(json.dumps(counts))


def main(argv: list[str] | None = None) -> int:
    p = parser((__doc__ or "").splitlines()[0])
    p.add_argument("--role", choices=("normal", "hostile"), help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=5.0, help=argparse.SUPPRESS)
    p.add_argument("--body", help=argparse.SUPPRESS)
    p.add_argument("--clients", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--max-body", type=int, default=8 * 1024 * 1024, help=argparse.SUPPRESS)
    p.add_argument(
        "--baseline-code",
        type=Path,
        metavar="DIR",
        help="also measure the p99 rounds against the stopserve in DIR (an export of an older commit)",
    )
    args = p.parse_args(argv)
    if args.role == "normal":
        role_normal(args.url, args.seconds)
        return 0
    if args.role == "hostile":
        role_hostile(args.url, args.body, args.clients, args.max_body)
        return 0
    kills, per_kill, disks, runs, turns, p99_n, seconds = SIZES[args.size]
    sec = Section("Reliability: kill -9, full disk, memory caps, hostile bodies (issue 13)", sys.argv)
    work = (
        Path(args.workdir) if getattr(args, "workdir", None) else Path(tempfile.mkdtemp(prefix="bench-rel-"))
    )
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    kill = kill_rounds(work, kills, per_kill)
    disk = disk_rounds(work, disks, per_kill)
    mem = memory(work, runs, turns)
    max_body = Settings().max_body_bytes  # the default: what a user who sets nothing gets
    p99 = p99_rounds(work, p99_n, seconds, max_body)
    code = args.baseline_code
    baseline = p99_rounds(work, p99_n, seconds, max_body, code.resolve()) if code else None
    sec.data.update(kill=kill, disk=disk, memory=mem, p99=p99, baseline=baseline)
    sec.data["seconds"] = time.monotonic() - started
    quiet = p99["quiet"]["p99_ms"]
    worst = max(v["p99_ms"] for k, v in p99.items() if k != "quiet")
    sent = kill["sent"] + disk["sent"] + sum(v["requests"] for v in p99.values())
    five = kill["5xx"] + disk["5xx"] + sum(v["5xx"] for v in p99.values())
    sec.targets += [
        Target(
            "acknowledged decisions lost (kill -9 + full disk)",
            f"{kill['lost'] + disk['lost']}",
            "0",
            kill["lost"] + disk["lost"] == 0,
        ),
        Target("5xx answers (503 on a full disk aside)", f"{five} of {sent} requests", "0", five == 0),
        Target(
            "normal p99 under hostile max-size bodies / quiet p99",
            f"{worst / quiet:.2f}x ({worst:.1f} / {quiet:.1f} ms)",
            "<= 3x",
            worst <= 3 * quiet,
        ),
    ]
    sec.add(f"Requests sent in all: {sent}.", "")
    sec.table(
        ["round", "rounds", "requests sent", "decisions answered", "answered and lost", "5xx", "notes"],
        [
            [
                "kill -9 under load (4 clients)",
                kill["rounds"],
                kill["sent"],
                kill["answered"],
                kill["lost"],
                kill["5xx"],
                "",
            ],
            [
                f"full disk ({disk['kind']}), then space back",
                disk["rounds"],
                disk["sent"],
                disk.get("answered", 0),
                disk["lost"],
                disk["5xx"],
                f"{disk.get('503 (disk full)', 0)} answered 503 while full; "
                f"{disk.get('torn lines repaired', 0)} restarts found a torn line",
            ],
        ],
    )
    sec.table(
        ["memory (server, default caps: 16 MiB per run, 1 GiB store)", "value"],
        [
            ["resident at start", f"{mem['rss_start_mib']:.0f} MiB"],
            [f"live runs ({turns} turns each)", f"{mem['live_runs']:.0f}"],
            ["store bytes charged for them", f"{mem['store_mib_runs']:.0f} MiB"],
            ["peak resident with them", f"{mem['rss_peak_mib_runs']:.0f} MiB"],
            ["one hostile run, pushed until 413", f"{mem['hostile_mib']:.1f} MiB charged"],
            ["peak resident with both", f"{mem['rss_peak_mib_all']:.0f} MiB"],
        ],
    )
    runs = [("this code", p99)] + ([(f"baseline: {args.baseline_code.name}", baseline)] if baseline else [])
    sec.table(
        [
            "server",
            "normal clients (2, own process)",
            "p50 ms",
            "p99 ms",
            "requests",
            "5xx",
            "hostile answers",
        ],
        [
            [who, name, v["p50_ms"], v["p99_ms"], v["requests"], v["5xx"], json.dumps(v["hostile"]) or ""]
            for who, table in runs
            for name, v in table.items()
        ],
    )
    sec.add(
        f"Medians over {p99_n} interleaved rounds of {seconds:g} s each; two hostile clients in their own "
        f"process post {max_body / 2**20:g} MiB bodies (the default STOPSERVE_MAX_BODY_BYTES) to the decide "
        "route without pause. The machine's 2 cores are shared with the clients and with other jobs."
        + (
            f" The baseline rows serve the code in `{args.baseline_code}` through the same harness, "
            "right after this code's rows."
            if baseline
            else ""
        ),
    )
    sec.emit(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
