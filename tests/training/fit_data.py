"""Synthetic traces with a learnable stop signal, for the trainer and policy tests.

Runs that will fail show it: their actions error and repeat; runs that will
succeed make fresh, error-free progress. Stopping a doomed run early saves its
cost, so a good policy beats running to the logged end.
"""

from __future__ import annotations

import random
from typing import Any

from stopserve.trace import Trace


def synth_trace(
    i: int,
    rng: random.Random,
    *,
    task: str | None = None,
    success: bool | None = None,
    usd: bool = True,
    propensity: float | None = None,
) -> Trace:
    """One single-agent run of 4-24 steps; ``success`` drawn at 50% unless given."""
    ok = rng.random() < 0.5 if success is None else success
    n = rng.randint(4, 10) if ok else rng.randint(10, 24)
    events: list[dict[str, Any]] = []
    t = 0.0
    for s in range(n):
        failing = not ok and s >= 2 and rng.random() < 0.7
        ref = f"cmd{s % 2}" if failing else f"cmd{i}-{s}"
        act: dict[str, Any] = {
            "id": f"a{s}",
            "t": t,
            "type": "tool_use",
            "agent": "agent",
            "tool": "bash",
            "content_ref": ref,
            "tokens": 1000 + rng.randint(0, 500),
        }
        if usd:
            act["usd"] = 0.01
        events.append(act)
        t += 1.0
        ret: dict[str, Any] = {
            "id": f"r{s}",
            "t": t,
            "type": "return",
            "agent": "agent",
            "content_ref": f"out{s % 2}" if failing else f"out{i}-{s}",
            "error": failing,
        }
        if propensity is not None and s == 1:
            ret["decision"] = {"action": "continue", "propensity": propensity}
        events.append(ret)
    events.append({"id": "stop", "t": t, "type": "stop", "agent": "agent", "reason": "information_complete"})
    return Trace.model_validate(
        {
            "trace_id": f"run{i}",
            "task_id": task or f"repo{i % 4}__task-{i % 40}",
            "events": events,
            "rewards": {"team": 1.0 if ok else 0.0},
        }
    )


def synth_traces(n: int = 80, seed: int = 0, **kw: Any) -> list[Trace]:
    """``n`` runs over ``min(n, 40)`` tasks in 4 repositories."""
    rng = random.Random(seed)
    return [synth_trace(i, rng, **kw) for i in range(n)]
