"""Replicas: decide throughput and p99 with the Redis run store against the in-memory store.

Four setups run side by side, on one real ``redis-server`` for the shared ones, each replica a
uvicorn process serving ``create_app`` (one worker, same flags as bench_serve.py, decision log
off, same model):

- ``memory x1``: one replica, runs in its memory (the baseline of every ratio);
- ``redis x1``: one replica, runs in Redis (every call: one read and one write round trip);
- ``memory x3``: three independent replicas, each owning its runs (what scaling out without a
  shared store means: every call of a run must go to the same replica);
- ``redis x3``: three replicas on one Redis, runs shared.

wrk (bench/decide.lua: many runs, each sequential, two fresh events a call) loads every
replica of a setup at once, one wrk per replica with the connections split between them;
throughput is the sum, p99 the worst replica's. Rounds interleave the setups, and each
figure is the median over rounds. The commands Redis ran per decide come from its
``INFO commandstats`` (one read and one write script per call is the design).

On a 2-core machine three replicas plus Redis plus wrk share two cores: the x3 rows show the
overhead of more processes and of the store, not scale (docs/service.md, "Several replicas").
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import Section, details, parser
from _model import model_dir
from bench_serve import Server, ensure_wrk, free_port, median_run, run_wrk


def start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], int] | str:
    binary = shutil.which("redis-server")
    if binary is None:
        return "redis-server not installed (apt-get install -y redis-server)"
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    args += ["--dir", str(workdir), "--maxmemory", "1gb", "--maxmemory-policy", "volatile-ttl"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if redis_cli(port, "PING"):
            return proc, port
        time.sleep(0.1)
    proc.kill()
    return "redis-server did not answer"


def redis_cli(port: int, *args: str) -> Any:
    import redis

    client = redis.Redis(port=port, decode_responses=True)
    try:
        return client.execute_command(*args)
    except redis.RedisError:
        return None
    finally:
        client.close()


def script_calls(port: int) -> int:
    """EVALSHA and EVAL calls Redis served so far."""
    import redis

    client = redis.Redis(port=port)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def load_setup(wrk: str, servers: list[Server], conns: int, seconds: float, prefix: str) -> dict[str, Any]:
    """wrk on every replica of a setup at once; summed throughput, worst p99 and p50."""
    results: list[dict[str, Any]] = []
    per = max(1, conns // len(servers))

    def one(s: Server) -> None:
        results.append(run_wrk(wrk, s.port, per, seconds, f"{prefix}p{s.port}"))

    threads = [threading.Thread(target=one, args=(s,)) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "rps": sum(r["rps"] for r in results),
        "p99_us": max(r["p99_us"] for r in results),
        "p50_us": max(r["p50_us"] for r in results),
        "requests": sum(r["requests"] for r in results),
        "errors": sum(r["errors"] for r in results),
    }


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__ or "").parse_args(argv)
    sec = Section("Replicas: the Redis run store against the in-memory store", sys.argv)
    wrk = ensure_wrk()
    if wrk is None:
        sec.skip("not available: wrk (apt-get install -y wrk)")
        sec.emit(args.out)
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="stopserve-bench-replicas-"))
    workdir.mkdir(parents=True, exist_ok=True)
    size = args.size
    conns = {"tiny": (3,), "quick": (3, 48), "full": (3, 48)}[size]
    seconds = {"tiny": 1.0, "quick": 3.0, "full": 3.0}[size]
    n_rounds = {"tiny": 1, "quick": 2, "full": 3}[size]
    started = start_redis(workdir)
    if isinstance(started, str):
        sec.skip(started)
        sec.emit(args.out)
        return 0
    redis_proc, redis_port = started
    mdir, how = model_dir(workdir, size)
    env = {"BENCH_MODEL_DIR": str(mdir) if mdir else "", "BENCH_LOG_DIR": ""}
    shared = {**env, "BENCH_STORE": f"redis://127.0.0.1:{redis_port}/0"}
    setups: dict[str, list[Server]] = {
        "memory x1": [Server("memory x1 #0", "_apps:stopserve_app", env)],
        "redis x1": [Server("redis x1 #0", "_apps:stopserve_app", shared)],
        "memory x3": [Server(f"memory x3 #{k}", "_apps:stopserve_app", env) for k in range(3)],
        "redis x3": [Server(f"redis x3 #{k}", "_apps:stopserve_app", shared) for k in range(3)],
    }
    if size == "tiny":
        setups = {k: v for k, v in setups.items() if k in ("memory x1", "redis x1")}
    everyone = [s for group in setups.values() for s in group]
    try:
        for s in everyone:
            s.start(workdir)
        for s in everyone:
            if not s.wait_ready():
                sec.skip(f"{s.name}: could not start: {s.error}")
                return 1
        for group in setups.values():  # warm up: imports, caches, connections
            load_setup(wrk, group, 4, 1, f"warm{group[0].port}")
        rounds: dict[str, dict[int, list[dict[str, Any]]]] = {}
        calls_per_decide: dict[str, float] = {}
        for rnd in range(n_rounds):
            for c in conns:
                for name, group in setups.items():
                    before = script_calls(redis_port)
                    r = load_setup(wrk, group, c, seconds, f"c{c}r{rnd}{name.replace(' ', '')}")
                    if "redis" in name and r["requests"]:
                        calls_per_decide[name] = (script_calls(redis_port) - before) / r["requests"]
                    rounds.setdefault(name, {}).setdefault(c, []).append(r)
                    print(
                        f"{name} c={c}: {r['rps']:.0f} req/s p99 {r['p99_us'] / 1e3:.2f} ms "
                        f"({r['errors']} errors)",
                        file=sys.stderr,
                    )
        results = {name: {c: median_run(rs) for c, rs in per.items()} for name, per in rounds.items()}
        # each ratio against the baseline measured in the same round (seconds apart), then the median
        ratios = {
            name: {
                c: {
                    key: _median([r[key] / b[key] for r, b in zip(rs, rounds["memory x1"][c], strict=True)])
                    for key in ("rps", "p99_us")
                }
                for c, rs in per.items()
            }
            for name, per in rounds.items()
        }
        memory_used = redis_cli(redis_port, "INFO", "memory") or {}
        runs_in_redis = sum(1 for _ in _scan(redis_port))
    finally:
        for s in everyone:
            s.stop()
        redis_proc.kill()
        redis_proc.wait(10)
    sec.add(
        f"Model: {how if mdir else 'none, safety nets only (' + how + ')'}. Decision log off (the store is "
        f"what is compared). wrk {seconds:.0f} s a round, {n_rounds} round(s); figures are medians over "
        "rounds, ratios the median of each round's ratio to `memory x1` in that round; connections split "
        "over the replicas of a setup; p99 is the worst replica's.",
        "",
    )
    rows = []
    for c in conns:
        for name in setups:
            r = results[name][c]
            rows.append(
                [
                    name,
                    c,
                    round(r["rps"]),
                    round(ratios[name][c]["rps"], 2),
                    round(r["p50_us"] / 1e3, 2),
                    round(r["p99_us"] / 1e3, 2),
                    round(ratios[name][c]["p99_us"], 2),
                    int(r["errors"]),
                ]
            )
    sec.table(
        [
            "setup",
            "connections",
            "req/s",
            "req/s / memory x1",
            "p50 ms",
            "p99 ms",
            "p99 / memory x1",
            "errors",
        ],
        rows,
    )
    shown = ", ".join(f"{name}: {v:.2f}" for name, v in sorted(calls_per_decide.items()))
    sec.add(f"Redis script calls per decide (read + write = 2 by design): {shown}.", "")
    sec.add(
        f"Redis at the end: {runs_in_redis:,} runs held, used_memory "
        f"{int(memory_used.get('used_memory', 0)) / 2**20:.1f} MiB "
        f"({int(memory_used.get('used_memory', 0)) / max(1, runs_in_redis) / 1024:.1f} KiB a run, "
        "runs of up to 20 calls, 40 events).",
        "",
    )
    sec.data = {"results": results, "ratios": ratios, "calls_per_decide": calls_per_decide}
    sec.add(
        *details(
            "machine load", subprocess.run(["uptime"], check=False, capture_output=True, text=True).stdout
        )
    )
    sec.emit(args.out)
    return 0


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _scan(port: int) -> Any:
    import redis

    client = redis.Redis(port=port)
    try:
        yield from client.scan_iter(match="stopserve:*:run", count=1000)
    finally:
        client.close()


if __name__ == "__main__":
    raise SystemExit(main())
