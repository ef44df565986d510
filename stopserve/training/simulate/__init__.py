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

The package: :mod:`~stopserve.training.simulate.topology` (the topologies' data),
:mod:`~stopserve.training.simulate.optimal` (the exact DP solver),
:mod:`~stopserve.training.simulate.generate`
(traces, behavior stops, failure modes); the command is :mod:`stopserve.cli.simulate`.
"""

from __future__ import annotations

from stopserve.training.simulate.generate import (
    BEHAVIORS,
    DEFAULT_NOISE,
    FAILURE_MODES,
    failure_modes,
    simulate,
)
from stopserve.training.simulate.optimal import OptimalRule, posterior_above, solve
from stopserve.training.simulate.topology import SIM_TOPOLOGIES, Group, Spec, TopologyModel, model_for

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
    "solve",
]
