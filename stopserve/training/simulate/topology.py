"""The simulator's topologies: event slots, dynamics and costs of each (data, plus what the DP reads).

See ``docs/simulator.md`` for the generative model these parameters drive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from stopserve.errors import ConfigError

__all__ = ["MODELS", "ORCHESTRATOR", "SIM_TOPOLOGIES", "Group", "Spec", "TopologyModel", "model_for"]

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
#: The agent that delegates, aggregates and stops.
ORCHESTRATOR: Final = "orchestrator"


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
        Group(1.0, (Spec("delegate", ORCHESTRATOR, to=w, lo=4, hi=14),)),
        Group(p_tool, (Spec("tool_use", w, tool=tool, lo=8, hi=30, p_error=0.12),)),
        Group(1.0, (Spec("return", w, to=ORCHESTRATOR, lo=lo, hi=hi),)),
    )


def _build_models() -> dict[str, TopologyModel]:
    agg = Spec("aggregate", ORCHESTRATOR, lo=20, hi=60)
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
                        Spec("delegate", ORCHESTRATOR, to="worker-3", lo=4, hi=14),
                        Spec("tool_use", "worker-3", tool="browser", lo=8, hi=30, p_error=0.15),
                        Spec("return", "worker-3", to=ORCHESTRATOR, lo=20, hi=70),
                    ),
                ),
            ),
            stuck_round=(
                Spec("delegate", ORCHESTRATOR, to="worker-1", lo=4, hi=14),
                Spec("tool_use", "worker-1", tool="search", lo=8, hi=30),
                Spec("return", "worker-1", to=ORCHESTRATOR, lo=20, hi=70),
            ),
            aggregate=agg,
        ),
        "planner_executor_critic": TopologyModel(
            name="planner_executor_critic",
            workers=("planner", "executor", "critic"),
            round=(
                Group(1.0, (Spec("delegate", ORCHESTRATOR, to="planner", lo=4, hi=14),)),
                Group(1.0, (Spec("return", "planner", to=ORCHESTRATOR, lo=30, hi=90),)),
                Group(1.0, (Spec("delegate", ORCHESTRATOR, to="executor", lo=4, hi=14),)),
                Group(1.0, (Spec("tool_use", "executor", tool="shell", lo=10, hi=40, p_error=0.15),)),
                Group(0.5, (Spec("tool_use", "executor", tool="editor", lo=10, hi=40, p_error=0.1),)),
                Group(1.0, (Spec("return", "executor", to=ORCHESTRATOR, lo=20, hi=60),)),
                Group(0.8, (Spec("communicate", "critic", to="executor", lo=15, hi=50),)),
                Group(1.0, (Spec("return", "critic", to=ORCHESTRATOR, lo=10, hi=40),)),
            ),
            stuck_round=(
                Spec("delegate", ORCHESTRATOR, to="executor", lo=4, hi=14),
                Spec("tool_use", "executor", tool="shell", lo=10, hi=40),
                Spec("return", "executor", to=ORCHESTRATOR, lo=20, hi=60),
                Spec("return", "critic", to=ORCHESTRATOR, lo=10, hi=40),
            ),
            aggregate=agg,
            p_stuck=0.05,
            ceiling_offset=-1,
        ),
        "debate": TopologyModel(
            name="debate",
            workers=_w("debater", 3),
            round=(
                Group(1.0, (Spec("delegate", ORCHESTRATOR, to="debater-1", lo=4, hi=14),)),
                Group(1.0, (Spec("delegate", ORCHESTRATOR, to="debater-2", lo=4, hi=14),)),
                Group(1.0, (Spec("communicate", "debater-1", to="debater-2", lo=40, hi=120),)),
                Group(1.0, (Spec("communicate", "debater-2", to="debater-1", lo=40, hi=120),)),
                Group(0.6, (Spec("communicate", "debater-3", to="debater-1", lo=40, hi=120),)),
                Group(1.0, (Spec("return", "debater-1", to=ORCHESTRATOR, lo=20, hi=60),)),
                Group(1.0, (Spec("return", "debater-2", to=ORCHESTRATOR, lo=20, hi=60),)),
            ),
            stuck_round=(
                Spec("communicate", "debater-1", to="debater-2", lo=40, hi=120),
                Spec("communicate", "debater-2", to="debater-1", lo=40, hi=120),
                Spec("return", "debater-1", to=ORCHESTRATOR, lo=20, hi=60),
            ),
            aggregate=Spec("aggregate", ORCHESTRATOR, lo=30, hi=80),
            p_stuck=0.09,
            p_stay_stuck=0.8,
            p_up=tuple(0.85 * (1.0 - mu / 12) for mu in range(11)),
        ),
        "swarm": TopologyModel(
            name="swarm",
            workers=_w("agent", 4),
            round=(
                Group(1.0, (Spec("delegate", ORCHESTRATOR, to="agent-1", lo=4, hi=14),)),
                Group(1.0, (Spec("communicate", "agent-1", to="agent-2", lo=15, hi=50),)),
                Group(0.6, (Spec("tool_use", "agent-2", tool="search", lo=8, hi=30, p_error=0.15),)),
                Group(0.6, (Spec("communicate", "agent-2", to="agent-3", lo=15, hi=50),)),
                Group(1.0, (Spec("return", "agent-2", to=ORCHESTRATOR, lo=20, hi=60),)),
                Group(0.5, (Spec("communicate", "agent-3", to="agent-4", lo=15, hi=50),)),
                Group(0.5, (Spec("return", "agent-4", to=ORCHESTRATOR, lo=20, hi=60),)),
            ),
            stuck_round=(
                Spec("communicate", "agent-1", to="agent-2", lo=15, hi=50),
                Spec("communicate", "agent-2", to="agent-1", lo=15, hi=50),
                Spec("return", "agent-2", to=ORCHESTRATOR, lo=20, hi=60),
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
                Group(1.0, (Spec("delegate", ORCHESTRATOR, to="manager-1", lo=4, hi=14),)),
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
                Group(1.0, (Spec("return", "manager-1", to=ORCHESTRATOR, lo=30, hi=80),)),
            ),
            stuck_round=(
                Spec("delegate", "manager-1", to="worker-1", lo=4, hi=14),
                Spec("tool_use", "worker-1", tool="python", lo=10, hi=40),
                Spec("return", "worker-1", to="manager-1", lo=20, hi=60),
                Spec("return", "manager-1", to=ORCHESTRATOR, lo=30, hi=80),
            ),
            aggregate=agg,
            p_stuck=0.07,
        ),
        "harness": TopologyModel(
            name="harness",
            workers=("agent",),
            round=(
                Group(1.0, (Spec("tool_use", "agent", tool="bash", lo=5, hi=20, p_error=0.2),)),
                Group(1.0, (Spec("return", "agent", to=ORCHESTRATOR, lo=5, hi=25),)),
            ),
            stuck_round=(
                Spec("tool_use", "agent", tool="bash", lo=5, hi=20),
                Spec("return", "agent", to=ORCHESTRATOR, lo=5, hi=25),
            ),
            aggregate=Spec("aggregate", ORCHESTRATOR, lo=2, hi=10),
            rounds=20,
            p_up=tuple(0.6 * (1.0 - mu / 12) for mu in range(11)),
            p_stuck=0.08,
            p_stay_stuck=0.8,
            ceiling_offset=1,
            spawn_tokens=(2, 6),
        ),
    }
    return models


#: The shipped model of each topology.
MODELS: Final[dict[str, TopologyModel]] = _build_models()


def model_for(topology: str) -> TopologyModel:
    """The simulator's model of one topology."""
    try:
        return MODELS[topology]
    except KeyError:
        raise ConfigError(f"topology: {topology!r} is not one of {', '.join(SIM_TOPOLOGIES)}, all") from None
