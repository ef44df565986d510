"""Small hand-built traces for the label, heuristic and evaluation tests."""

from __future__ import annotations

from typing import Any

from stopserve.trace import Trace


def step_trace(
    trace_id: str,
    task_id: str,
    n_steps: int,
    *,
    tokens: int = 1000,
    usd: float | None = 0.01,
    grades: list[float] | None = None,
    team: float | None = 1.0,
    rewards: list[float] | None = None,
    loop_from: int | None = None,
    metrics: dict[str, float] | None = None,
    final_stop: bool = True,
) -> Trace:
    """A single-agent run: ``n_steps`` (tool_use, return) pairs, then a final stop.

    Each tool_use costs ``tokens`` (and ``usd``); ``grades[i]`` grades step i's
    return; ``rewards[i]`` adds a reward event after step i; from step
    ``loop_from`` on, the action and its result repeat exactly.
    """
    events: list[dict[str, Any]] = []
    t = 0.0
    for i in range(n_steps):
        looping = loop_from is not None and i >= loop_from
        action: dict[str, Any] = {
            "id": f"a{i}",
            "t": t,
            "type": "tool_use",
            "agent": "agent",
            "tool": "bash",
            "content_ref": "same-cmd" if looping else f"cmd{i}",
            "tokens": tokens,
        }
        if usd is not None:
            action["usd"] = usd
        events.append(action)
        t += 1.0
        ret: dict[str, Any] = {
            "id": f"r{i}",
            "t": t,
            "type": "return",
            "agent": "agent",
            "content_ref": "same-out" if looping else f"out{i}",
        }
        if grades is not None:
            ret["grade"] = grades[i]
        events.append(ret)
        if rewards is not None:
            t += 0.5
            events.append({"id": f"w{i}", "t": t, "type": "reward", "agent": "verifier", "value": rewards[i]})
    if final_stop:
        events.append(
            {"id": "stop", "t": t, "type": "stop", "agent": "agent", "reason": "information_complete"}
        )
    data: dict[str, Any] = {"trace_id": trace_id, "task_id": task_id, "events": events}
    if team is not None:
        data["rewards"] = {"team": team}
    if metrics:
        data["metrics"] = metrics
    return Trace.model_validate(data)
