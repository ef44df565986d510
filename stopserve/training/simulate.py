"""A simulator of orchestrated multi-agent runs with a known optimal stop rule.

Generates format-v1 traces for six topologies and, for a cost weight ``lam``
(per thousand tokens), the Bayes-optimal stop rule over an observable state by
exact dynamic programming. ``docs/simulator.md`` describes the generative model,
the state, the recursion and the failure modes.

>>> traces = list(simulate(30, seed=1, optimal_lambda=0.1))
>>> sorted({t["topology"] for t in traces}) == sorted(SIM_TOPOLOGIES)
True
>>> all("optimal_value" in t["metrics"] for t in traces)
True

In short: a run is a sequence of rounds. Each round the orchestrator delegates
work, sub-agents call tools and return, the orchestrator ``aggregate`` s an
answer and a verifier posts a ``reward``. The answer's quality level ``mu``
(0..L) is a Markov chain: +1 level with a probability that shrinks as quality
grows (diminishing returns), -1 level now and then (regressions), never above a
per-task ceiling ``C`` (latent, set by the task's difficulty). A run may get
stuck in a loop (same content refs and errors each round, no progress). The
verifier reports ``mu / L``; the offline ``grade`` is that plus a zero-mean
answer-specific deviation of standard deviation ``noise`` (a Berkson error: the
verifier is the best estimate a run can make, the truth scatters around it).
"""

from __future__ import annotations

import argparse
import bisect
import math
import random
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from stopserve.errors import ConfigError
from stopserve.trace import TraceWriter

__all__ = [
    "BEHAVIORS",
    "DEFAULT_NOISE",
    "FAILURE_MODES",
    "SIM_TOPOLOGIES",
    "Group",
    "OptimalRule",
    "Spec",
    "TopologyModel",
    "failure_modes",
    "model_for",
    "posterior_above",
    "simulate",
    "simulate_command",
    "solve",
]

FloatArray = npt.NDArray[np.float64]

#: The six simulated topologies (format-v1 names), in task order.
SIM_TOPOLOGIES: Final[tuple[str, ...]] = (
    "centralized",
    "planner_executor_critic",
    "debate",
    "swarm",
    "hierarchical",
    "harness",
)
#: Behavior (logging) policies; ``metrics.behavior_policy`` holds the index.
BEHAVIORS: Final[tuple[str, ...]] = ("turn_cap", "verifier_threshold", "orchestrator")
#: Default standard deviation of the grade around the verifier's score.
DEFAULT_NOISE: Final = 0.05
SYSTEM: Final = "stopserve-sim"
#: The command validates the first trace and every this-many-th one (the tests validate all).
VALIDATE_EVERY: Final = 1000
_ORCH: Final = "orchestrator"
_VERIFIER: Final = "verifier"


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Spec:
    """One event slot of a round: its type, who acts, and its token range (inclusive)."""

    type: str
    agent: str
    to: str | None = None
    tool: str | None = None
    lo: int = 10
    hi: int = 40
    p_error: float = 0.0

    @property
    def mean_tokens(self) -> float:
        """Expected tokens (uniform integer draw on ``lo..hi``)."""
        return (self.lo + self.hi) / 2.0


@dataclass(frozen=True)
class Group:
    """Event slots present together with probability ``p`` (one draw per round)."""

    p: float
    events: tuple[Spec, ...]


@dataclass(frozen=True)
class TopologyModel:
    """Dynamics and costs of one topology; everything the DP needs is here.

    ``p_up[mu]`` is the chance a working round lifts quality one level (when
    below the ceiling), ``p_down`` the chance it drops one level (when above 0).
    ``init[j]`` is the chance the first answer has level ``j``; ``difficulty``
    the chance of each task difficulty ``d``, whose ceiling is
    ``clip(levels - d - ceiling_offset, max initial level, levels)``.
    """

    name: str
    workers: tuple[str, ...]
    round: tuple[Group, ...]
    stuck_round: tuple[Spec, ...]
    aggregate: Spec
    levels: int = 10
    rounds: int = 14
    init: tuple[float, ...] = (0.0, 0.25, 0.35, 0.25, 0.15)
    difficulty: tuple[float, ...] = (1 / 6,) * 6
    ceiling_offset: int = 0
    p_up: tuple[float, ...] = field(default=())
    p_down: float = 0.06
    p_stuck: float = 0.06
    p_stay_stuck: float = 0.75
    p_propose: float = 0.08
    p_propose_good: float = 0.6
    spawn_tokens: tuple[int, int] = (4, 12)
    usd_per_token: tuple[float, float] = (5e-6, 1e-6)  # orchestrator, others

    def up(self, mu: int) -> float:
        """Chance a working round lifts level ``mu`` by one (below the ceiling)."""
        if self.p_up:
            return self.p_up[mu]
        return 0.75 * (1.0 - mu / (self.levels + 2))

    def ceiling(self, difficulty: int) -> int:
        """The quality ceiling (a level) of a task of this difficulty."""
        floor = len(self.init) - 1
        return max(floor, min(self.levels, self.levels - difficulty - self.ceiling_offset))

    def ceiling_prior(self) -> FloatArray:
        """P(C = c) for c = 0..levels, from the difficulty distribution."""
        prior = np.zeros(self.levels + 1)
        for d, p in enumerate(self.difficulty):
            prior[self.ceiling(d)] += p
        return prior

    def round_tokens(self) -> float:
        """Expected tokens of a working round (aggregate included, spawns not)."""
        body = sum(g.p * sum(s.mean_tokens for s in g.events) for g in self.round)
        return body + self.aggregate.mean_tokens

    def stuck_tokens(self) -> float:
        """Expected tokens of a stuck round."""
        return sum(s.mean_tokens for s in self.stuck_round) + self.aggregate.mean_tokens

    def spawn_cost(self) -> float:
        """Expected tokens of the spawn events that open round 1."""
        return len(self.workers) * (self.spawn_tokens[0] + self.spawn_tokens[1]) / 2.0

    def first_return_tokens(self) -> float:
        """Expected tokens up to and including round 1's first ``return`` (always present)."""
        total = self.spawn_cost()
        for g in self.round:
            for s in g.events:
                total += g.p * s.mean_tokens
                if s.type == "return":
                    if g.p < 1.0:
                        raise ConfigError(f"topology {self.name}: the first return must always be present")
                    return total
        raise ConfigError(f"topology {self.name}: a round has no return event")


def _w(name: str, n: int) -> tuple[str, ...]:
    return tuple(f"{name}-{i}" for i in range(1, n + 1))


def _worker_block(w: str, tool: str, p_tool: float, lo: int, hi: int) -> tuple[Group, ...]:
    return (
        Group(1.0, (Spec("delegate", _ORCH, to=w, lo=4, hi=14),)),
        Group(p_tool, (Spec("tool_use", w, tool=tool, lo=8, hi=30, p_error=0.12),)),
        Group(1.0, (Spec("return", w, to=_ORCH, lo=lo, hi=hi),)),
    )


def _build_models() -> dict[str, TopologyModel]:
    agg = Spec("aggregate", _ORCH, lo=20, hi=60)
    models = {
        "centralized": TopologyModel(
            name="centralized",
            workers=_w("worker", 3),
            round=(
                *_worker_block("worker-1", "search", 0.7, 20, 70),
                *_worker_block("worker-2", "python", 0.5, 20, 70),
                Group(
                    0.5,
                    (
                        Spec("delegate", _ORCH, to="worker-3", lo=4, hi=14),
                        Spec("tool_use", "worker-3", tool="browser", lo=8, hi=30, p_error=0.15),
                        Spec("return", "worker-3", to=_ORCH, lo=20, hi=70),
                    ),
                ),
            ),
            stuck_round=(
                Spec("delegate", _ORCH, to="worker-1", lo=4, hi=14),
                Spec("tool_use", "worker-1", tool="search", lo=8, hi=30),
                Spec("return", "worker-1", to=_ORCH, lo=20, hi=70),
            ),
            aggregate=agg,
        ),
        "planner_executor_critic": TopologyModel(
            name="planner_executor_critic",
            workers=("planner", "executor", "critic"),
            round=(
                Group(1.0, (Spec("delegate", _ORCH, to="planner", lo=4, hi=14),)),
                Group(1.0, (Spec("return", "planner", to=_ORCH, lo=30, hi=90),)),
                Group(1.0, (Spec("delegate", _ORCH, to="executor", lo=4, hi=14),)),
                Group(1.0, (Spec("tool_use", "executor", tool="shell", lo=10, hi=40, p_error=0.15),)),
                Group(0.5, (Spec("tool_use", "executor", tool="editor", lo=10, hi=40, p_error=0.1),)),
                Group(1.0, (Spec("return", "executor", to=_ORCH, lo=20, hi=60),)),
                Group(0.8, (Spec("communicate", "critic", to="executor", lo=15, hi=50),)),
                Group(1.0, (Spec("return", "critic", to=_ORCH, lo=10, hi=40),)),
            ),
            stuck_round=(
                Spec("delegate", _ORCH, to="executor", lo=4, hi=14),
                Spec("tool_use", "executor", tool="shell", lo=10, hi=40),
                Spec("return", "executor", to=_ORCH, lo=20, hi=60),
                Spec("return", "critic", to=_ORCH, lo=10, hi=40),
            ),
            aggregate=agg,
            p_stuck=0.05,
            ceiling_offset=-1,
        ),
        "debate": TopologyModel(
            name="debate",
            workers=_w("debater", 3),
            round=(
                Group(1.0, (Spec("delegate", _ORCH, to="debater-1", lo=4, hi=14),)),
                Group(1.0, (Spec("delegate", _ORCH, to="debater-2", lo=4, hi=14),)),
                Group(1.0, (Spec("communicate", "debater-1", to="debater-2", lo=40, hi=120),)),
                Group(1.0, (Spec("communicate", "debater-2", to="debater-1", lo=40, hi=120),)),
                Group(0.6, (Spec("communicate", "debater-3", to="debater-1", lo=40, hi=120),)),
                Group(1.0, (Spec("return", "debater-1", to=_ORCH, lo=20, hi=60),)),
                Group(1.0, (Spec("return", "debater-2", to=_ORCH, lo=20, hi=60),)),
            ),
            stuck_round=(
                Spec("communicate", "debater-1", to="debater-2", lo=40, hi=120),
                Spec("communicate", "debater-2", to="debater-1", lo=40, hi=120),
                Spec("return", "debater-1", to=_ORCH, lo=20, hi=60),
            ),
            aggregate=Spec("aggregate", _ORCH, lo=30, hi=80),
            p_stuck=0.09,
            p_stay_stuck=0.8,
            p_up=tuple(0.85 * (1.0 - mu / 12) for mu in range(11)),
        ),
        "swarm": TopologyModel(
            name="swarm",
            workers=_w("agent", 4),
            round=(
                Group(1.0, (Spec("delegate", _ORCH, to="agent-1", lo=4, hi=14),)),
                Group(1.0, (Spec("communicate", "agent-1", to="agent-2", lo=15, hi=50),)),
                Group(0.6, (Spec("tool_use", "agent-2", tool="search", lo=8, hi=30, p_error=0.15),)),
                Group(0.6, (Spec("communicate", "agent-2", to="agent-3", lo=15, hi=50),)),
                Group(1.0, (Spec("return", "agent-2", to=_ORCH, lo=20, hi=60),)),
                Group(0.5, (Spec("communicate", "agent-3", to="agent-4", lo=15, hi=50),)),
                Group(0.5, (Spec("return", "agent-4", to=_ORCH, lo=20, hi=60),)),
            ),
            stuck_round=(
                Spec("communicate", "agent-1", to="agent-2", lo=15, hi=50),
                Spec("communicate", "agent-2", to="agent-1", lo=15, hi=50),
                Spec("return", "agent-2", to=_ORCH, lo=20, hi=60),
            ),
            aggregate=agg,
            p_stuck=0.12,
            p_stay_stuck=0.8,
            p_down=0.09,
            ceiling_offset=1,
        ),
        "hierarchical": TopologyModel(
            name="hierarchical",
            workers=("manager-1", "worker-1", "worker-2"),
            round=(
                Group(1.0, (Spec("delegate", _ORCH, to="manager-1", lo=4, hi=14),)),
                Group(1.0, (Spec("delegate", "manager-1", to="worker-1", lo=4, hi=14),)),
                Group(1.0, (Spec("tool_use", "worker-1", tool="python", lo=10, hi=40, p_error=0.12),)),
                Group(1.0, (Spec("return", "worker-1", to="manager-1", lo=20, hi=60),)),
                Group(
                    0.6,
                    (
                        Spec("delegate", "manager-1", to="worker-2", lo=4, hi=14),
                        Spec("tool_use", "worker-2", tool="search", lo=10, hi=40, p_error=0.12),
                        Spec("return", "worker-2", to="manager-1", lo=20, hi=60),
                    ),
                ),
                Group(1.0, (Spec("return", "manager-1", to=_ORCH, lo=30, hi=80),)),
            ),
            stuck_round=(
                Spec("delegate", "manager-1", to="worker-1", lo=4, hi=14),
                Spec("tool_use", "worker-1", tool="python", lo=10, hi=40),
                Spec("return", "worker-1", to="manager-1", lo=20, hi=60),
                Spec("return", "manager-1", to=_ORCH, lo=30, hi=80),
            ),
            aggregate=agg,
            p_stuck=0.07,
        ),
        "harness": TopologyModel(
            name="harness",
            workers=("agent",),
            round=(
                Group(1.0, (Spec("tool_use", "agent", tool="bash", lo=5, hi=20, p_error=0.2),)),
                Group(1.0, (Spec("return", "agent", to=_ORCH, lo=5, hi=25),)),
            ),
            stuck_round=(
                Spec("tool_use", "agent", tool="bash", lo=5, hi=20),
                Spec("return", "agent", to=_ORCH, lo=5, hi=25),
            ),
            aggregate=Spec("aggregate", _ORCH, lo=2, hi=10),
            rounds=20,
            p_up=tuple(0.6 * (1.0 - mu / 12) for mu in range(11)),
            p_stuck=0.08,
            p_stay_stuck=0.8,
            ceiling_offset=1,
            spawn_tokens=(2, 6),
        ),
    }
    return models


_MODELS: Final[dict[str, TopologyModel]] = _build_models()


def model_for(topology: str) -> TopologyModel:
    """The simulator's model of one topology."""
    try:
        return _MODELS[topology]
    except KeyError:
        raise ConfigError(
            f"--topology: {topology!r} is not one of {', '.join(SIM_TOPOLOGIES)}, all"
        ) from None


# --------------------------------------------------------------------------- optimum


@dataclass(frozen=True)
class OptimalRule:
    """The Bayes-optimal stop rule of one topology at one ``lam`` (per thousand tokens).

    ``stop[k, mu, m, n, z]`` says whether to stop at the end of round ``k``
    (1-based) in observable state (quality level ``mu`` read by the verifier,
    best level so far ``m``, working rounds spent at level ``m`` without a
    change ``n``, stuck flag ``z``). ``stop_first`` says whether to stop at the
    first decision point of the run (round 1's first return), before any
    answer exists. ``value`` is the expected value of the rule, ``V_0``.
    """

    lam: float
    stop: npt.NDArray[np.bool_]
    values: FloatArray
    stop_first: bool
    value: float


def posterior_above(model: TopologyModel, m: int, n: int) -> float:
    """P(C > m | best level m, n working rounds at level m without a change)."""
    prior = model.ceiling_prior()
    if m >= model.levels:
        return 0.0
    pu = model.up(m)
    pd = model.p_down if m > 0 else 0.0
    above = float(prior[m + 1 :].sum()) * (1.0 - pd - pu) ** n
    at = float(prior[m]) * (1.0 - pd) ** n
    if above + at <= 0.0:
        return 1.0 if at <= 0.0 else 0.0
    return above / (above + at)


def solve(model: TopologyModel, lam: float) -> OptimalRule:
    """Exact backward induction over the observable state (see ``docs/simulator.md``)."""
    levels, rounds = model.levels, model.rounds
    n_size = rounds + 2
    q = np.arange(levels + 1) / levels
    mu = np.arange(levels + 1)[:, None, None]
    m = np.arange(levels + 1)[None, :, None]
    n = np.arange(n_size)[None, None, :]
    pc = np.array([[posterior_above(model, mm, nn) for nn in range(n_size)] for mm in range(levels + 1)])
    up = np.array([model.up(x) for x in range(levels + 1)])[:, None, None]
    at_best = mu == m
    pu = up * np.where(at_best, pc[None, :, :], 1.0)
    pu = np.where(mu < levels, pu, 0.0)
    pd = np.where(mu > 0, model.p_down, 0.0) + 0.0 * pu
    ps = 1.0 - pu - pd
    idx_mu = np.broadcast_to(mu, pu.shape)
    idx_m = np.broadcast_to(m, pu.shape)
    idx_n = np.broadcast_to(n, pu.shape)
    down_mu = np.maximum(idx_mu - 1, 0)
    stay_n = np.minimum(idx_n + at_best, n_size - 1)
    up_mu = np.minimum(idx_mu + 1, levels)
    up_m = np.where(at_best, np.minimum(idx_m + 1, levels), idx_m)
    up_n = np.where(at_best, 0, idx_n)
    c_work = lam * model.round_tokens() / 1000.0
    c_stuck = lam * model.stuck_tokens() / 1000.0
    stop_q = np.broadcast_to(q[:, None, None, None], (levels + 1, levels + 1, n_size, 2))
    values = np.zeros((rounds + 1, levels + 1, levels + 1, n_size, 2))
    stop = np.zeros(values.shape, dtype=bool)
    values[rounds] = stop_q
    stop[rounds] = True
    p_next_stuck = (model.p_stuck, model.p_stay_stuck)
    for k in range(rounds - 1, 0, -1):
        nxt = values[k + 1]
        v_work = nxt[..., 0]
        e_work = (
            pd * v_work[down_mu, idx_m, idx_n]
            + ps * v_work[idx_mu, idx_m, stay_n]
            + pu * v_work[up_mu, up_m, up_n]
        )
        e_stuck = nxt[..., 1]
        for z in (0, 1):
            ps_z = p_next_stuck[z]
            cont = ps_z * (e_stuck - c_stuck) + (1.0 - ps_z) * (e_work - c_work)
            go_on = cont > stop_q[..., z]
            values[k][..., z] = np.where(go_on, cont, stop_q[..., z])
            stop[k][..., z] = ~go_on
    # round 1: first answer from ``init``; it is never stuck and reveals nothing of C
    e_first = sum(p * values[1][j, j, 0, 0] for j, p in enumerate(model.init))
    v_go = float(e_first) - lam * (model.spawn_cost() + model.round_tokens()) / 1000.0
    v_stop0 = -lam * model.first_return_tokens() / 1000.0
    stop_first = v_stop0 >= v_go
    return OptimalRule(lam, stop, values, stop_first, max(v_stop0, v_go))


# --------------------------------------------------------------------------- generation


@dataclass
class _Skeleton:
    """A run's course round by round, drawn from its own random stream: everything that
    decides where any rule stops and how many decision points there are, and nothing else."""

    states: list[tuple[int, int, int, int]]  # (mu, m, n, z) after each round
    present: list[tuple[bool, ...] | None]  # per working round, which groups ran (None: stuck)
    proposals: list[bool]
    dp_per_round: list[int]

    def dp_total(self) -> int:
        return sum(self.dp_per_round)

    def round_of_dp(self, count: int) -> int:
        """The round (1-based) holding the ``count``-th decision point."""
        seen = 0
        for k, per in enumerate(self.dp_per_round, start=1):
            seen += per
            if seen >= count:
                return k
        return len(self.dp_per_round)


def _skeleton(model: TopologyModel, rng: random.Random, ceiling: int) -> _Skeleton:
    comp = _compiled(model)
    rand = rng.random
    states: list[tuple[int, int, int, int]] = []
    present: list[tuple[bool, ...] | None] = []
    proposals: list[bool] = []
    dp_per_round: list[int] = []
    ups, p_prop, p_down = comp.ups, comp.p_propose, model.p_down
    p_stuck, p_stay = model.p_stuck, model.p_stay_stuck
    groups = tuple(zip((p for p, _ in comp.round), comp.round_dps, strict=True))
    mu = _pick(rng, model.init)
    best, n_best = mu, 0
    stuck = False
    for k in range(model.rounds):
        if k:
            stuck = rand() < (p_stay if stuck else p_stuck)
            if not stuck:
                u = rand()
                pd = p_down if mu > 0 else 0.0
                if u < pd:
                    mu -= 1
                elif mu < ceiling and u < pd + ups[mu]:
                    mu += 1
                    if mu > best:
                        best, n_best = mu, 0
                elif mu == best:
                    n_best += 1
        if stuck:
            present.append(None)
            dps = comp.stuck_dps
        else:
            mask: list[bool] = []
            dps = 0
            for p, n in groups:
                ran = p >= 1.0 or rand() < p
                mask.append(ran)
                if ran:
                    dps += n
            present.append(tuple(mask))
        proposed = rand() < p_prop[mu]
        states.append((mu, best, n_best, int(stuck)))
        proposals.append(proposed)
        dp_per_round.append(dps + 2 + proposed)  # + aggregate, reward (+ proposal)
    return _Skeleton(states, present, proposals, dp_per_round)


@dataclass
class _Run:
    events: list[dict[str, Any]]
    dp: list[int]  # indices of decision-point events
    dp_grade: list[float]  # grade in force at each decision point
    round_end: list[int]  # last event of each round (index k-1 for round k)
    round_reward: list[int]  # the reward event of each round
    round_grade: list[float]
    round_tokens: list[int]  # tokens up to and including each round's last event
    first_return: int
    first_return_tokens: int


_IDS: Final[list[str]] = [f"e{i}" for i in range(4096)]
_DP_TYPES: Final = frozenset({"return", "aggregate", "reward"})


def _event_id(i: int) -> str:
    return _IDS[i] if i < len(_IDS) else f"e{i}"


@dataclass(frozen=True, slots=True)
class _Slot:
    """A :class:`Spec` precompiled for the hot loop."""

    template: dict[str, Any]
    lo: int
    span: int
    p_error: float
    nano_usd: int  # price per token in 1e-9 USD (integer, so usd prints short)
    tool: bool
    ref: bool
    ret: bool
    dp: bool


def _slot(spec: Spec, model: TopologyModel) -> _Slot:
    template: dict[str, Any] = {"type": spec.type, "agent": spec.agent}
    if spec.to is not None:
        template["to"] = spec.to
    if spec.tool is not None:
        template["tool"] = spec.tool
    price = model.usd_per_token[0] if spec.agent == _ORCH else model.usd_per_token[1]
    return _Slot(
        template,
        spec.lo,
        spec.hi - spec.lo + 1,
        spec.p_error,
        round(price * 1e9),
        spec.tool is not None,
        spec.type not in ("delegate", "spawn"),
        spec.type == "return",
        spec.type in _DP_TYPES,
    )


@dataclass(frozen=True)
class _Compiled:
    spawns: tuple[_Slot, ...]
    round: tuple[tuple[float, tuple[_Slot, ...]], ...]
    round_dps: tuple[int, ...]  # decision points per group
    stuck: tuple[_Slot, ...]
    stuck_dps: int
    aggregate: _Slot
    ups: tuple[float, ...]  # p_up per level
    p_propose: tuple[float, ...]  # chance of a stop proposal per verifier level


_COMPILED: dict[int, _Compiled] = {}


def _compiled(model: TopologyModel) -> _Compiled:
    c = _COMPILED.get(id(model))
    if c is None:
        lo, hi = model.spawn_tokens
        groups = tuple((g.p, tuple(_slot(s, model) for s in g.events)) for g in model.round)
        stuck = tuple(_slot(s, model) for s in model.stuck_round)
        c = _Compiled(
            tuple(_slot(Spec("spawn", _ORCH, to=w, lo=lo, hi=hi), model) for w in model.workers),
            groups,
            tuple(sum(s.dp for s in slots) for _, slots in groups),
            stuck,
            sum(s.dp for s in stuck),
            _slot(model.aggregate, model),
            tuple(model.up(mu) for mu in range(model.levels + 1)),
            tuple(
                model.p_propose + model.p_propose_good * max(0.0, mu / model.levels - 0.5) * 2.0
                for mu in range(model.levels + 1)
            ),
        )
        if model is _MODELS.get(model.name):  # cache the shipped models only (ids of others recycle)
            _COMPILED[id(model)] = c
    return c


def _grade(rng: random.Random, mean: float, noise: float) -> float:
    # symmetric truncation keeps the deviation zero-mean and the grade in [0, 1]
    half = min(mean, 1.0 - mean)
    dev = rng.gauss(0.0, noise) if noise > 0 else 0.0
    dev = max(-half, min(half, dev))
    return round(mean + dev, 4)


def _contribute(events: list[dict[str, Any]], start: int, d_level: float, d_grade: float) -> None:
    """The offline label ``contribution`` of a round's ``return``s and ``aggregate`` (events from ``start``).

    The round's level change ``d_level`` is split over its returns and its aggregate in
    proportion to their tokens; the aggregate (the last of them) also carries the change of
    the answer's own deviation, ``d_grade - d_level``. So a round's contributions sum to its
    change of grade (docs/simulator.md, "Contribution"). No random draw: the runs are unchanged.
    ``start = -1``: the returns after the last aggregate (a run stopped mid-round) get 0.
    """
    if start < 0:
        start = next((i + 1 for i in range(len(events) - 1, -1, -1) if events[i]["type"] == "aggregate"), 0)
    carriers = [ev for ev in events[start:] if ev["type"] in ("return", "aggregate")]
    if not carriers:
        return
    total = sum(ev["tokens"] for ev in carriers)
    for ev in carriers:
        ev["contribution"] = round(d_level * ev["tokens"] / total, 6) if total else 0.0
    if carriers[-1]["type"] == "aggregate":
        carriers[-1]["contribution"] = round(carriers[-1]["contribution"] + d_grade - d_level, 6)


def _pick(rng: random.Random, probs: Sequence[float]) -> int:
    u = rng.random()
    acc = 0.0
    for i, p in enumerate(probs):
        acc += p
        if u < acc:
            return i
    return len(probs) - 1


def _materialize(
    model: TopologyModel, skel: _Skeleton, rng: random.Random, noise: float, rounds: int
) -> _Run:
    """The events of the first ``rounds`` rounds of ``skel``; details (tokens, times, refs,
    errors, grade deviations) from ``rng``.

    Written for speed (this loop is the simulator's cost): plain dicts, integer
    milliseconds and nano-dollars, no pydantic; the tests validate the output.
    """
    comp = _compiled(model)
    rand = rng.random
    bits = rng.getrandbits
    events: list[dict[str, Any]] = []
    append = events.append
    dp: list[int] = []
    dp_grade: list[float] = []
    t_ms = 0
    tokens_total = 0
    q = 0.0
    first_return = -1
    first_return_tokens = 0
    ids, n_ids = _IDS, len(_IDS)

    def emit(slot: _Slot, ref: str | None, error: bool) -> None:
        nonlocal t_ms, tokens_total, first_return, first_return_tokens
        tok = slot.lo + int(rand() * slot.span)
        t_ms += 50 + 20 * tok + int(rand() * (2000 if slot.tool else 200))
        i = len(events)
        ev = {"id": ids[i] if i < n_ids else f"e{i}", "t": t_ms / 1000, **slot.template}
        if ref is not None:
            ev["content_ref"] = ref
        ev["tokens"] = tok
        ev["usd"] = tok * slot.nano_usd / 1e9
        if error:
            ev["error"] = True
        tokens_total += tok
        append(ev)
        if slot.dp:
            dp.append(i)
            dp_grade.append(q)
            if slot.ret and first_return < 0:
                first_return, first_return_tokens = i, tokens_total

    def info(kind: str, agent: str, extra: dict[str, Any]) -> int:
        nonlocal t_ms
        t_ms += 50 + int(rand() * 200)
        i = len(events)
        append({"id": _event_id(i), "t": t_ms / 1000, "type": kind, "agent": agent, **extra})
        dp.append(i)
        dp_grade.append(q)
        return i

    for slot in comp.spawns:
        emit(slot, None, False)
    levels = model.levels
    round_end: list[int] = []
    round_reward: list[int] = []
    round_grade: list[float] = []
    round_tokens: list[int] = []
    agg_ref = ""
    loop_refs: list[str] = []
    loop_errors: list[bool] = []
    level = 0.0  # the answer's level before the round (no answer yet: 0)
    for k in range(rounds):
        mu = skel.states[k][0]
        mask = skel.present[k]
        start, q_before = len(events), q
        if mask is None:
            if not loop_refs:
                loop_refs = [f"{bits(48):012x}" for _ in comp.stuck]
                loop_errors = [s.tool and rand() < 0.7 for s in comp.stuck]
            for slot, ref, err in zip(comp.stuck, loop_refs, loop_errors, strict=True):
                emit(slot, ref, err)
        else:
            loop_refs = []
            for ran, (_, slots) in zip(mask, comp.round, strict=True):
                if not ran:
                    continue
                for slot in slots:
                    if slot.ref:
                        err = slot.p_error > 0.0 and rand() < slot.p_error
                        emit(slot, f"{bits(48):012x}", err)
                    else:
                        emit(slot, None, False)
            agg_ref = f"{bits(48):012x}"
            # a new answer: its grade is set before the aggregate counts as a decision point
            q = _grade(rng, mu / levels, noise)
        emit(comp.aggregate, agg_ref, False)
        events[-1]["grade"] = q
        _contribute(events, start, mu / levels - level, q - q_before)
        level = mu / levels
        value = mu / levels
        round_reward.append(
            info("reward", _VERIFIER, {"tokens": 0, "usd": 0.0, "value": value, "channel": "quality"})
        )
        if skel.proposals[k]:
            info("stop", _ORCH, {"tokens": 0, "usd": 0.0, "reason": "information_complete", "proposed": True})
        round_end.append(len(events) - 1)
        round_grade.append(q)
        round_tokens.append(tokens_total)
    return _Run(
        events,
        dp,
        dp_grade,
        round_end,
        round_reward,
        round_grade,
        round_tokens,
        first_return,
        first_return_tokens,
    )


def _behavior_stop(
    model: TopologyModel, skel: _Skeleton, behavior: int, param: float
) -> tuple[int, str, str, str]:
    """Where the behavior stops: (round, 1-based; the event in it: "dp", "reward",
    "proposal" or "cap"; stop reason; who stopped)."""
    if behavior == 0 and param <= skel.dp_total():
        return skel.round_of_dp(int(param)), "dp", "budget_exhausted", "safety_net"
    if behavior == 1:
        for k, (mu, *_) in enumerate(skel.states, start=1):
            if mu / model.levels >= param:
                return k, "reward", "quality_met", "orchestrator"
    if behavior == 2 and any(skel.proposals):
        return skel.proposals.index(True) + 1, "proposal", "information_complete", "orchestrator"
    return model.rounds, "cap", "budget_exhausted", "safety_net"


def _stop_index(run: _Run, k: int, where: str, param: float) -> int:
    if where == "dp":
        return run.dp[int(param) - 1]
    if where == "reward":
        return run.round_reward[k - 1]
    return run.round_end[k - 1]


def _optimal_round(skel: _Skeleton, rule: OptimalRule) -> int:
    """The round after which the optimal rule stops; 0 for round 1's first return."""
    if rule.stop_first:
        return 0
    for k, state in enumerate(skel.states, start=1):
        if rule.stop[(k, *state)]:
            return k
    raise AssertionError("the optimal rule always stops by the hard cap")  # pragma: no cover


def _optimal_stop(run: _Run, k: int) -> tuple[int, float, int]:
    """Where the optimal rule stops (round ``k``): event index, grade there, tokens so far."""
    if k == 0:
        return run.first_return, 0.0, run.first_return_tokens
    return run.round_end[k - 1], run.round_grade[k - 1], run.round_tokens[k - 1]


def _task_plan(n: int, seed: int, topology: str) -> Iterator[tuple[int, str, int]]:
    """(task index, topology, difficulty) for each of ``n`` runs; 2-4 runs per task."""
    rng = random.Random(f"stopserve-sim:{seed}:tasks")
    made = task = 0
    topologies = SIM_TOPOLOGIES if topology == "all" else (topology,)
    while made < n:
        topo = topologies[task % len(topologies)]
        model = _MODELS[topo]
        difficulty = _pick(rng, model.difficulty)
        for _ in range(min(2 + int(rng.random() * 3), n - made)):
            yield task, topo, difficulty
            made += 1
        task += 1


def simulate(
    n: int,
    *,
    seed: int = 0,
    topology: str = "all",
    optimal_lambda: float | None = None,
    run_to_cap: bool = False,
    noise: float = DEFAULT_NOISE,
) -> Iterator[dict[str, Any]]:
    """Yield ``n`` format-v1 traces as JSON-ready dicts (deterministic for ``seed``).

    With ``optimal_lambda`` each trace's ``metrics`` carries ``optimal_value``,
    ``optimal_lambda`` and ``optimal_stop_index``. With ``run_to_cap`` every run
    goes on to the hard cap and every decision point carries ``grade``.
    """
    if topology != "all":
        model_for(topology)
    if not (noise >= 0 and math.isfinite(noise)):
        raise ConfigError(f"--noise: expected a finite number >= 0, got {noise}")
    rules: dict[str, OptimalRule] = {}
    if optimal_lambda is not None:
        for topo in SIM_TOPOLOGIES if topology == "all" else (topology,):
            rules[topo] = solve(_MODELS[topo], optimal_lambda)
    for i, (task, topo, difficulty) in enumerate(_task_plan(n, seed, topology)):
        model = _MODELS[topo]
        rng = random.Random(f"stopserve-sim:{seed}:{i}")
        behavior = _pick(rng, (0.34, 0.33, 0.33))
        if behavior == 0:
            per_round = 2 + sum(g.p for g in model.round for s in g.events if s.type == "return")
            param = float(int(per_round * (1 + rng.random() * (model.rounds - 1) * 0.6)))
        elif behavior == 1:
            param = round(0.5 + 0.4 * rng.random(), 2)
        else:
            param = 0.0
        skel = _skeleton(model, rng, model.ceiling(difficulty))
        stop = _behavior_stop(model, skel, behavior, param)
        rule = rules.get(topo)
        opt_round = -1 if rule is None else _optimal_round(skel, rule)
        rounds = model.rounds if run_to_cap else max(stop[0], opt_round, 1)
        detail = random.Random(f"stopserve-sim:{seed}:{i}:detail")
        run = _materialize(model, skel, detail, noise, rounds)
        yield _finish(
            run,
            skel,
            stop,
            opt_round,
            i=i,
            seed=seed,
            task=task,
            topo=topo,
            model=model,
            difficulty=difficulty,
            behavior=behavior,
            param=param,
            rule=rule,
            run_to_cap=run_to_cap,
        )


def _finish(
    run: _Run,
    skel: _Skeleton,
    stop_at: tuple[int, str, str, str],
    opt_round: int,
    *,
    i: int,
    seed: int,
    task: int,
    topo: str,
    model: TopologyModel,
    difficulty: int,
    behavior: int,
    param: float,
    rule: OptimalRule | None,
    run_to_cap: bool,
) -> dict[str, Any]:
    metrics: dict[str, float] = {
        "behavior_policy": float(behavior),
        "behavior_param": param,
        "task_difficulty": float(difficulty),
        "quality_ceiling": model.ceiling(difficulty) / model.levels,
    }
    k_stop, where, reason, by = stop_at
    b_stop = _stop_index(run, k_stop, where, param)
    max_turns = int(param) if where == "dp" else skel.dp_total()  # the cap in force, in decision points
    if run_to_cap:
        end, reason, by = run.round_end[-1], "budget_exhausted", "safety_net"
        metrics["behavior_stop_index"] = float(b_stop)
        metrics["run_to_cap"] = 1.0
        events = run.events
        for j, grade in zip(run.dp, run.dp_grade, strict=True):
            events[j]["grade"] = grade
        max_turns = skel.dp_total()
    else:
        end = b_stop
        events = run.events[: end + 1]
        _contribute(events, -1, 0.0, 0.0)  # a round cut before its aggregate wrote no answer
    if rule is not None:
        opt, q_opt, c_opt = _optimal_stop(run, opt_round)
        metrics["optimal_value"] = q_opt - rule.lam * (c_opt / 1000.0)
        metrics["optimal_lambda"] = rule.lam
        metrics["optimal_stop_index"] = float(opt)
        metrics["optimal_grade"] = q_opt
        metrics["optimal_ktokens"] = c_opt / 1000.0
        if opt > end:
            metrics["optimal_after_end"] = 1.0
    t_end = events[-1]["t"]
    stop_event: dict[str, Any] = {
        "id": f"e{len(events)}",
        "t": t_end,
        "type": "stop",
        "agent": _ORCH,
        "reason": reason,
        "proposed": False,
        "tokens": 0,
        "usd": 0.0,
    }
    stop: dict[str, Any] = {"reason": reason, "by": by, "t": t_end}
    if reason == "budget_exhausted":
        stop["limit"] = "turns"
    final_q = run.dp_grade[bisect.bisect_left(run.dp, end)]  # every stop is at a decision point
    return {
        "format": "stopserve.trace/1",
        "trace_id": f"sim-{seed}-{i}",
        "task_id": f"simtask-{seed}-{task}",
        "system": f"{SYSTEM}/{BEHAVIORS[behavior]}",
        "topology": topo,
        "events": [*events, stop_event],
        "rewards": {"team": final_q},
        "stop": stop,
        "budget": {"max_turns": max_turns},
        "metrics": metrics,
    }


# --------------------------------------------------------------------------- failure modes

#: The failure modes of a stop decision, as :func:`failure_modes` names them.
FAILURE_MODES: Final[tuple[str, ...]] = ("premature", "delayed", "loop")


def failure_modes(trace: Mapping[str, Any], stop_index: int) -> dict[str, bool]:
    """Which failure modes a stop right after event ``stop_index`` shows, against the optimum.

    Needs a trace made with ``--optimal``; values are ``q - lam * ktokens`` at that
    ``lam``. ``premature``: stopped before the optimal point, for less value (e.g. a
    stop proposal accepted too early). ``delayed``: stopped after it, for less value
    (quality flat, cost rising). ``loop``: went on through 2 or more stuck rounds
    (an aggregate repeating the previous one's content ref) past the optimal point.
    A behavior's own stop is the event before the final ``stop`` event:
    ``len(trace["events"]) - 2``.

    >>> t = next(simulate(1, seed=0, optimal_lambda=0.1))
    >>> sorted(failure_modes(t, len(t["events"]) - 2))
    ['delayed', 'loop', 'premature']
    """
    metrics = trace.get("metrics") or {}
    if "optimal_stop_index" not in metrics:
        raise ConfigError(
            f"trace {trace.get('trace_id')!r}: no metrics.optimal_stop_index (simulate --optimal)"
        )
    events = trace["events"]
    opt = int(metrics["optimal_stop_index"])
    q_stop = 0.0
    tokens = 0
    stuck_after_opt = 0
    previous_ref: object = None
    for i, event in enumerate(events[: stop_index + 1]):
        tokens += int(event.get("tokens") or 0)
        if event.get("type") != "aggregate":
            continue
        if i > opt and event.get("content_ref") == previous_ref:
            stuck_after_opt += 1
        previous_ref = event.get("content_ref")
        q_stop = float(event.get("grade", q_stop))
    worse = q_stop - float(metrics["optimal_lambda"]) * tokens / 1000.0 < float(metrics["optimal_value"])
    return {
        "premature": stop_index < opt and worse,
        "delayed": stop_index > opt and worse,
        "loop": stuck_after_opt >= 2,
    }


# --------------------------------------------------------------------------- command


def simulate_command(args: argparse.Namespace) -> int:
    """``stopserve simulate``: write ``--n`` traces to ``-o``; print a one-line summary."""
    if args.optimal and args.lam is None:
        raise ConfigError("--optimal needs --lambda X (cost weight per thousand tokens)")
    # a lambda alone also attaches the optimum: the simulator has no other use for it
    noise = DEFAULT_NOISE if args.noise is None else args.noise
    out = Path(args.output)
    traces = simulate(
        args.n,
        seed=args.seed,
        topology=args.topology,
        optimal_lambda=args.lam,
        run_to_cap=args.run_to_cap,
        noise=noise,
    )
    first = next(traces)  # bad options raise here, before the output file is created
    start = time.perf_counter()
    with TraceWriter(out) as writer:
        writer.write(first)  # validated, like every VALIDATE_EVERY-th trace: a cheap guard
        for i, trace in enumerate(traces, start=1):
            writer.write(trace, validate=i % VALIDATE_EVERY == 0)
    elapsed = time.perf_counter() - start
    print(f"wrote {writer.count} traces to {out} in {elapsed:.1f}s", file=sys.stderr)
    return 0
