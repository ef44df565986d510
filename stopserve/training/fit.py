"""Learn a stop policy from decision points: LightGBM Q, S, K, D (and C), τ, and the guard.

Targets, one row per decision point (``stopserve.training.labels``):

- Q(s) ≈ E[q_T | s_t]: the quality the run reaches at its own end (``q_final``);
- S(s) ≈ E[q_t | s_t]: the quality it would hand back if stopped now (``q``);
- K(s) ≈ E[c_T − c_t | s_t]: the cost still to be spent (``c_final − c``);
- D(s) ≈ E[q_T − q_t | s_t]: the gain of continuing, fitted directly (Q − S from
  two models would add their errors).

``V_stop = Q − S − λ·K``, computed as ``D − λ·K``; the policy stops when
``V_stop < −τ``. Everything is cross-fitted with grouped k-fold (a task, or a
repository with ``group_by="repo"``, is never split). Each fold's τ, and the safety
nets shipped with the model (a cost cap, the loop detector on or off), are tuned
on that fold model's early-stopping rows, pessimistically (mean gain minus one
standard error); the fold is then scored with them, which gives the
cross-validated value, compared with every tuned heuristic cross-fitted on the
same folds. The learned policy ships only when it beats the best of them;
otherwise that heuristic ships (a pure-heuristic model directory) and the
summary says so.

``method="optimal"`` adds C(s), fitted backward induction for one λ in the manner
of Longstaff–Schwartz: C is regressed on the value *realised* under the later
rule already learned (``q_τ − λ·(c_τ − c_t)`` at the rule's next stop, or the
logged end), not on ``max(g, Ĉ)``; the rule is refined over a few passes, each
built from out-of-fold predictions so no trace's targets come from a model that saw it.

Bad input: no traces / no outcome are refused by ``stopserve.training.labels``; fewer than
2 traces or folds are refused; a single group falls back to folds over traces
(said loudly); all successes or all failures train a constant Q (documented in
docs/training.md).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from stopserve.artifacts import save_model_dir
from stopserve.errors import TrainingError
from stopserve.features import FEATURE_NAMES
from stopserve.training.heuristics import (
    HEURISTICS,
    cross_fit_heuristics,
    group_folds,
    replay,
    tune_heuristics,
)
from stopserve.training.labels import DecisionPoints

__all__ = [
    "DEFAULT_LAMBDA",
    "DEFAULT_PARAMS",
    "FitResult",
    "default_lambda",
    "fit_policy",
    "train_command",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: Default λ per cost unit when ``--lambda`` is not given: task success worth $5,
#: 500k tokens, or 30 minutes of wall clock.
DEFAULT_LAMBDA: Final[dict[str, float]] = {"usd": 0.2, "ktokens": 0.002, "seconds": 1.0 / 1800.0}

#: LightGBM parameters (small trees: decide() walks every tree each call).
DEFAULT_PARAMS: Final[dict[str, Any]] = {
    # small, heavily regularised trees: rows of one run are alike, runs are few, and
    # decide() walks every tree on each call
    "learning_rate": 0.05,
    "num_leaves": 7,
    "max_depth": 4,
    "min_data_in_leaf": "auto",  # max(20, 1% of the rows)
    "feature_fraction": 0.5,
    "bagging_fraction": 0.8,
    "bagging_freq": 1,
    "lambda_l2": 10.0,
    "verbose": -1,
    "deterministic": True,
    "force_col_wise": True,
    # one thread: traces are small, and OpenMP spin-waiting on a shared machine costs 5x
    "num_threads": 1,
}
MAX_ROUNDS: Final = 400
EARLY_STOPPING: Final = 30
#: Inverse-propensity weights are clipped here (variance control).
MAX_IPW: Final = 20.0
#: Standard errors a tuned τ's gain must clear (see ``_tune_tau``).
PESSIMISM: Final = 1.0
#: V_stop from the direct gain model D (else from Q − S).
GAIN_MODEL: Final = True
#: Passes of fitted backward induction for ``method="optimal"``.
OPTIMAL_PASSES: Final = 3
#: Traces a topology needs for its own τ of the optimal rule.
MIN_TOPOLOGY_TRACES: Final = 100
#: Multiples of the chosen λ at which τ is tuned too (the λ dial without retraining).
LAMBDA_GRID: Final = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 10.0)


def default_lambda(cost_unit: str) -> float:
    """λ used when none is given: task success worth $5 / 500k tokens / 30 minutes."""
    return DEFAULT_LAMBDA.get(cost_unit, 0.2)


@dataclass
class FitResult:
    """What :func:`fit_policy` learned: the manifest and model texts to save, and a summary."""

    manifest: dict[str, Any]
    models: dict[str, str]
    chosen: str
    cv: dict[str, Any]
    importance: dict[str, float]
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def save(self, out_dir: str | Path) -> Path:
        """Write the model directory (see :mod:`stopserve.artifacts`)."""
        return save_model_dir(out_dir, self.manifest, self.models)


# --------------------------------------------------------------------------- helpers


class _Timer:
    """Time spent inside ``lightgbm.train`` versus the whole fit (overhead target <= 1.5x)."""

    def __init__(self) -> None:
        self.lgb = 0.0


def _is_unit(y: FloatArray) -> bool:
    return bool(y.size) and bool(np.all((y >= 0.0) & (y <= 1.0)))


def _is_binary(y: FloatArray) -> bool:
    return bool(y.size) and bool(np.all((y == 0.0) | (y == 1.0)))


def _ipw(dp: DecisionPoints) -> FloatArray:
    """Row weights ``Π_{j<=t} 1/p_j`` within each trace, clipped, mean 1 (1 when no exploration)."""
    p = np.clip(dp.propensity, 1e-6, 1.0)
    if np.all(p == 1.0):
        return np.ones(dp.n_rows)
    logw = -np.log(p)
    csum = np.cumsum(logw)
    # restart the running sum at every trace start
    start_sum = np.concatenate([[0.0], csum])[dp.offsets[:-1]]
    logw_cum = csum - np.repeat(start_sum, np.diff(dp.offsets))
    w = np.minimum(np.exp(logw_cum), MAX_IPW)
    return np.asarray(w / w.mean(), dtype=np.float64)


def _row_folds(dp: DecisionPoints, trace_fold: IntArray) -> IntArray:
    return np.asarray(trace_fold[dp.trace_idx], dtype=np.int64)


def _inner_split(groups: npt.NDArray[np.str_], rng: np.random.Generator) -> BoolArray:
    """Per-trace flag: held out for early stopping (about 20% of the groups, at least one)."""
    uniq = np.unique(groups)
    n_valid = max(1, round(0.2 * uniq.size)) if uniq.size > 1 else 0
    chosen = set(rng.choice(uniq, size=n_valid, replace=False).tolist()) if n_valid else set()
    return np.asarray([g in chosen for g in groups], dtype=bool)


def _next_stop_value(dp: DecisionPoints, stop: BoolArray, lam: float) -> FloatArray:
    """For each row t: ``q_j − λ·c_j`` at the rule's first stop j > t in the trace, else the logged end."""
    n = dp.n_rows
    idx = np.arange(n, dtype=np.int64)
    trace_end = dp.offsets[1:][dp.trace_idx]
    cand = np.where(stop, idx, trace_end)
    # reverse running minimum: candidates of later traces are never below this trace's end
    at_or_after = np.minimum.accumulate(cand[::-1])[::-1]
    after = np.empty(n, dtype=np.int64)
    after[:-1] = at_or_after[1:]
    after[-1] = n
    after = np.where(dp.is_last | (after >= trace_end), trace_end, after)
    stopped = after < trace_end
    j = np.where(stopped, after, 0)
    return np.where(stopped, dp.q[j] - lam * dp.c[j], dp.q_final - lam * dp.c_final)


def _tune_tau(
    dp: DecisionPoints, v: FloatArray, allowed: BoolArray, extra: BoolArray, lam: float
) -> tuple[float, float]:
    """τ for ``stop = (v < −τ) & allowed | extra``, tuned pessimistically on ``dp``.

    Every threshold is scored at once, exactly, in O(n log n) numpy (no loop over
    candidates or rows): a trace's first model stop moves only at the record lows
    of its V, so each record contributes one step to the value curve. A τ is
    scored by a lower confidence bound of its per-trace gain over the nets alone
    (mean − ``PESSIMISM`` standard errors), so a τ whose gain rests on a few traces
    is not taken. Returns τ (``inf``: the model never stops) and the mean value.
    """
    base_replay = replay(dp, extra, lam)
    base = base_replay.value
    n_tr = max(1, base.size)
    n = dp.n_rows
    idx = np.arange(n, dtype=np.int64)
    # rows at or after the nets' stop cannot host a model stop
    end = np.where(base_replay.stopped, base_replay.stop_row, dp.offsets[1:])
    eligible = allowed & (idx < end[dp.trace_idx]) & np.isfinite(v)
    base_mean = float(base.mean())
    if not eligible.any():
        return math.inf, base_mean
    lo, hi = float(v[eligible].min()), float(v[eligible].max())
    span = hi - lo + 2.0
    w = np.where(eligible, v, hi + 1.0) - span * dp.trace_idx
    running = np.minimum.accumulate(w)
    prev = np.empty(n)
    prev[0] = math.inf
    prev[1:] = running[:-1]
    first_of_trace = np.zeros(n, dtype=bool)
    first_of_trace[dp.offsets[:-1]] = True
    record = eligible & (first_of_trace | (w < prev))
    rows = np.flatnonzero(record)
    tr = dp.trace_idx[rows]
    val = dp.q[rows] - lam * dp.c[rows]
    nxt = np.empty(rows.size)
    same = np.zeros(rows.size, dtype=bool)
    same[:-1] = tr[1:] == tr[:-1]
    nxt[:-1] = val[1:]
    nxt = np.where(same, nxt, base[tr])
    b = base[tr]
    # as h = −τ rises past v_j, the trace's stop moves from the next record (or the nets) to j
    d1 = val - nxt
    d2 = (val - b) ** 2 - (nxt - b) ** 2
    order = np.argsort(v[rows], kind="stable")
    points = v[rows][order]
    s1 = np.cumsum(d1[order])
    s2 = np.cumsum(d2[order])
    # evaluate just above each distinct point (the last of a run of equal points)
    last = np.ones(points.size, dtype=bool)
    last[:-1] = points[1:] != points[:-1]
    points, s1, s2 = points[last], s1[last], s2[last]
    mean = s1 / n_tr
    var = np.maximum(s2 / n_tr - mean**2, 0.0)
    score = mean - PESSIMISM * np.sqrt(var) / math.sqrt(n_tr)
    k = int(np.argmax(score))
    if score[k] <= 1e-12:
        return math.inf, base_mean
    upper = float(points[k + 1]) if k + 1 < points.size else float(points[k]) + 1.0
    h = 0.5 * (float(points[k]) + upper)  # stop when v < h: v_j at point k stops, the next does not
    return -h, base_mean + float(mean[k])


def _cap_grid(c: FloatArray, size: int = 16) -> list[float | None]:
    """Cost caps tried with the model: off, and the upper half's quantiles of the observed costs."""
    pos = c[np.isfinite(c) & (c > 0)]
    if pos.size == 0:
        return [None]
    qs = np.unique(np.quantile(pos, np.linspace(0.5, 1.0, size)))
    return [None, *(float(x) for x in qs)]


Net = tuple[float | None, bool]  # (cost cap or None, loop detector on)


def _net_options(c: FloatArray, loop: BoolArray, with_cap: bool) -> list[Net]:
    """Safety nets tried with the model: each cost cap, with and without the loop detector."""
    caps = _cap_grid(c) if with_cap else [None]
    loops = (False, True) if loop.any() else (False,)
    return [(cap, use_loop) for use_loop in loops for cap in caps]


def _net_mask(dp: DecisionPoints, loop: BoolArray, net: Net) -> BoolArray:
    cap, use_loop = net
    mask = _cap_mask(dp, cap)
    return mask | loop if use_loop else mask


def _tune_rule(  # noqa: PLR0917
    dp: DecisionPoints,
    v: FloatArray,
    allowed: BoolArray,
    loop: BoolArray,
    lam: float,
    nets: list[Net],
) -> tuple[float, Net, float]:
    """τ and the safety nets shipped with the model (cost cap, loop detector), tuned jointly.

    The nets are tuned, not assumed: on some runs the loop detector at default
    thresholds stops runs that would have succeeded, and then it stays off.
    """
    best: tuple[float, Net, float] = (math.inf, (None, False), -math.inf)
    for net in nets:
        tau, value = _tune_tau(dp, v, allowed, _net_mask(dp, loop, net), lam)
        if value > best[2] + 1e-12:
            best = (tau, net, value)
    return best


def _cv_value(  # noqa: PLR0917
    dp: DecisionPoints,
    v: FloatArray,
    inner: list[tuple[IntArray, FloatArray]],
    allowed: BoolArray,
    loop: BoolArray,
    lam: float,
    trace_fold: IntArray,
    nets: list[Net],
) -> tuple[BoolArray, list[float], list[Net]]:
    """Nested tuning: fold f's rows use the τ and nets tuned for fold f's own model.

    ``inner[f]`` holds fold f's early-stopping rows and that model's V there: rows
    the model did not train on and fold f does not contain, so τ matches the scale
    of the model that scores fold f (fold models trained on very different data,
    e.g. without the one big repository, do not share a scale). Without such rows,
    τ is tuned on the other folds' out-of-fold values.
    """
    stop = np.zeros(dp.n_rows, dtype=bool)
    taus: list[float] = []
    fold_nets: list[Net] = []
    row_fold = _row_folds(dp, trace_fold)
    all_traces = np.arange(dp.n_traces)
    for f in np.unique(trace_fold):
        va_rows, v_in = inner[int(f)]
        if va_rows.size:
            sub = dp.subset(np.unique(dp.trace_idx[va_rows]))
            tau, net, _ = _tune_rule(sub, v_in, allowed[va_rows], loop[va_rows], lam, nets)
        else:
            rows_other = row_fold != f
            sub = dp.subset(all_traces[trace_fold != f])
            tau, net, _ = _tune_rule(sub, v[rows_other], allowed[rows_other], loop[rows_other], lam, nets)
        taus.append(tau)
        fold_nets.append(net)
        mine = row_fold == f
        cap, use_loop = net
        extra = (dp.c[mine] >= cap) if cap is not None else np.zeros(int(mine.sum()), dtype=bool)
        if use_loop:
            extra = extra | loop[mine]
        stop[mine] = ((v[mine] < -tau) & allowed[mine]) | extra
    return stop, taus, fold_nets


def _tau_by_topology(
    dp: DecisionPoints, v: FloatArray, allowed: BoolArray, extra: BoolArray, lam: float
) -> dict[str, float]:
    """τ of the optimal rule tuned per topology (≥ ``MIN_TOPOLOGY_TRACES`` traces; else the pooled τ).

    The continuation values of different topologies differ in scale and in fit
    error (measured on simulated runs: the pooled τ stopped harness runs early
    and centralized runs late), so one threshold cannot suit them all.
    """
    out: dict[str, float] = {}
    first = dp.X[dp.offsets[:-1]]
    for col, name in enumerate(FEATURE_NAMES):
        if not name.startswith("topology_"):
            continue
        traces = np.flatnonzero(first[:, col] == 1.0)
        if traces.size < MIN_TOPOLOGY_TRACES or traces.size == dp.n_traces:
            continue
        sub = dp.subset(traces)
        rows = np.concatenate([np.arange(dp.offsets[i], dp.offsets[i + 1]) for i in traces])
        tau, _ = _tune_tau(sub, v[rows], allowed[rows], extra[rows], lam)
        if math.isfinite(tau):
            out[name.removeprefix("topology_")] = tau
    return out


def _gain(q: FloatArray, s: FloatArray, d: FloatArray) -> FloatArray:
    """E[q_T − q_t | s]: the direct model D, or Q − S when ``GAIN_MODEL`` is off."""
    return d if GAIN_MODEL else q - s


def _cap_mask(dp: DecisionPoints, cap: float | None) -> BoolArray:
    return np.zeros(dp.n_rows, dtype=bool) if cap is None else np.asarray(dp.c >= cap)


def _summary(dp: DecisionPoints, stop: BoolArray, lam: float) -> dict[str, float]:
    r = replay(dp, stop, lam)
    return {"value": r.mean_value, "success": float(r.q.mean()), "cost": float(r.c.mean())}


def fingerprint(dp: DecisionPoints) -> dict[str, Any]:
    """Counts and a sha256 over the training matrix and labels (what the model saw)."""
    h = hashlib.sha256()
    for arr in (dp.X, dp.q, dp.c, dp.q_final, dp.c_final, dp.offsets):
        h.update(np.ascontiguousarray(arr).tobytes())
    h.update("\n".join(dp.trace_id.tolist()).encode())
    return {
        "n_traces": dp.n_traces,
        "n_decision_points": dp.n_rows,
        "n_tasks": len(np.unique(dp.task_id)),
        "n_groups": len(np.unique(dp.group)),
        "success_rate": float(dp.trace_q_final.mean()),
        "mean_cost": float(dp.trace_c_final.mean()),
        "cost_unit": dp.cost_unit,
        "sha256": h.hexdigest(),
    }


# --------------------------------------------------------------------------- LightGBM


@dataclass
class _Target:
    name: str
    y: FloatArray
    objective: str
    transform: str
    binary: bool


def _target(name: str, y: FloatArray) -> _Target:
    if _is_unit(y):
        return _Target(name, y, "cross_entropy", "sigmoid", _is_binary(y))
    return _Target(name, y, "regression", "identity", False)


class _Trainer:
    """Trains the per-target boosters on row subsets of one binned matrix."""

    def __init__(
        self,
        matrix: FloatArray,
        weight: FloatArray,
        params: Mapping[str, Any],
        timer: _Timer,
    ) -> None:
        import lightgbm as lgb

        self._lgb = lgb
        self.weight = weight
        self.params = dict(params)
        self.timer = timer
        # bin the matrix once; every fold and target reuses the bin mappers
        self._ref = lgb.Dataset(
            matrix,
            label=np.zeros(matrix.shape[0]),
            feature_name=list(FEATURE_NAMES),
            free_raw_data=False,
            params={"verbose": -1, "max_bin": self.params.get("max_bin", 255)},
        ).construct()

    def _dataset(self, rows: IntArray, y: FloatArray) -> Any:
        ds = self._ref.subset(rows)  # type: ignore[arg-type]  # an index array works and avoids a list
        ds.construct()
        ds.set_label(y[rows])
        ds.set_weight(self.weight[rows])
        return ds

    def train(  # noqa: PLR0917
        self,
        target: _Target,
        train_rows: IntArray,
        valid_rows: IntArray | None,
        rounds: int,
        stopping: int,
        seed: int,
    ) -> tuple[Any, int]:
        params = {**self.params, "objective": target.objective, "seed": seed}
        params.pop("max_bin", None)
        train_set = self._dataset(train_rows, target.y)
        callbacks: list[Any] = []
        valid_sets: list[Any] = []
        if valid_rows is not None and valid_rows.size and stopping > 0:
            valid_sets = [self._dataset(valid_rows, target.y)]
            callbacks = [self._lgb.early_stopping(stopping, verbose=False)]
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            booster = self._lgb.train(
                params, train_set, num_boost_round=rounds, valid_sets=valid_sets, callbacks=callbacks
            )
        self.timer.lgb += time.perf_counter() - t0
        best = booster.best_iteration if booster.best_iteration > 0 else booster.current_iteration()
        return booster, int(best)


def _calibrate(pred: FloatArray, y: FloatArray) -> dict[str, list[float]] | None:
    """Isotonic map from out-of-fold probability to observed frequency (binary targets only)."""
    if np.unique(y).size < 2:
        return None
    from sklearn.isotonic import IsotonicRegression

    iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(pred, y)
    return {"x": iso.X_thresholds_.tolist(), "y": iso.y_thresholds_.tolist()}


def _apply_calibration(pred: FloatArray, cal: Mapping[str, list[float]] | None) -> FloatArray:
    if not cal:
        return pred
    return np.asarray(np.interp(pred, np.asarray(cal["x"]), np.asarray(cal["y"])), dtype=np.float64)


# --------------------------------------------------------------------------- fit


def fit_policy(
    dp: DecisionPoints,
    *,
    lam: float | None = None,
    method: str = "behavior",
    folds: int = 5,
    seed: int = 0,
    params: Mapping[str, Any] | None = None,
    max_rounds: int = MAX_ROUNDS,
    early_stopping: int = EARLY_STOPPING,
    min_turns: int = 2,
    with_cap: bool = True,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> FitResult:
    """Cross-fit Q, S, K (and C for ``method="optimal"``), tune τ, apply the guard.

    Returns a :class:`FitResult` whose ``manifest``/``models`` hold either the
    learned policy (``kind="model"``) or, when it does not beat the best tuned
    heuristic in cross-validated value at ``lam``, that heuristic (``kind="heuristic"``).
    Raises :class:`TrainingError` when the decision points cannot train a policy.
    """
    t_start = time.perf_counter()
    say = log or (lambda msg: None)
    notes: list[str] = []
    if method not in ("behavior", "optimal"):
        raise TrainingError(f"method must be 'behavior' or 'optimal', got {method!r}")
    if dp.n_rows == 0:
        raise TrainingError("no decision points: the traces hold nothing to learn from")
    if dp.n_traces < 2:
        raise TrainingError(
            f"{dp.n_traces} trace: cross-validation needs at least 2 traces (better: many tasks)"
        )
    if dp.X.shape[1] != len(FEATURE_NAMES):
        raise TrainingError(
            f"decision points have {dp.X.shape[1]} features, the featurizer has {len(FEATURE_NAMES)}"
        )
    if folds < 2:
        raise TrainingError(f"--folds must be at least 2 for cross-validation, got {folds}")
    lam = default_lambda(dp.cost_unit) if lam is None else float(lam)
    if not (math.isfinite(lam) and lam >= 0):
        raise TrainingError(f"lambda must be a finite number >= 0, got {lam}")
    if np.unique(dp.group).size < 2:
        notes.append(
            f"only one group ({dp.group[0]!r}): grouped cross-validation is impossible; folds split "
            "the traces of that group instead, so the CV value is optimistic for unseen tasks"
        )
        dp = replace(dp, group=dp.trace_id.copy())
    if np.all(dp.trace_q_final == dp.trace_q_final[0]):
        notes.append(
            f"every trace has the same outcome ({dp.trace_q_final[0]:g}): Q is constant, "
            "so the policy can only trade cost; the guard still compares it with the heuristics"
        )
    if float(np.max(dp.trace_c_final, initial=0.0)) <= 0.0:
        notes.append(f"no trace carries any cost in {dp.cost_unit}: K is 0 and λ has no effect")

    base_params = {**DEFAULT_PARAMS, **(params or {})}
    if base_params.get("min_data_in_leaf") == "auto":
        base_params["min_data_in_leaf"] = max(20, dp.n_rows // 100)
    trace_fold = group_folds(dp.group, folds, seed)
    k = int(np.unique(trace_fold).size)
    row_fold = _row_folds(dp, trace_fold)
    weight = _ipw(dp)
    if not np.all(weight == 1.0):
        notes.append("logged decisions carry propensities < 1: rows are inverse-propensity weighted")
    timer = _Timer()
    trainer = _Trainer(np.ascontiguousarray(dp.X, dtype=np.float64), weight, base_params, timer)
    targets = {
        "q": _target("q", dp.q_final),
        "s": _target("s", dp.q),
        "k": _target("k", np.maximum(dp.c_final - dp.c, 0.0)),
        # the gain of continuing, fitted directly: Q − S from two models adds their errors
        "d": _Target("d", dp.q_final - dp.q, "regression", "identity", False),
    }
    rng = np.random.default_rng(seed)
    rows_all = np.arange(dp.n_rows, dtype=np.int64)
    fold_splits: list[tuple[IntArray, IntArray, IntArray]] = []
    for f in range(k):
        train_traces = np.flatnonzero(trace_fold != f)
        valid_flag = _inner_split(dp.task_id[train_traces], rng)
        is_valid_trace = np.zeros(dp.n_traces, dtype=bool)
        is_valid_trace[train_traces[valid_flag]] = True
        in_train = (row_fold != f) & ~is_valid_trace[dp.trace_idx]
        in_valid = (row_fold != f) & is_valid_trace[dp.trace_idx]
        fold_splits.append((rows_all[in_train], rows_all[in_valid], rows_all[row_fold == f]))

    fold_gain: list[FloatArray] = []

    def cross_fit(target: _Target, bar: Any) -> tuple[FloatArray, list[int], list[FloatArray]]:
        oof = np.zeros(dp.n_rows)
        iters: list[int] = []
        inner_preds: list[FloatArray] = []
        for f, (tr, va, te) in enumerate(fold_splits):
            booster, best = trainer.train(target, tr, va, max_rounds, early_stopping, seed + f)
            oof[te] = booster.predict(dp.X[te], num_iteration=best)
            inner_preds.append(booster.predict(dp.X[va], num_iteration=best) if va.size else np.zeros(0))
            gains = booster.feature_importance(importance_type="gain", iteration=best)
            if float(gains.sum()) > 0:
                fold_gain.append(gains / float(gains.sum()))
            iters.append(best)
            if bar is not None:
                bar.update(1)
        return oof, iters, inner_preds

    n_steps = k * (4 + (OPTIMAL_PASSES if method == "optimal" else 0)) + 4
    bar = _progress(n_steps, "training", progress)
    oof: dict[str, FloatArray] = {}
    best_iters: dict[str, list[int]] = {}
    inner: dict[str, list[FloatArray]] = {}
    for name in ("q", "s", "k", "d"):
        oof[name], best_iters[name], inner[name] = cross_fit(targets[name], bar)
    calibration: dict[str, dict[str, list[float]] | None] = {}
    for name in ("q", "s"):
        cal = _calibrate(oof[name], targets[name].y) if targets[name].binary else None
        calibration[name] = cal
        oof[name] = _apply_calibration(oof[name], cal)
        inner[name] = [_apply_calibration(p, cal) for p in inner[name]]
    oof["k"] = np.maximum(oof["k"], 0.0)
    inner["k"] = [np.maximum(p, 0.0) for p in inner["k"]]

    def inner_v(lam_: float, use_c: bool) -> list[tuple[IntArray, FloatArray]]:
        out = []
        for f, (_, va, _) in enumerate(fold_splits):
            if use_c:
                out.append((va, inner["c"][f] - inner["s"][f]))
            else:
                out.append((va, _gain(inner["q"][f], inner["s"][f], inner["d"][f]) - lam_ * inner["k"][f]))
        return out

    allowed = dp.turn >= min_turns
    loop_stop = dp.loop.copy()
    nets = _net_options(dp.c, loop_stop, with_cap)
    v_behavior = _gain(oof["q"], oof["s"], oof["d"]) - lam * oof["k"]

    # --------------------------------------------------------- optimal: fitted backward induction
    c_target: _Target | None = None
    opt_tau = 0.0
    v_opt: FloatArray | None = None
    if method == "optimal":
        stop_rule = np.zeros(dp.n_rows, dtype=bool)  # pass 0: the later rule is "continue as logged"
        for p in range(OPTIMAL_PASSES):
            y = _next_stop_value(dp, stop_rule, lam) + lam * dp.c
            c_target = _Target("c", y, "regression", "identity", False)
            oof["c"], best_iters["c"], inner["c"] = cross_fit(c_target, bar)
            v_opt = oof["c"] - oof["s"]
            opt_tau, opt_net, _ = _tune_rule(dp, v_opt, allowed, loop_stop, lam, nets)
            stop_rule = ((v_opt < -opt_tau) & allowed) | _net_mask(dp, loop_stop, opt_net)
            say(f"optimal pass {p + 1}/{OPTIMAL_PASSES}: tau {opt_tau:.4g}")

    # --------------------------------------------------------- CV values: learned vs heuristics
    policies: dict[str, dict[str, float]] = {}
    never = np.zeros(dp.n_rows, dtype=bool)
    policies["behavior"] = _summary(dp, never, lam)
    r_stop = dp.r_stop(lam)
    oracle = np.zeros(dp.n_rows, dtype=bool)
    best_row = np.maximum.reduceat(r_stop, dp.offsets[:-1])
    oracle[(r_stop == np.repeat(best_row, np.diff(dp.offsets)))] = True
    policies["oracle"] = _summary(dp, oracle, lam)
    masks, heur_params = cross_fit_heuristics(dp, lam, folds=folds, seed=seed, min_turns=min_turns)
    for name in HEURISTICS:
        policies[name] = _summary(dp, masks[name], lam)
    v_cv = v_opt if v_opt is not None else v_behavior
    learned_stop, fold_taus, fold_nets = _cv_value(
        dp, v_cv, inner_v(lam, v_opt is not None), allowed, loop_stop, lam, trace_fold, nets
    )
    policies["learned"] = _summary(dp, learned_stop, lam)
    if v_opt is not None:
        beh_stop, _, _ = _cv_value(
            dp, v_behavior, inner_v(lam, False), allowed, loop_stop, lam, trace_fold, nets
        )
        policies["learned_behavior_method"] = _summary(dp, beh_stop, lam)
    if bar is not None:
        bar.update(1)

    best_heur = max(HEURISTICS, key=lambda h: policies[h]["value"])
    learned_value = policies["learned"]["value"]
    heur_value = policies[best_heur]["value"]
    ship_model = learned_value > heur_value + 1e-9

    # --------------------------------------------------------- tau on all out-of-fold rows
    v_final = v_opt if v_opt is not None else v_behavior
    tau, net, _ = _tune_rule(dp, v_final, allowed, loop_stop, lam, nets)
    cap, use_loop = net
    net_stop = _net_mask(dp, loop_stop, net)
    opt_tau_topo: dict[str, float] = {}
    if v_opt is not None:
        opt_tau = tau
        opt_tau_topo = _tau_by_topology(dp, v_opt, allowed, net_stop, lam)
        tau, _ = _tune_tau(dp, v_behavior, allowed, net_stop, lam)
    grid_lams = sorted({lam * m for m in LAMBDA_GRID} | {lam})
    grid_taus: list[float] = []
    for gl in grid_lams:
        v = _gain(oof["q"], oof["s"], oof["d"]) - gl * oof["k"]
        t_gl, _ = _tune_tau(dp, v, allowed, net_stop, gl)
        grid_taus.append(t_gl)
    model_acts = math.isfinite(opt_tau if v_opt is not None else tau)
    if ship_model and not model_acts:
        # the model never stops at this lambda: what would ship is its cost cap, a heuristic
        ship_model = False
        notes.append("the tuned model never stops a run at this lambda (tau is infinite)")
    if bar is not None:
        bar.update(1)

    # --------------------------------------------------------- final models on every row
    models: dict[str, str] = {}
    entries: dict[str, dict[str, Any]] = {}
    importance: dict[str, float] = {}
    final_targets = dict(targets)
    if c_target is not None:
        final_targets["c"] = c_target
    if ship_model:
        for name, target in final_targets.items():
            rounds = max(1, round(float(np.mean(best_iters[name])) * 1.1))
            booster, _ = trainer.train(target, rows_all, None, rounds, 0, seed)
            models[name] = booster.model_to_string()
            entries[name] = {
                "target": _TARGET_DOC[name],
                "objective": target.objective,
                "transform": target.transform,
                "rounds": rounds,
                "calibration": calibration.get(name),
            }
            gains = booster.feature_importance(importance_type="gain")
            total = float(gains.sum())
            if total > 0:
                for fname, g in zip(FEATURE_NAMES, gains, strict=True):
                    importance[fname] = importance.get(fname, 0.0) + float(g) / total / len(final_targets)
    if bar is not None:
        bar.update(2)
        bar.close()
    if not importance and fold_gain:
        # no final model (a heuristic ships): report what the cross-validation models used
        mean_gain = np.mean(np.vstack(fold_gain), axis=0)
        importance = {n: float(g) for n, g in zip(FEATURE_NAMES, mean_gain, strict=True)}
    importance = dict(sorted(importance.items(), key=lambda kv: -kv[1]))

    # --------------------------------------------------------- metrics and manifest
    metrics: dict[str, Any] = {
        "folds": k,
        "group_by_groups": int(np.unique(dp.group).size),
        "lambda": lam,
        "policies": policies,
        "best_heuristic": best_heur,
        "fold_taus": fold_taus,
        "fold_cost_caps": [n[0] for n in fold_nets],
        "fold_loop_detector": [n[1] for n in fold_nets],
        "loop_detector": use_loop,
        "cost_cap": cap,
        "heuristic_params": heur_params.get(best_heur, []),
    }
    if targets["q"].binary and np.unique(targets["q"].y).size == 2:
        from sklearn.metrics import roc_auc_score

        metrics["q_auc"] = float(roc_auc_score(targets["q"].y, oof["q"]))
    metrics["k_rmse"] = float(np.sqrt(np.mean((oof["k"] - targets["k"].y) ** 2)))
    safety = _shipped_safety(min_turns, cap, use_loop, dp.cost_unit)
    chosen = "learned" if ship_model else best_heur
    guard = {
        "learned_cv_value": learned_value,
        "best_heuristic": best_heur,
        "best_heuristic_cv_value": heur_value,
        "shipped": "learned model" if ship_model else f"heuristic {best_heur}",
    }
    manifest: dict[str, Any] = {
        "kind": "model" if ship_model else "heuristic",
        "method": method if ship_model else "heuristic",
        "model_version": None,
        "feature_names": list(FEATURE_NAMES),
        "cost_unit": dp.cost_unit,
        "default_lambda": lam,
        "tau": tau if ship_model else None,
        "tau_grid": {"lambda": grid_lams, "tau": grid_taus} if ship_model else None,
        "guard": guard,
        "training_data": fingerprint(dp),
        "cv": metrics,
        "feature_importance": {k_: round(v_, 6) for k_, v_ in list(importance.items())[:20]},
        "params": {**base_params, "max_rounds": max_rounds, "early_stopping": early_stopping},
        "models": entries,
        "notes": notes,
    }
    if ship_model and method == "optimal":
        manifest["optimal"] = {"lambda": lam, "tau": opt_tau, "passes": OPTIMAL_PASSES}
        if opt_tau_topo:
            manifest["optimal"]["tau_by_topology"] = opt_tau_topo
    if ship_model:
        manifest["safety"] = safety.to_dict()
    else:
        tuned = tune_heuristics(dp, lam, min_turns=min_turns)[best_heur]
        manifest["safety"] = tuned.to_safety_config().to_dict()
        manifest["heuristic"] = tuned.to_dict()
        notes.append(
            f"the learned policy (CV value {learned_value:.4g}) does not beat the tuned heuristic "
            f"{best_heur!r} ({heur_value:.4g}) at lambda {lam:g}: SHIPPING THE HEURISTIC "
            f"({tuned.rule.describe(dp.cost_unit)}), not a model"
        )
    manifest["model_version"] = _version(manifest)
    total = time.perf_counter() - t_start
    return FitResult(
        manifest=manifest,
        models=models,
        chosen=chosen,
        cv=metrics,
        importance=importance,
        warnings=notes,
        timings={"total_s": total, "lightgbm_train_s": timer.lgb},
    )


_TARGET_DOC: Final = {
    "q": "E[q_T | s_t]: quality at the run's own end",
    "s": "E[q_t | s_t]: quality if stopped now",
    "k": "E[c_T - c_t | s_t]: cost still to be spent",
    "d": "E[q_T - q_t | s_t]: quality gained by continuing (V_stop = D - lambda K)",
    "c": "E[q_tau - lambda (c_tau - c_t) | s_t] under the fitted later rule",
}


def _version(manifest: Mapping[str, Any]) -> str:
    digest = str(manifest.get("training_data", {}).get("sha256", ""))[:8]
    return f"{manifest.get('kind')}-{manifest.get('method')}-{time.strftime('%Y%m%d%H%M%S')}-{digest}"


def _shipped_safety(min_turns: int, cap: float | None, loop: bool, cost_unit: str) -> Any:
    """Safety nets shipped with a learned model: min_turns and the tuned cost cap and loop detector."""
    from stopserve.training.heuristics import HeuristicRule

    return HeuristicRule(cost_cap=cap, loop=loop, min_turns=min_turns).to_safety_config(cost_unit)


def _progress(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=" fits", file=sys.stderr)


# --------------------------------------------------------------------------- CLI


def _table(rows: Iterable[tuple[str, ...]]) -> str:
    rows = list(rows)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for j, r in enumerate(rows):
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def train_command(args: argparse.Namespace) -> int:
    """``stopserve train TRACES -o MODEL_DIR``: fit, guard, write the model directory, print a summary."""
    from stopserve.trace import read_traces
    from stopserve.training.labels import build_decision_points

    progress = not args.no_progress
    dp = build_decision_points(
        read_traces(args.traces),
        cost_unit=args.cost_unit,
        labels_from_rewards=args.labels_from_rewards,
        group_by=args.group_by,
        progress=progress,
    )
    result = fit_policy(
        dp,
        lam=args.lam,
        method=args.method,
        folds=args.folds,
        seed=args.seed,
        min_turns=getattr(args, "min_turns", 2),
        progress=progress,
    )
    # what evaluate needs to rebuild the same labels
    result.manifest["labels_from_rewards"] = bool(args.labels_from_rewards)
    result.manifest["group_by"] = args.group_by
    out = result.save(args.output)
    cv = result.cv
    pol = cv["policies"]
    rows: list[tuple[str, ...]] = [("policy", "CV value", "success", f"cost ({dp.cost_unit})")]
    for name in ("learned", cv["best_heuristic"], "behavior", "oracle"):
        p = pol[name]
        label = name if name != cv["best_heuristic"] else f"{name} (best heuristic)"
        rows.append((label, f"{p['value']:.4f}", f"{p['success']:.3f}", f"{p['cost']:.4g}"))
    print(
        f"\n{dp.n_traces} traces, {dp.n_rows} decision points, {cv['folds']}-fold CV grouped by "
        f"{args.group_by}, lambda {cv['lambda']:g} per {dp.cost_unit}",
        file=sys.stderr,
    )
    print(_table(rows), file=sys.stderr)
    if result.importance:
        print("\ntop features (gain share):", file=sys.stderr)
        imp = [("feature", "share")] + [(n, f"{s:.3f}") for n, s in list(result.importance.items())[:10]]
        print(_table(imp), file=sys.stderr)
    for note in result.warnings:
        print(f"\nNOTE: {note}", file=sys.stderr)
    shipped = result.manifest["guard"]["shipped"]
    print(f"\nchosen policy: {shipped}; wrote {out}", file=sys.stderr)
    return 0
