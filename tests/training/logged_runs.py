"""Runs as the service logs them, made offline from run-to-cap simulator twins (for the OPE tests).

:func:`serve` walks a run-to-cap trace through a logging policy's ``decide`` at every
decision point, exploring its stops as the engine does (the first with probability ε,
later ones with ρ), cuts the run at the first stop it keeps and writes the trace the
service would: events up to the stop with each decision attached (action, propensity),
the quality at the stop as ``rewards.team``, the stop by the service. The draws are
forced (``explored``: how many stops are explored before one is kept) so every branch of
the logging policy's randomness can be enumerated with its probability
(:func:`branches`): the exact expectation of an estimator over the logging randomness.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stopserve.artifacts import save_model_dir
from stopserve.features import RunState
from stopserve.objective import Objective
from stopserve.policy import Policy
from stopserve.safety import SafetyConfig
from stopserve.trace import Trace, is_decision_point
from stopserve.training.deploy import prefix_values
from stopserve.training.heuristics import HeuristicRule, TunedHeuristic


class _Draw:
    """A stand-in for ``random.Random``: the next draws explore, then one keeps the stop."""

    def __init__(self, explore: int) -> None:
        self.left = explore

    def random(self) -> float:
        if self.left > 0:
            self.left -= 1
            return 0.0  # below any epsilon: explored
        return 1.0 - 1e-12  # above: kept


@dataclass(frozen=True)
class Logged:
    """One logged run: the trace the service writes, and where it was stopped."""

    trace: dict[str, Any]
    stop_event: int | None
    explored: int  # stops explored in this run
    kept: bool  # stopped at a stop that could have been explored (not a budget's)


def serve(
    policy: Policy,
    twin: dict[str, Any],
    *,
    lam: float,
    epsilon: float,
    rho: float,
    explore: int,
    safety: SafetyConfig | None = None,
    trace_id: str | None = None,
) -> Logged:
    """The run as logged when the first ``explore`` explorable stops are explored and the next is kept."""
    tr = Trace.model_validate(twin)
    state = RunState(topology=tr.topology, budget=tr.budget)
    draws = _Draw(explore)
    decided: dict[int, dict[str, Any]] = {}
    stop: int | None = None
    explored = 0
    kept = False
    last = len(tr.events) - 1
    for k, ev in enumerate(tr.events):
        state.fold(ev)
        if k >= last or not is_decision_point(ev):
            continue
        eps = rho if explored else epsilon
        d = policy.decide(
            state,
            objective=Objective(lam=lam),
            safety=safety,
            proposed_stop=ev.type == "stop" and bool(ev.proposed),
            epsilon=eps,
            rng=draws,  # type: ignore[arg-type]
        )
        if d.explored:
            explored += 1
        decided[k] = {"action": d.action, "propensity": d.propensity}
        if d.action == "stop":
            stop, kept = k, d.propensity < 1.0
            break
    end = last if stop is None else stop
    events = []
    for k, ev in enumerate(twin["events"][: end + 1]):
        e = dict(ev)
        if k in decided:
            e["decision"] = decided[k]
        events.append(e)
    q = 0.0
    for e in events:
        if e.get("grade") is not None:
            q = float(e["grade"])
    out: dict[str, Any] = {
        "format": "stopserve.trace/1",
        "trace_id": trace_id or twin["trace_id"],
        "task_id": twin["task_id"],
        "system": "deploy/" + str(twin["topology"]),
        "topology": twin["topology"],
        "events": events,
        "rewards": {"team": q},
        "budget": twin["budget"],
    }
    if stop is not None:
        out["stop"] = {"reason": "no_progress", "by": "service", "t": events[-1]["t"]}
    else:
        out["stop"] = twin["stop"]
    return Logged(out, stop, explored, kept)


def explored_stops(rng: random.Random, epsilon: float, rho: float) -> int:
    """How many stops the logging policy explores before it keeps one, drawn as the engine draws."""
    explore = 0
    if rng.random() < epsilon:
        explore = 1
        while rng.random() < rho:
            explore += 1
    return explore


def branches(
    policy: Policy,
    twin: dict[str, Any],
    *,
    lam: float,
    epsilon: float,
    rho: float,
    safety: SafetyConfig | None = None,
) -> Iterator[tuple[float, Logged]]:
    """Every way the logging policy may log this run, with its probability (they sum to 1)."""
    j = 0
    while True:
        got = serve(
            policy,
            twin,
            lam=lam,
            epsilon=epsilon,
            rho=rho,
            explore=j,
            safety=safety,
            trace_id=f"{twin['trace_id']}~{j}",
        )
        reached = 1.0 if j == 0 else epsilon * rho ** (j - 1)  # the first j stops explored
        if not got.kept:  # it ran to its end, or to a stop nothing explores: the last branch
            yield reached, got
            return
        yield reached * ((1 - epsilon) if j == 0 else (1 - rho)), got
        j += 1


def true_value(
    policy: Policy, twin: dict[str, Any], *, lam: float, safety: SafetyConfig | None = None
) -> float:
    """The exact value of ``policy`` (no exploration) on the run-to-cap twin."""
    tr = Trace.model_validate(twin)
    state = RunState(topology=tr.topology, budget=tr.budget)
    values = prefix_values(twin, lam)
    last = len(tr.events) - 1
    for k, ev in enumerate(tr.events):
        state.fold(ev)
        if k >= last or not is_decision_point(ev):
            continue
        proposed = ev.type == "stop" and bool(ev.proposed)  # type: ignore[union-attr]
        d = policy.decide(state, objective=Objective(lam=lam), safety=safety, proposed_stop=proposed)
        if d.action == "stop":
            return values[k]
    return values[last]


def rule_dir(out: Path, version: str, threshold: float) -> Path:
    """A served stop rule (stop once the reward reaches ``threshold``) as a model directory."""
    rule = TunedHeuristic(
        "h", HeuristicRule(loop=False, reward_threshold=threshold), math.nan, "ktokens", 0.0
    )
    return save_model_dir(out, rule.manifest().updated(model_version=version))
