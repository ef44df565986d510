"""Deterministic synthetic event streams for the in-process benchmarks.

A centralized orchestrator delegates to three workers that call tools and return;
it aggregates every third return and a verifier scores every fifth. Content refs
come from a large pool, so repetition is rare and the loop detector stays quiet
(the benchmarks time the model path, not a safety stop).
"""

from __future__ import annotations

import random
from typing import Any

AGENTS = ("coder", "tester", "critic")
TOOLS = ("bash", "edit", "search", "read")


def event_dicts(n: int, *, seed: int = 0, prefix: str = "e", t0: float = 0.0) -> list[dict[str, Any]]:
    """``n`` format-v1 event dicts with ids ``{prefix}{i}``, times from ``t0``."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    t = t0
    i = 0
    returns = 0
    while len(out) < n:
        agent = AGENTS[i % len(AGENTS)]
        step: list[dict[str, Any]] = [
            {"type": "delegate", "agent": "orchestrator", "to": agent, "tokens": rng.randint(50, 400)},
            {
                "type": "tool_use",
                "agent": agent,
                "tool": TOOLS[rng.randrange(len(TOOLS))],
                "tokens": rng.randint(200, 3000),
                "usd": round(rng.uniform(0.0002, 0.004), 6),
                "error": rng.random() < 0.05,
                "content_ref": f"c{rng.randrange(1_000_000):06d}",
            },
            {
                "type": "return",
                "agent": agent,
                "to": "orchestrator",
                "tokens": rng.randint(50, 800),
                "content_ref": f"r{rng.randrange(1_000_000):06d}",
            },
        ]
        returns += 1
        if returns % 3 == 0:
            step.append(
                {"type": "aggregate", "agent": "orchestrator", "content_ref": f"a{rng.randrange(10**6):06d}"}
            )
        if returns % 5 == 0:
            step.append({"type": "reward", "agent": "verifier", "value": round(rng.random(), 3)})
        for ev in step:
            if len(out) >= n:
                break
            t += rng.uniform(0.05, 2.0)
            ev["id"] = f"{prefix}{len(out)}"
            ev["t"] = round(t, 3)
            out.append(ev)
        i += 1
    return out


def decision_event(i: int, t: float, *, prefix: str = "d") -> dict[str, Any]:
    """One ``return`` (a decision point) with a fresh id, as a decide call would bring."""
    return {
        "id": f"{prefix}{i}",
        "t": t,
        "type": "return",
        "agent": AGENTS[i % len(AGENTS)],
        "to": "orchestrator",
        "tokens": 300 + i % 97,
        "usd": 0.001,
        "content_ref": f"x{i:08d}",
    }
