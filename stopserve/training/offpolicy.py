"""Off-policy evaluation of stop policies on runs logged by another policy.

A stop policy is a sequence of continue/stop actions. Replayed on a logged run (through
its own ``Policy.decide``, :mod:`stopserve.training.replay`), a policy π either stops at
a decision point the log holds -- its value there, ``q_t − λ·c_t``, is read from the log
whatever the logging policy did next -- or goes on past the point where the logging
policy stopped the run, and then the log says nothing of what it would have got. What
the log does show is how likely it was to show it: at each point the logging policy
*continued*, the decision it logged carries the probability of that continue
(``decision.propensity``: 1 unless it explored, ε where an explorable stop became a
continue, ``stopserve.policy``).

**Importance sampling (IS).** A run's figure for π is its value at π's stop times
``W = Π 1/μ_t(continue)`` over the points before that stop, or 0 where the logging policy
stopped the run before π would have (``W = 0``). Averaged over runs it is unbiased for π's
value wherever every stop of the logging policy that π goes past could have been
explored (``μ(continue) > 0``); a run that only goes on past a stop no exploration could
undo (a budget, a rule the model may not overrule) is *unsupported*: nothing unbiased can
be said of it.

**Doubly robust (DR).** The same recursion with a model of the value of going on,
``Q̂_t = q_t − λ·c_t + V̂_t`` (``V̂``: a learned policy's value of continuing, ``v_stop``;
0 without one: "going on is worth what stopping now is"), as a control variate (Jiang &
Li, 2016, per decision)::

    D_t = r_t                                   π stops at t
    D_t = Q̂_t + (c_t / μ_t) · (D_{t+1} − Q̂_t)   π goes on at t; c_t = 1 if the log went on
    D_{T+1} = the logged end                    the run ended on its own after its last point

It is unbiased under the same condition whatever the model, and falls back on the model
on unsupported runs. Intervals are percentile bootstraps (90%) over runs, or over whole
groups (a task's runs together); differences between policies are paired (the same
resampled runs). Each figure says how many runs support it, and when too few do.

>>> ev = evaluate_logged({"candidate": cand, "champion": champ}, dp, stops, lam=0.1)  # doctest: +SKIP
>>> ev.difference("candidate", "champion")                                         # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from stopserve.errors import TrainingError
from stopserve.objective import Objective
from stopserve.policy import Policy
from stopserve.training.labels import DecisionPoints, FloatArray, IntArray

__all__ = [
    "MAX_UNSUPPORTED",
    "MIN_ESS_SHARE",
    "MIN_RUNS",
    "MIN_WEIGHTED",
    "Estimate",
    "LoggedEvaluation",
    "RunValues",
    "continue_propensity",
    "evaluate_logged",
    "per_run_values",
    "supported_at_any_count",
    "value_model",
]

#: Fewer logged runs than this: no figure is given as evidence.
MIN_RUNS: Final = 50
#: Above this share of runs a policy goes on past a stop no exploration could undo: too few supported.
MAX_UNSUPPORTED: Final = 0.05
#: A policy that goes on past explorable stops needs at least this many explored runs showing what
#: follows (fewer, and the bootstrap of a handful of weights of 1/ε says little of the tail). It was
#: 10: on the deployment simulator every figure it refused with its lower end above 0 (9 of 9) was
#: right about the truth (bench/NOTES.md); 5 admits those with 5 to 9 explored runs.
MIN_WEIGHTED: Final = 5
#: ... and an effective sample size (Kish's, of the IS weights over all runs) of at least this share
#: of the runs: a few explored runs weighted by 1/ε each, standing for many zeroed ones, give a
#: bootstrap interval far narrower than the estimate's error. On the deployment simulator the three
#: promotions that lowered the true value had 2.1%, 2.6% and 4.2% (two never-stop rules and a turn
#: cap, going on past the logged stop on 58% to 83% of the runs), and every promotion that raised it
#: at least 14%; at 10% this refused a candidate with 9.2% that was better in truth (bench/NOTES.md).
MIN_ESS_SHARE: Final = 0.06
N_BOOT: Final = 1000
#: Quantiles of the reported intervals (a 90% interval; its lower end is the promotion gate's bound).
LOWER: Final = 0.05
UPPER: Final = 0.95
_CHUNK: Final = 128

Estimator = Literal["ips", "dr"]


def continue_propensity(dp: DecisionPoints) -> tuple[FloatArray, FloatArray]:
    """Per decision point: whether the log went on past it (1 or 0), and the probability it did.

    The logging policy stopped the run at a trace's last point when the decision logged
    there says stop; anywhere else it went on (a stop the caller did not act on, or no
    decision asked: probability 1; an explored continue: its propensity). Where it stopped,
    the probability it would have gone on is ``1 − propensity``: 0 for a stop nothing explores.
    """
    stopped = dp.cut
    went_on = (~stopped).astype(np.float64)
    p = np.clip(dp.propensity, 0.0, 1.0)
    mu = np.where(stopped, 1.0 - p, np.where(dp.logged_stop, 1.0, p))
    return went_on, np.asarray(mu, dtype=np.float64)


@dataclass(frozen=True)
class RunValues:
    """One policy's per-run figures on the logged runs (see :func:`per_run_values`)."""

    ips: FloatArray
    dr: FloatArray
    #: the importance weight of the run's figure (0: the log stopped before the policy would)
    weight: FloatArray
    #: ``exact`` (read from the log, weight 1), ``weighted`` (through explored continues),
    #: ``zeroed`` (past an explorable stop not explored), ``unsupported`` (past a stop none explores)
    support: npt.NDArray[np.str_]


def per_run_values(
    dp: DecisionPoints, stop_rows: IntArray, lam: float, v_hat: FloatArray | None = None
) -> RunValues:
    """IS and DR figures of a policy whose first stop in each run is ``stop_rows`` (-1: none).

    ``v_hat`` (per row, quality units) is the model part of DR: the value of going on over
    stopping now; None or NaN rows: 0.
    """
    rows = np.asarray(stop_rows, dtype=np.int64)
    if rows.shape != (dp.n_traces,):
        raise TrainingError(f"stop rows have shape {rows.shape}, expected ({dp.n_traces},)")
    went_on, mu = continue_propensity(dp)
    r = dp.q - lam * dp.c
    r_end = dp.trace_q_final - lam * dp.trace_c_final
    q_hat = r + (0.0 if v_hat is None else np.nan_to_num(np.asarray(v_hat, dtype=np.float64), nan=0.0))
    n = dp.n_rows
    idx = np.arange(n, dtype=np.int64)
    start = dp.offsets[:-1][dp.trace_idx]
    stop_at = rows[dp.trace_idx]
    # rows where the policy goes on: before its stop, or every row of a run it never stops
    goes_on = np.where(stop_at >= 0, idx < stop_at, True)
    with np.errstate(divide="ignore"):
        ratio = np.where(goes_on, np.where(went_on > 0, 1.0 / np.maximum(mu, 1e-300), 0.0), 1.0)
    # cumulative product of the ratios within each run (a zero stays zero)
    zero = ratio == 0.0
    logs = np.log(np.where(zero, 1.0, ratio))
    csum = np.cumsum(logs)
    zsum = np.cumsum(zero)
    base = np.concatenate([[0.0], csum])[dp.offsets[:-1]][dp.trace_idx]
    zbase = np.concatenate([[0], zsum])[dp.offsets[:-1]][dp.trace_idx]
    w = np.where(zsum - zbase > 0, 0.0, np.exp(csum - base))
    w_prev = np.where(idx == start, 1.0, np.concatenate([[1.0], w[:-1]]))
    term = np.where(goes_on, (w_prev - w) * q_hat, 0.0)
    model_part = np.bincount(dp.trace_idx, weights=term, minlength=dp.n_traces)
    # the weight after the last row the policy goes on at, and the value it then gets
    last_on = np.where(rows >= 0, rows - 1, dp.offsets[1:] - 1)
    first = dp.offsets[:-1]
    w_last = np.where(last_on >= first, w[np.maximum(last_on, 0)], 1.0)
    terminal = np.where(rows >= 0, r[np.maximum(rows, 0)], r_end)
    ips = w_last * terminal
    dr = model_part + ips
    end = dp.offsets[1:] - 1
    never_explored = np.where(went_on[end] > 0, False, mu[end] <= 0.0)
    support = np.where(
        w_last == 0.0,
        np.where(never_explored, "unsupported", "zeroed"),
        np.where(w_last > 1.0 + 1e-12, "weighted", "exact"),
    )
    return RunValues(ips=ips, dr=dr, weight=w_last, support=np.asarray(support, dtype=np.str_))


def value_model(policy: Policy, dp: DecisionPoints, lam: float) -> FloatArray | None:
    """A learned policy's value of going on at every decision point (None for a policy without boosters)."""
    if policy.inference is None:
        return None
    raw = policy.raw_batch(dp.X)
    v, _, _ = policy.values(raw, dp.turn, dp.c_raw, Objective(lam=lam))
    return np.asarray(v, dtype=np.float64)


@dataclass(frozen=True)
class Estimate:
    """One policy's off-policy value on the logged runs, with its 90% intervals and its support."""

    name: str
    ips: float
    ips_ci90: tuple[float, float]
    dr: float
    dr_ci90: tuple[float, float]
    n_runs: int
    exact: int
    weighted: int
    zeroed: int
    unsupported: int
    max_weight: float
    #: effective sample size of the IS weights, (Σw)² / Σw²
    ess: float
    enough: bool
    why: str | None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return {
            "ips": self.ips,
            "ips_ci90": list(self.ips_ci90),
            "dr": self.dr,
            "dr_ci90": list(self.dr_ci90),
            "runs": self.n_runs,
            "support": {
                "exact": self.exact,
                "weighted": self.weighted,
                "zeroed": self.zeroed,
                "unsupported": self.unsupported,
            },
            "max_weight": self.max_weight,
            "ess": self.ess,
            "enough": self.enough,
            "why": self.why,
        }


def _support_verdict(
    n: int,
    exact: int,
    weighted: int,
    zeroed: int,
    unsupported: int,
    *,
    ess: float | None = None,
    min_runs: int = MIN_RUNS,
) -> str | None:
    """Why the runs are too few to support a figure, or None when they are enough.

    A figure rests on the model alone on its unsupported runs, and on its zeroed runs too
    when fewer than :data:`MIN_WEIGHTED` explored runs stand in for them; at most
    :data:`MAX_UNSUPPORTED` of the runs may. Its weights' effective sample size ``ess``
    (None: all runs count fully) must be at least :data:`MIN_ESS_SHARE` of the runs.
    """
    if n < min_runs:
        return f"{n} logged runs: at least {min_runs} are needed for a figure"
    alone = unsupported + (zeroed if weighted < MIN_WEIGHTED else 0)
    if alone <= MAX_UNSUPPORTED * n:
        if ess is None or ess >= MIN_ESS_SHARE * n:
            return None
        return (
            f"the policy goes on past the logged stop on {weighted + zeroed + unsupported} of {n} runs, and "
            f"the {weighted} explored runs that show what follows are weighted so unevenly that the figure "
            f"counts as {ess:.0f} runs (an effective sample size of at least {MIN_ESS_SHARE:.0%} of the runs "
            "is needed): log more runs with exploration"
        )
    if unsupported > MAX_UNSUPPORTED * n:
        return (
            f"on {unsupported} of {n} runs the policy goes on past a stop no exploration could undo (a "
            f"budget, or a stop logged without exploration): more than {MAX_UNSUPPORTED:.0%}; serve with "
            "exploration (STOPSERVE_EXPLORE) or log runs it decides"
        )
    return (
        f"the policy goes on past the logged stop on {weighted + zeroed + unsupported} of {n} runs, and only "
        f"{weighted} explored runs show what follows (at least {MIN_WEIGHTED}, or at most "
        f"{MAX_UNSUPPORTED:.0%} of the runs resting on the model alone): log more runs with exploration"
    )


def supported_at_any_count(estimate: Estimate) -> bool:
    """``estimate``'s runs support it by every rule but the least number of runs (``MIN_RUNS``).

    What a confidence sequence asks of a round's runs: it holds at any number of runs, but a
    run resting on the model alone, or a few explored runs weighted unevenly standing for
    many, it cannot tell from evidence.
    """
    e = estimate
    return (
        _support_verdict(e.n_runs, e.exact, e.weighted, e.zeroed, e.unsupported, ess=e.ess, min_runs=0)
        is None
    )


@dataclass
class LoggedEvaluation:
    """Off-policy figures of several policies on the same logged runs (paired)."""

    dp: DecisionPoints
    lam: float
    groups: npt.NDArray[np.str_]
    runs: dict[str, RunValues]
    estimates: dict[str, Estimate] = field(default_factory=dict)
    n_boot: int = N_BOOT
    seed: int = 0

    def difference(self, a: str, b: str, estimator: Estimator = "dr") -> tuple[float, tuple[float, float]]:
        """Mean of ``a − b`` per run and its paired 90% bootstrap interval."""
        diff = getattr(self.runs[a], estimator) - getattr(self.runs[b], estimator)
        draws = _boot(diff[None, :], self.groups, self.n_boot, self.seed)[0]
        return float(diff.mean()), _interval(draws)

    def dominates(self, a: str, b: str, estimator: Estimator = "dr") -> bool:
        """``a`` does at least as well as ``b`` on every run and better on some (then a lower end of
        0 is no doubt: no resampling of these runs can make ``a`` worse)."""
        diff = getattr(self.runs[a], estimator) - getattr(self.runs[b], estimator)
        return bool(diff.size) and bool(np.all(diff >= -1e-12)) and float(diff.mean()) > 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data: every estimate."""
        return {"lambda": self.lam, "policies": {n: e.to_dict() for n, e in self.estimates.items()}}


def _boot(values: FloatArray, groups: npt.NDArray[np.str_], n_boot: int, seed: int) -> FloatArray:
    """Bootstrap draws of each row's mean, resampling whole groups: shape (rows, n_boot)."""
    _, gid = np.unique(groups, return_inverse=True)
    n_groups = int(gid.max()) + 1 if gid.size else 0
    if n_groups == 0:
        return np.zeros((values.shape[0], n_boot))
    sums = np.stack([np.bincount(gid, weights=v, minlength=n_groups) for v in values])
    counts = np.bincount(gid, minlength=n_groups).astype(np.float64)
    rng = np.random.default_rng(seed)
    out = np.empty((values.shape[0], n_boot))
    p = np.full(n_groups, 1.0 / n_groups)
    for at in range(0, n_boot, _CHUNK):
        k = min(_CHUNK, n_boot - at)
        w = rng.multinomial(n_groups, p, size=k).astype(np.float64)
        out[:, at : at + k] = (sums @ w.T) / np.maximum(w @ counts, 1.0)
    return out


def _interval(draws: FloatArray) -> tuple[float, float]:
    return float(np.quantile(draws, LOWER)), float(np.quantile(draws, UPPER))


def evaluate_logged(
    policies: Mapping[str, Policy | None],
    dp: DecisionPoints,
    stop_rows: Mapping[str, IntArray],
    *,
    lam: float,
    groups: npt.NDArray[np.str_] | None = None,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> LoggedEvaluation:
    """IS and DR estimates of every policy (its first stop per run in ``stop_rows``) on ``dp``.

    ``dp`` must be built unnormalised (costs in the cost unit) from the logged traces;
    the logging policy itself is ``logged`` (the runs as they ended: exact). The DR model
    part of a policy is its own value of going on when it has boosters, else 0 (going on is
    worth what stopping is, and only its explored runs move its figure: another policy's
    value of going on is the value of going on as *that* policy would, and borrowed by a
    tuned turn cap it read +0.031 where the truth was -0.002). ``groups``: resampled together
    (default: each run alone).
    """
    groups = dp.trace_id if groups is None else groups
    runs: dict[str, RunValues] = {}
    logged_end = dp.trace_q_final - lam * dp.trace_c_final
    runs["logged"] = RunValues(
        ips=logged_end,
        dr=logged_end,
        weight=np.ones(dp.n_traces),
        support=np.full(dp.n_traces, "exact"),
    )
    for name, policy in policies.items():
        own = None if policy is None else value_model(policy, dp, lam)
        runs[name] = per_run_values(dp, stop_rows[name], lam, own)
    names = list(runs)
    stacked = np.stack([np.stack([runs[n].ips, runs[n].dr]) for n in names]).reshape(2 * len(names), -1)
    draws = _boot(stacked, groups, n_boot, seed)
    estimates: dict[str, Estimate] = {}
    for k, name in enumerate(names):
        rv = runs[name]
        counts = {s: int((rv.support == s).sum()) for s in ("exact", "weighted", "zeroed", "unsupported")}
        w = rv.weight
        ess = float(w.sum() ** 2 / (w**2).sum()) if (w**2).sum() > 0 else 0.0
        why = _support_verdict(dp.n_traces, **counts, ess=ess)
        estimates[name] = Estimate(
            name=name,
            ips=float(rv.ips.mean()),
            ips_ci90=_interval(draws[2 * k]),
            dr=float(rv.dr.mean()),
            dr_ci90=_interval(draws[2 * k + 1]),
            n_runs=dp.n_traces,
            max_weight=float(w.max()) if w.size else 0.0,
            ess=ess,
            enough=why is None,
            why=why,
            **counts,
        )
    return LoggedEvaluation(dp, lam, groups, runs, estimates, n_boot, seed)


def logged_traces_ok(dp: DecisionPoints) -> Sequence[str]:
    """Notes on what the logs can support: whether any decision was logged, and explored."""
    notes: list[str] = []
    if not dp.logged_stop.any() and np.all(dp.propensity == 1.0):
        notes.append(
            "no logged decision said stop and none explored: the runs ended on their own, so every policy "
            "is read from them exactly (a policy that goes on to the end gets the logged end)"
        )
    elif np.all(dp.propensity == 1.0):
        notes.append(
            "no logged decision explored (propensities all 1): a policy that goes on past a logged stop is "
            "unsupported there; serve with STOPSERVE_EXPLORE to log what follows a stop"
        )
    return notes
