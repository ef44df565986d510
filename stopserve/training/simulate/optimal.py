"""The exact optimum: Bayes-optimal stop rule of a topology by backward induction over its observable state.

``docs/simulator.md`` gives the state and the recursion.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stopserve.training.simulate.topology import FloatArray, TopologyModel

__all__ = ["OptimalRule", "posterior_above", "solve"]


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
