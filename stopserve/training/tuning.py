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
works on vectorised stop flags (:func:`stopserve.policy.stop_mask`, ``Policy.decide``'s
twin beside it, tested equal over every rule order); every figure reported about the
result comes from replaying the served policy through ``decide``
(:mod:`stopserve.training.replay`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from stopserve.manifest import RULE_KINDS
from stopserve.policy import Deviation, RuleFires, split_fires
from stopserve.training.heuristics import Floors, Replay, policy_mask, replay, success_kept
from stopserve.training.labels import BoolArray, DecisionPoints, FloatArray, IntArray
from stopserve.training.parameters import DEFAULT_SUCCESS_FLOOR

__all__ = [
    "ALL_RULES",
    "DEFAULT_FLOORS",
    "DEFAULT_SUCCESS_FLOOR",
    "PESSIMISM",
    "Floors",
    "Tuned",
    "floor_losses",
    "success_kept",
    "tune_policy",
]

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

    def deviation(self, overrules: frozenset[str], *, on_evidence: bool = False) -> Deviation:
        """These margins and gate as the served policy's :class:`~stopserve.policy.Deviation`."""
        return Deviation(self.margin_stop, self.margin_continue, self.min_turns, overrules, on_evidence)


#: What a learned model trained with tuned rules may overrule: every rule.
ALL_RULES: Final = frozenset(RULE_KINDS)


def _lcb(mean: float, sq_sum: float, n: int) -> float:
    var = max(sq_sum / n - mean * mean, 0.0)
    return mean - PESSIMISM * math.sqrt(var / n)


def floor_losses(
    dp: DecisionPoints, rep: Replay, lam: float, *, paid: bool = True
) -> dict[str, tuple[float, str]]:
    """The worst loss against the logged runs over data sets: ``{what: (loss, data set)}``.

    ``what`` is ``value``, ``success`` or ``unpaid``.

    A loss is the logged runs' mean (at their own stop) minus the replayed policy's, per data
    set (a trained policy must keep its :class:`Floors` in each); positive means it loses.
    ``unpaid``: the worst success loss among the data sets where the value gained does not
    pay for it twice over (:func:`success_kept`; ``-inf`` where there is none): what the
    success floor is kept on (``paid=False``, a strict floor: the worst success loss).
    """
    behavior = {"value": dp.trace_q_behavior - lam * dp.trace_c_behavior, "success": dp.trace_q_behavior}
    got = {"value": rep.value, "success": rep.q}
    out: dict[str, tuple[float, str]] = {}
    unpaid = (-math.inf, "")
    for name in np.unique(dp.dataset):
        m = dp.dataset == name
        loss = {what: float(behavior[what][m].mean() - got[what][m].mean()) for what in behavior}
        for what, x in loss.items():
            if x > out.get(what, (-math.inf, ""))[0]:
                out[what] = (x, str(name))
        kept = bool(success_kept(-loss["success"], -loss["value"], 0.0, paid=paid))
        if not kept and loss["success"] > unpaid[0]:
            unpaid = (loss["success"], str(name))
    out["unpaid"] = unpaid
    return out


#: What ``stopserve train`` and ``retrain`` keep by default: the success floor, no value floor.
DEFAULT_FLOORS: Final = Floors(success=DEFAULT_SUCCESS_FLOOR)


def _sweep(  # noqa: PLR0917
    dp: DecisionPoints,
    v: FloatArray,
    eligible: BoolArray,
    extra: BoolArray,
    lam: float,
    ref: FloatArray,
    strata: IntArray | None = None,
    floors: Floors | None = None,
) -> tuple[float, float, float]:
    """Best ``h`` for "stop where eligible and ``v < h``, or where ``extra``": ``(h, gain, lcb)``.

    Gains are per trace against ``ref`` (the pure base rule's values). ``h = -inf``: no
    model stop. A trace's first model stop moves only at the record lows of its V, so
    each record contributes one step to the value curve. With ``strata`` (a stratum per
    trace, e.g. its data set), a threshold is taken only where every stratum keeps its
    floor: without ``floors``, a mean gain over the base rule that is not negative (a
    policy meant for systems it has not seen must not buy a gain on one at the expense of
    another); with them, the :class:`Floors` against the logged runs.
    """
    base_rep = replay(dp, extra, lam)
    base = base_rep.value
    n_tr = dp.n_traces
    g0 = base - ref
    mean0 = float(g0.mean())
    ss0 = float((g0 * g0).sum())
    n_strata = 1 if strata is None else int(strata.max()) + 1
    st = np.zeros(n_tr, dtype=np.int64) if strata is None else strata
    st_n = np.maximum(np.bincount(st, minlength=n_strata).astype(np.float64), 1.0)

    def per(weights: FloatArray) -> FloatArray:
        return np.bincount(st, weights=weights, minlength=n_strata).astype(np.float64)

    # each stratum's figures before any model stop (value, success), and what each must keep
    beh_q = per(dp.trace_q_behavior)
    beh_v = per(dp.trace_q_behavior - lam * dp.trace_c_behavior)
    start_v, start_q = per(base), per(base_rep.q)

    def keeps(v_sum: FloatArray, q_sum: FloatArray) -> BoolArray:
        """Whether every stratum keeps its floors, at each row of per-stratum sums."""
        if floors is None:
            return np.asarray(np.all(v_sum - per(ref) >= -_TOL * st_n, axis=-1), dtype=bool)
        ok = np.ones(v_sum.shape[:-1], dtype=bool)
        if floors.value is not None:
            ok &= np.all(v_sum >= beh_v - (floors.value + _TOL) * st_n, axis=-1)
        if floors.success is not None:
            ok &= np.all(
                success_kept(
                    q_sum - beh_q, v_sum - beh_v, floors.success * st_n, _TOL * st_n, paid=floors.paid
                ),
                axis=-1,
            )
        return ok

    feasible0 = strata is None or bool(keeps(start_v, start_q))
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

    def following(x: FloatArray, at_base: FloatArray) -> FloatArray:
        # the figure at the trace's next record (a lower V), or the base's where there is none
        nxt = np.empty(rows.size)
        nxt[:-1] = x[1:]
        return np.where(same, nxt, at_base[tr])

    nxt = following(val, base)
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
        # each stratum's figures at each threshold: a cumulative sum per stratum

        def cumulative(start: FloatArray, delta: FloatArray) -> FloatArray:
            by = np.zeros((points.size, n_strata))
            by[np.arange(points.size), st[tr][order]] = delta[order]
            return start + np.cumsum(by, axis=0)[last]

        v_at = cumulative(start_v, d1)
        q_at = v_at  # unread without a success floor
        if floors is not None and floors.success is not None:
            q_rows = dp.q[rows]
            q_at = cumulative(start_q, q_rows - following(q_rows, base_rep.q))
        score = np.where(keeps(v_at, q_at), score, -math.inf)
    points = points[last]
    k = int(np.argmax(score))
    if score[k] > best[2] + _EPS:
        upper = float(points[k + 1]) if k + 1 < points.size else float(points[k]) + 1.0
        best = (0.5 * (float(points[k]) + upper), float(mean[k]), float(score[k]))
    return best


def _continue_grid(v: FloatArray, where: BoolArray, *, wide: bool = False) -> list[float]:
    """Continue margins to try: quantiles of V where an overrulable rule fires, and "never".

    ``wide`` (a success constraint in force) tries the whole range of V, not its upper half:
    keeping a rule's stops may cost more success than the constraint allows.
    """
    vals = v[where & np.isfinite(v)]
    if vals.size == 0:
        return [math.inf]
    lo, n = (0.0, 2 * CONTINUE_GRID) if wide else (0.5, CONTINUE_GRID)
    qs = np.unique(np.quantile(vals, np.linspace(lo, 1.0, n), method="nearest"))
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
    floors: Floors | None = None,
) -> Tuned:
    """Margins and ``min_turns`` of the learned policy on ``dp``, against its base rule ``fires``.

    Returns the pure base rule (both margins infinite) unless some deviation's lower
    confidence bound of the gain is above 0 (and, with ``strata``, its mean gain is not
    negative in any stratum, or, with ``floors``, every stratum keeps them: see
    :func:`_sweep`). ``overrules`` and ``stall`` are the served policy's
    (:func:`stopserve.policy.stop_mask`).
    """
    ref = replay(dp, policy_mask(dp, fires), lam).value
    ref_mean = float(ref.mean())
    best = Tuned(math.inf, math.inf, min(min_turns), 0.0, 0.0, ref_mean)
    hard, soft = split_fires(fires, overrules)
    for m_c in _continue_grid(v, soft, wide=floors is not None):
        keep_going = v > m_c
        extra = dp.net_stop | hard | (soft & ~keep_going)
        for mt in min_turns:
            eligible = dp.allowed & ~(hard | soft) & (dp.turn >= mt)
            if stall is not None:
                eligible &= stall
            h, gain, score = _sweep(dp, v, eligible, extra, lam, ref, strata, floors)
            if score > best.score + _EPS:
                best = Tuned(-h if math.isfinite(h) else math.inf, m_c, mt, score, gain, ref_mean + gain)
    return best
