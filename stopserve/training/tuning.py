"""Tuning a learned policy's parameters: its margins, its ``min_turns`` and its method.

The served policy (:mod:`stopserve.policy`) starts from a base rule (a tuned heuristic,
plus the orchestrator's proposed stops) and deviates from it only where the value of
continuing V clears a margin: it continues through a base stop where ``V > m_c`` and
stops a run the base lets go on where ``V < −m_s`` (past ``min_turns``). With both
margins infinite it IS the base rule, so tuning can always fall back to it.

:func:`tune_policy` picks ``(m_s, m_c, min_turns)`` to maximise a lower confidence bound
of the per-trace gain over the pure base rule: ``mean − PESSIMISM · standard error``,
so a deviation whose gain rests on a few traces is not taken. For each ``(m_c,
min_turns)`` every ``m_s`` is scored at once, exactly, in O(n log n) numpy. The search
works on vectorised stop flags (:func:`learned_mask`, checked against ``Policy.decide``
in the tests); every figure reported about the result comes from replaying the served
policy through ``decide`` (:mod:`stopserve.training.replay`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from stopserve.training.heuristics import RuleFires, policy_mask, replay
from stopserve.training.labels import BoolArray, DecisionPoints, FloatArray, IntArray

__all__ = ["ALL_RULES", "PESSIMISM", "Tuned", "learned_mask", "split_fires", "tune_policy"]

#: Standard errors a deviation's mean gain must clear.
PESSIMISM: Final = 1.0
#: Values of the continue margin tried (quantiles of V where the base rule stops), plus "never".
CONTINUE_GRID: Final = 12
_EPS: Final = 1e-12
#: A stratum's mean gain may fall this far below 0 and still count as "not negative".
_TOL: Final = 1e-9


@dataclass(frozen=True)
class Tuned:
    """Tuned parameters and how they did on the rows they were tuned on.

    ``margin_stop``/``margin_continue`` are ``inf`` for "never deviate"; ``score`` is the
    lower confidence bound of the mean per-trace gain over the base rule, ``gain`` its
    mean, ``value`` the mean value.
    """

    margin_stop: float
    margin_continue: float
    min_turns: int
    score: float
    gain: float
    value: float

    @property
    def deviates(self) -> bool:
        """Whether the policy ever differs from its base rule."""
        return math.isfinite(self.margin_stop) or math.isfinite(self.margin_continue)


#: ``Policy.decide``'s rule kinds (manifest ``overrules``) by the :class:`RuleFires` field each reads.
_KIND_FIELD: Final[dict[str, str]] = {
    "loop": "loop",
    "quality_met": "quality",
    "rule": "rule",
    "proposed": "proposed",
}
#: What a learned model trained with tuned rules may overrule: every rule.
ALL_RULES: Final = frozenset(_KIND_FIELD)


def split_fires(fires: RuleFires, overrules: frozenset[str]) -> tuple[BoolArray, BoolArray]:
    """``(hard, soft)``: where a rule the model may not overrule fires, and where only rules it may.

    As ``Policy.decide`` reads them: the config's ``quality_met`` counts only where its
    loop detector did not fire first.
    """
    kinds = {
        "loop": fires.loop,
        "quality_met": fires.quality & ~fires.loop,
        "rule": fires.rule,
        "proposed": fires.proposed,
    }
    n = fires.loop.shape[0]
    hard = np.zeros(n, dtype=bool)
    soft = np.zeros(n, dtype=bool)
    for kind, where in kinds.items():
        if kind in overrules:
            soft |= where
        else:
            hard |= where
    return hard, soft


def learned_mask(
    dp: DecisionPoints,
    v: FloatArray,
    fires: RuleFires,
    *,
    margin_stop: float,
    margin_continue: float,
    min_turns: int,
    overrules: frozenset[str] = ALL_RULES,
    stall: BoolArray | None = None,
) -> BoolArray:
    """Where the served learned policy stops: ``Policy.decide`` on every row at once.

    ``fires`` says where each of the policy's rules fires, ``v`` is the value of
    continuing, ``overrules`` the rule kinds the model may overrule, ``stall`` (for a model
    that stops on evidence only) where the run shows a stall.
    """
    hard, soft = split_fires(fires, overrules)
    keep_going = v > margin_continue
    model = ~(hard | soft) & dp.allowed & (dp.turn >= min_turns) & (v < -margin_stop)
    if stall is not None:
        model &= stall
    return dp.net_stop | hard | (soft & ~keep_going) | model


def _lcb(mean: float, sq_sum: float, n: int) -> float:
    var = max(sq_sum / n - mean * mean, 0.0)
    return mean - PESSIMISM * math.sqrt(var / n)


def _sweep(  # noqa: PLR0917
    dp: DecisionPoints,
    v: FloatArray,
    eligible: BoolArray,
    extra: BoolArray,
    lam: float,
    ref: FloatArray,
    strata: IntArray | None = None,
) -> tuple[float, float, float]:
    """Best ``h`` for "stop where eligible and ``v < h``, or where ``extra``": ``(h, gain, lcb)``.

    Gains are per trace against ``ref`` (the pure base rule's values). ``h = -inf``: no
    model stop. A trace's first model stop moves only at the record lows of its V, so
    each record contributes one step to the value curve. With ``strata`` (a stratum per
    trace, e.g. its data set), a threshold whose mean gain is negative in any stratum is
    not taken: a policy meant for systems it has not seen must not buy a gain on one at
    the expense of another.
    """
    base_rep = replay(dp, extra, lam)
    base = base_rep.value
    n_tr = dp.n_traces
    g0 = base - ref
    mean0 = float(g0.mean())
    ss0 = float((g0 * g0).sum())
    n_strata = 1 if strata is None else int(strata.max()) + 1
    st = np.zeros(n_tr, dtype=np.int64) if strata is None else strata
    st_n = np.bincount(st, minlength=n_strata).astype(np.float64)
    st_g0 = np.bincount(st, weights=g0, minlength=n_strata)
    feasible0 = bool(np.all(st_g0 >= -_TOL * st_n))
    best = (-math.inf, mean0, _lcb(mean0, ss0, n_tr) if feasible0 else -math.inf)
    n = dp.n_rows
    idx = np.arange(n, dtype=np.int64)
    end = np.where(base_rep.stopped, base_rep.stop_row, dp.offsets[1:])
    elig = eligible & (idx < end[dp.trace_idx]) & np.isfinite(v)
    if not elig.any():
        return best
    lo, hi = float(v[elig].min()), float(v[elig].max())
    span = hi - lo + 2.0
    w = np.where(elig, v, hi + 1.0) - span * dp.trace_idx
    running = np.minimum.accumulate(w)
    prev = np.empty(n)
    prev[0] = math.inf
    prev[1:] = running[:-1]
    first_of_trace = np.zeros(n, dtype=bool)
    first_of_trace[dp.offsets[:-1]] = True
    record = elig & (first_of_trace | (w < prev))
    rows = np.flatnonzero(record)
    tr = dp.trace_idx[rows]
    val = dp.q[rows] - lam * dp.c[rows]
    same = np.zeros(rows.size, dtype=bool)
    same[:-1] = tr[1:] == tr[:-1]
    nxt = np.empty(rows.size)
    nxt[:-1] = val[1:]
    nxt = np.where(same, nxt, base[tr])
    r = ref[tr]
    # as h rises past v_j, the trace's stop moves from the next record (or the base) to j
    d1 = val - nxt
    d2 = (val - r) ** 2 - (nxt - r) ** 2
    order = np.argsort(v[rows], kind="stable")
    points = v[rows][order]
    s1 = np.cumsum(d1[order])
    s2 = np.cumsum(d2[order])
    last = np.ones(points.size, dtype=bool)
    last[:-1] = points[1:] != points[:-1]
    mean = mean0 + s1[last] / n_tr
    var = np.maximum((ss0 + s2[last]) / n_tr - mean**2, 0.0)
    score = mean - PESSIMISM * np.sqrt(var / n_tr)
    if strata is not None:
        # gain per stratum at each threshold: a cumulative sum per stratum
        by = np.zeros((points.size, n_strata))
        by[np.arange(points.size), st[tr][order]] = d1[order]
        per = (st_g0 + np.cumsum(by, axis=0)[last]) / np.maximum(st_n, 1.0)
        score = np.where(np.all(per >= -_TOL, axis=1), score, -math.inf)
    points = points[last]
    k = int(np.argmax(score))
    if score[k] > best[2] + _EPS:
        upper = float(points[k + 1]) if k + 1 < points.size else float(points[k]) + 1.0
        best = (0.5 * (float(points[k]) + upper), float(mean[k]), float(score[k]))
    return best


def _continue_grid(v: FloatArray, where: BoolArray) -> list[float]:
    vals = v[where & np.isfinite(v)]
    if vals.size == 0:
        return [math.inf]
    qs = np.unique(np.quantile(vals, np.linspace(0.5, 1.0, CONTINUE_GRID), method="nearest"))
    return [math.inf, *(float(x) for x in qs[::-1])]


def tune_policy(
    dp: DecisionPoints,
    v: FloatArray,
    fires: RuleFires,
    lam: float,
    *,
    min_turns: tuple[int, ...] = (1, 2, 3),
    strata: IntArray | None = None,
    overrules: frozenset[str] = ALL_RULES,
    stall: BoolArray | None = None,
) -> Tuned:
    """Margins and ``min_turns`` of the learned policy on ``dp``, against its base rule ``fires``.

    Returns the pure base rule (both margins infinite) unless some deviation's lower
    confidence bound of the gain is above 0 (and, with ``strata``, its mean gain is not
    negative in any stratum: see :func:`_sweep`). ``overrules`` and ``stall`` are the
    served policy's (:func:`learned_mask`).
    """
    ref = replay(dp, policy_mask(dp, fires), lam).value
    ref_mean = float(ref.mean())
    best = Tuned(math.inf, math.inf, min(min_turns), 0.0, 0.0, ref_mean)
    hard, soft = split_fires(fires, overrules)
    for m_c in _continue_grid(v, soft):
        keep_going = v > m_c
        extra = dp.net_stop | hard | (soft & ~keep_going)
        for mt in min_turns:
            eligible = dp.allowed & ~(hard | soft) & (dp.turn >= mt)
            if stall is not None:
                eligible &= stall
            h, gain, score = _sweep(dp, v, eligible, extra, lam, ref, strata)
            if score > best.score + _EPS:
                best = Tuned(-h if math.isfinite(h) else math.inf, m_c, mt, score, gain, ref_mean + gain)
    return best
