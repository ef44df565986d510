"""Training traces of a given number of decision points for the training benchmark.

The simulator (``stopserve simulate``) when it is there; else synthetic traces built
here (random outcomes, grades on aggregates: meaningless labels, but the same shapes
and sizes, which is all a timing needs).
"""

from __future__ import annotations

import random
from pathlib import Path

import orjson
from _common import load
from _events import event_dicts
from _model import run, stopserve_cmd

DP_TYPES = frozenset({"return", "aggregate", "reward"})


def count_points(path: Path) -> tuple[int, int]:
    """(traces, decision points) in a JSON Lines trace file."""
    traces = points = 0
    with path.open("rb") as fh:
        for line in fh:
            if not line.strip():
                continue
            trace = orjson.loads(line)
            traces += 1
            for ev in trace["events"]:
                kind = ev["type"]
                if kind in DP_TYPES or (kind == "stop" and ev.get("proposed")):
                    points += 1
    return traces, points


def synthetic(path: Path, n_points: int, seed: int = 0) -> tuple[int, int]:
    """Write synthetic traces (about 40 decision points each); (traces, points)."""
    rng = random.Random(seed)
    traces = points = 0
    with path.open("wb") as fh:
        while points < n_points:
            n_events = rng.randint(40, 160)
            events = event_dicts(n_events, seed=rng.randrange(10**9), prefix="e")
            for ev in events:
                if ev["type"] == "aggregate":
                    ev["grade"] = round(rng.random(), 3)
                if ev["type"] in DP_TYPES:
                    points += 1
            trace = {
                "trace_id": f"syn{traces}",
                "task_id": f"task{traces // 4}",
                "topology": "centralized",
                "events": events,
                "rewards": {"team": float(rng.random() < 0.6)},
            }
            fh.write(orjson.dumps(trace) + b"\n")
            traces += 1
    return traces, points


def make(path: Path, n_points: int, seed: int = 0) -> tuple[int, int, str]:
    """Traces with at least ``n_points`` decision points; (traces, points, how they were made)."""
    if isinstance(load("stopserve.cli.simulate", "simulate_command"), str):
        traces, points = synthetic(path, n_points, seed)
        return traces, points, "synthetic traces (stopserve.training.simulate not available yet)"
    pilot = path.with_suffix(".pilot.jsonl")
    run(stopserve_cmd("simulate", "--n", "200", "--seed", str(seed + 1), "-o", str(pilot)), timeout=600)
    p_traces, p_points = count_points(pilot)
    pilot.unlink()
    n = max(2, int(n_points / max(p_points / p_traces, 1.0) * 1.06) + 1)  # margin: never fall short
    run(stopserve_cmd("simulate", "--n", str(n), "--seed", str(seed), "-o", str(path)), timeout=1800)
    traces, points = count_points(path)
    return traces, points, f"`stopserve simulate --n {n} --seed {seed}`"
