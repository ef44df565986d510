"""Learn a stop policy that never loses to the rule it could have been.

:class:`PolicyLearner` is a scikit-learn style estimator (no logic in ``__init__``,
``fit`` returns ``self``, learned state ends in ``_``). From stop-annotated traces it:

1. builds one row per decision point with the live featurizer, with the safety nets
   every served policy runs with (``stopserve.training.labels``);
2. cross-fits LightGBM models by group (a task, repository or system never straddles
   folds): G ≈ E[q_T − q_t | s] (``g``, quality still to gain), K ≈ the cost still to
   come in turn-equivalents (``k``: the cost to go over the run's own mean cost per
   decision point so far, so it transfers between cheap and expensive systems), and for
   ``method="optimal"`` S ≈ E[q_t | s] (``s``) and C, the value realised by the fitted
   backward-induction rule (``c``, Longstaff–Schwartz style);
3. per fold, tunes every heuristic on the fold's training traces, takes the best as the
   base rule, and tunes the learned policy's margins, ``min_turns`` and method on the
   fold model's held-out early-stopping rows (:mod:`stopserve.training.tuning`): the
   policy deviates from its base rule only where the gain clears a pessimistic bound;
4. replays every fold's learned policy and every fold's tuned heuristics through
   ``Policy.decide`` on the fold's held-out traces — the code the service runs — which
   gives the cross-validated values;
5. ships the learned policy only when the grouped, paired bootstrap lower bound (5%
   quantile, over groups) of (learned − best heuristic) is ≥ 0 with at least
   ``min_groups`` groups; otherwise ships that heuristic, and says so with the numbers;
6. records the shipped policy's in-sample value, replayed through ``decide``, so
   ``stopserve evaluate`` of the written directory on the same traces gives the same
   number (tested).

What cost is worth: ``lam`` (per cost unit) or ``cost_share`` s ("a whole behavior
run costs s of what a success is worth", resolved to λ = s / the mean logged cost,
recorded in the manifest; the default is s = 0.3). ``cost_scale="per_run"`` trains a
model meant to serve systems it has never seen: costs are normalised per data set,
the base rule can only be one that means the same on any system (a reward threshold,
the loop detector: no turn or cost cap), and served, λ comes from each run's own
expected total cost (``stopserve.policy``).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from stopserve.artifacts import save_model_dir
from stopserve.errors import TrainingError
from stopserve.features import FEATURE_NAMES, scale_free_features
from stopserve.policy import METHOD_MODELS, Policy
from stopserve.safety import DEFAULT_SAFETY, SafetyConfig
from stopserve.trace import Trace, read_traces
from stopserve.training.heuristics import (
    HEURISTICS,
    TunedHeuristic,
    cross_fit_heuristics,
    group_folds,
    replay,
)
from stopserve.training.labels import DecisionPoints, build_decision_points
from stopserve.training.replay import replay_decide, replay_rows
from stopserve.training.tuning import Tuned, learned_mask, tune_policy

__all__ = [
    "DEFAULT_COST_SHARE",
    "DEFAULT_PARAMS",
    "MIN_GROUPS",
    "PolicyLearner",
    "TraceSource",
    "train_command",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: "A whole behavior run costs 30% of what a success is worth": the evaluation protocol's headline.
DEFAULT_COST_SHARE: Final = 0.3
#: Fewer task groups than this: the guard cannot tell a model from luck; the heuristic ships.
MIN_GROUPS: Final = 10
#: Bootstrap draws over groups for the guard's interval.
N_BOOT: Final = 1000
#: The guard's lower bound: this quantile of the bootstrap distribution of (learned − heuristic).
GUARD_QUANTILE: Final = 0.05

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
MAX_ROUNDS: Final = 300
EARLY_STOPPING: Final = 30
#: Inverse-propensity weights are clipped here (variance control).
MAX_IPW: Final = 20.0
#: Passes of fitted backward induction for ``method="optimal"``.
OPTIMAL_PASSES: Final = 3
#: The trainer's own replays (each fold's policy, the in-sample one) use LightGBM's predict: they
#: decide each run only until its first stop, tens of thousands of rows once, and compiling each
#: fold's boosters would cost more (seconds per model) than it saves. The scores are the same to
#: the last bit either way (tests/test_inference.py); the policy a user loads is compiled.
REPLAY_ENGINE: Final = "lightgbm"
#: The turn-equivalent cost-to-go target is clipped here (a first turn that cost nothing).
MAX_K_TURNS: Final = 1000.0
METHODS: Final = ("behavior", "optimal")

_TARGET_DOC: Final = {
    "g": "E[q_T - q_t | s_t]: quality still gained by continuing to the run's own end",
    "k": "E[(c_T - c_t) / (c_t / turn) | s_t]: cost still to come, in turn-equivalents of this run",
    "s": "E[q_t | s_t]: quality handed back if the run stops now",
    "c": "E[q_tau - lambda (c_tau - c_t) | s_t] under the fitted later rule (method optimal)",
}


# --------------------------------------------------------------------------- traces, twice


class TraceSource:
    """Traces that can be walked more than once: a list of traces, or files read again each time.

    The learner folds the traces twice (decision points, then replays through
    ``decide``); from files nothing but one trace at a time is held in memory.
    """

    def __init__(self, traces: Iterable[Trace] | Sequence[str | Path]) -> None:
        items = list(traces)
        self._paths: list[str | Path] | None = None
        self._traces: list[Trace] | None = None
        if items and all(isinstance(x, str | Path) for x in items):
            self._paths = [x for x in items if isinstance(x, str | Path)]
        else:
            self._traces = [x for x in items if isinstance(x, Trace)]
            if len(self._traces) != len(items):
                raise TrainingError("traces must be Trace objects or paths of trace files, not a mix")

    def __iter__(self) -> Iterator[Trace]:
        if self._paths is not None:
            return iter(read_traces(self._paths))
        return iter(self._traces or [])


# --------------------------------------------------------------------------- helpers


def _ipw(dp: DecisionPoints) -> FloatArray:
    """Row weights ``Π_{j<=t} 1/p_j`` within each trace, clipped, mean 1 (1 when no exploration)."""
    p = np.clip(dp.propensity, 1e-6, 1.0)
    if np.all(p == 1.0):
        return np.ones(dp.n_rows)
    logw = -np.log(p)
    csum = np.cumsum(logw)
    start_sum = np.concatenate([[0.0], csum])[dp.offsets[:-1]]
    logw_cum = csum - np.repeat(start_sum, np.diff(dp.offsets))
    w = np.minimum(np.exp(logw_cum), MAX_IPW)
    return np.asarray(w / w.mean(), dtype=np.float64)


def _inner_split(groups: npt.NDArray[np.str_], rng: np.random.Generator) -> BoolArray:
    """Per-trace flag: held out for early stopping and tuning (about 25% of the groups, at least one)."""
    uniq = np.unique(groups)
    n_valid = max(1, round(0.25 * uniq.size)) if uniq.size > 1 else 0
    chosen = set(rng.choice(uniq, size=n_valid, replace=False).tolist()) if n_valid else set()
    return np.asarray([g in chosen for g in groups], dtype=bool)


def _next_stop_value(dp: DecisionPoints, stop: BoolArray, lam: float) -> FloatArray:
    """For each row t: ``q_j − λ·c_j`` at the rule's first stop j > t in the trace, else the logged end."""
    n = dp.n_rows
    idx = np.arange(n, dtype=np.int64)
    trace_end = dp.offsets[1:][dp.trace_idx]
    cand = np.where(stop, idx, trace_end)
    at_or_after = np.minimum.accumulate(cand[::-1])[::-1]
    after = np.empty(n, dtype=np.int64)
    after[:-1] = at_or_after[1:]
    after[-1] = n
    after = np.where(dp.is_last | (after >= trace_end), trace_end, after)
    stopped = after < trace_end
    j = np.where(stopped, after, 0)
    return np.where(stopped, dp.q[j] - lam * dp.c[j], dp.q_final - lam * dp.c_final)


def k_target(dp: DecisionPoints) -> FloatArray:
    """The cost still to come in turn-equivalents: ``(c_T − c_t) / (c_t / max(turn, 1))``.

    Scale-free (a system whose turns cost 1M tokens and one whose turns cost 1k give the
    same number for the same shape of run). Where nothing was spent yet, the decision
    points still to come.
    """
    rows_left = (dp.offsets[1:][dp.trace_idx] - 1 - np.arange(dp.n_rows)).astype(np.float64)
    per_turn = dp.c / np.maximum(dp.turn, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (dp.c_final - dp.c) / per_turn
    y = np.where(dp.c > 0, ratio, rows_left)
    return np.asarray(np.clip(y, 0.0, MAX_K_TURNS), dtype=np.float64)


def fingerprint(dp: DecisionPoints) -> dict[str, Any]:
    """Counts and a sha256 over the training matrix and labels (what the model saw)."""
    h = hashlib.sha256()
    for arr in (dp.X, dp.q, dp.c, dp.q_final, dp.c_final, dp.offsets):
        h.update(np.ascontiguousarray(arr).tobytes())
    h.update("\n".join(dp.trace_id.tolist()).encode())
    datasets, counts = np.unique(dp.dataset, return_counts=True)
    return {
        "n_traces": dp.n_traces,
        "n_decision_points": dp.n_rows,
        "n_tasks": len(np.unique(dp.task_id)),
        "n_groups": len(np.unique(dp.group)),
        "datasets": {str(d): int(n) for d, n in zip(datasets, counts, strict=True)},
        "success_rate": float(dp.trace_q_final.mean()),
        "mean_cost": float((dp.trace_c_final * dp.cost_scale).mean()),
        "cost_unit": dp.cost_unit,
        "sha256": h.hexdigest(),
    }


def bootstrap_diff(
    diff: FloatArray, groups: npt.NDArray[np.str_], *, n_boot: int = N_BOOT, seed: int = 0
) -> FloatArray:
    """Bootstrap draws of the mean per-trace ``diff``, resampling whole groups (paired)."""
    _, gid = np.unique(groups, return_inverse=True)
    n_groups = int(gid.max()) + 1
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), size=n_boot).astype(np.float64)
    sums = np.bincount(gid, weights=diff, minlength=n_groups)
    counts = np.bincount(gid, minlength=n_groups).astype(np.float64)
    result: FloatArray = (weights @ sums) / np.maximum(weights @ counts, 1.0)
    return result


# --------------------------------------------------------------------------- LightGBM


@dataclass
class _Target:
    name: str
    y: FloatArray
    objective: str
    #: rows this target learns from (None: all)
    rows: BoolArray | None = None


class _Trainer:
    """Trains boosters on row subsets of one binned matrix (bins computed once)."""

    def __init__(self, matrix: FloatArray, weight: FloatArray, params: Mapping[str, Any]) -> None:
        import lightgbm as lgb

        self._lgb = lgb
        self.weight = weight
        self.params = dict(params)
        self.seconds = 0.0
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

    def train(
        self, target: _Target, train_rows: IntArray, valid_rows: IntArray | None, rounds: int, seed: int
    ) -> tuple[Any, int]:
        """A booster cut at its best iteration (early stopping on ``valid_rows``), and that iteration."""
        if target.rows is not None:
            train_rows = train_rows[target.rows[train_rows]]
            if valid_rows is not None:
                valid_rows = valid_rows[target.rows[valid_rows]]
        params = {**self.params, "objective": target.objective, "seed": seed}
        params.pop("max_bin", None)
        train_set = self._dataset(train_rows, target.y)
        callbacks: list[Any] = []
        valid_sets: list[Any] = []
        if valid_rows is not None and valid_rows.size:
            valid_sets = [self._dataset(valid_rows, target.y)]
            callbacks = [self._lgb.early_stopping(EARLY_STOPPING, verbose=False)]
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            booster = self._lgb.train(
                params, train_set, num_boost_round=rounds, valid_sets=valid_sets, callbacks=callbacks
            )
        self.seconds += time.perf_counter() - t0
        best = booster.best_iteration if booster.best_iteration > 0 else booster.current_iteration()
        # served policies evaluate every tree: keep exactly the trees the fit chose
        cut = self._lgb.Booster(model_str=booster.model_to_string(num_iteration=best))
        return cut, int(best)


def _targets(dp: DecisionPoints) -> dict[str, _Target]:
    return {
        "g": _Target("g", dp.q_final - dp.q, "regression"),
        "k": _Target("k", k_target(dp), "regression"),
        # the outcome filled in at a run's own end is not what an early stop hands back: S learns
        # from the qualities a stop can take (grades, rewards), not from where the run ended anyway
        "s": _Target(
            "s",
            dp.q,
            "cross_entropy" if bool(np.all((dp.q >= 0) & (dp.q <= 1))) else "regression",
            rows=~dp.q_filled,
        ),
    }


# --------------------------------------------------------------------------- the learner


@dataclass
class _Fold:
    """One fold of the cross-fitting: its rows and its models."""

    train: IntArray
    valid: IntArray
    test: IntArray
    boosters: dict[str, Any] = field(default_factory=dict)
    iters: dict[str, int] = field(default_factory=dict)


class PolicyLearner:
    """Learn a stop policy from traces; see the module docstring.

    >>> learner = PolicyLearner(cost_share=0.3).fit(traces)   # doctest: +SKIP
    >>> learner.save("model/")                                 # doctest: +SKIP
    >>> learner.guard_["shipped"]                              # doctest: +SKIP
    'learned model'
    """

    def __init__(
        self,
        *,
        lam: float | None = None,
        cost_share: float | None = None,
        cost_scale: str = "fixed",
        method: str = "auto",
        min_turns: int | None = None,
        features: str | Sequence[str] = "all",
        folds: int = 5,
        seed: int = 0,
        params: Mapping[str, Any] | None = None,
        max_rounds: int = MAX_ROUNDS,
        min_groups: int = MIN_GROUPS,
        n_boot: int = N_BOOT,
        nets: SafetyConfig | None = None,
        progress: bool = False,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.lam = lam
        self.cost_share = cost_share
        self.cost_scale = cost_scale
        self.method = method
        self.min_turns = min_turns
        self.features = features
        self.folds = folds
        self.seed = seed
        self.params = params
        self.max_rounds = max_rounds
        self.min_groups = min_groups
        self.n_boot = n_boot
        self.nets = nets
        self.progress = progress
        self.log = log

    # ----------------------------------------------------------------- checks

    def _check_params(self) -> None:
        if self.method not in ("auto", *METHODS):
            raise TrainingError(f"method must be auto, behavior or optimal, got {self.method!r}")
        if self.cost_scale not in ("fixed", "per_run"):
            raise TrainingError(f"cost_scale must be 'fixed' or 'per_run', got {self.cost_scale!r}")
        if self.lam is not None and self.cost_share is not None:
            raise TrainingError("give lambda or cost share, not both")
        for name, value in (("lambda", self.lam), ("cost share", self.cost_share)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise TrainingError(f"{name} must be a finite number >= 0, got {value}")
        if self.cost_scale == "per_run" and self.lam is not None:
            raise TrainingError(
                "cost_scale per_run needs a cost share (λ then comes from each run's own cost)"
            )
        if self.folds < 2:
            raise TrainingError(f"--folds must be at least 2 for cross-validation, got {self.folds}")
        if self.min_turns is not None and self.min_turns < 0:
            raise TrainingError(f"min_turns must be >= 0, got {self.min_turns}")

    def _features_used(self) -> tuple[str, ...]:
        if self.features == "all":
            return FEATURE_NAMES
        if self.features == "scale-free":
            return scale_free_features()
        names = tuple(self.features)
        unknown = [n for n in names if n not in FEATURE_NAMES]
        if unknown or not names:
            raise TrainingError(
                f"unknown features {unknown}: see docs/features.md" if unknown else "no features"
            )
        return names

    # ----------------------------------------------------------------- fit

    def fit(
        self,
        traces: Iterable[Trace] | Sequence[str | Path] | TraceSource,
        *,
        cost_unit: str | None = None,
        labels_from_rewards: bool = False,
        group_by: str = "task",
    ) -> PolicyLearner:
        """Learn from ``traces`` (Trace objects or trace files); returns ``self``.

        Sets ``dp_`` (the decision points), ``manifest_``/``models_`` (what :meth:`save`
        writes), ``cv_`` (cross-validated figures of every policy), ``guard_`` (the
        comparison that chose what ships), ``chosen_``, ``importance_``, ``notes_`` and
        ``timings_``. Raises :class:`TrainingError` when the traces cannot train a policy.
        """
        self._check_params()
        t_start = time.perf_counter()
        say = self.log or (lambda msg: None)
        notes: list[str] = []
        source = traces if isinstance(traces, TraceSource) else TraceSource(traces)
        nets = self.nets if self.nets is not None else DEFAULT_SAFETY
        per_run = self.cost_scale == "per_run"
        dp = build_decision_points(
            iter(source),
            cost_unit=cost_unit,
            labels_from_rewards=labels_from_rewards,
            group_by=group_by,
            progress=self.progress,
            nets=nets,
            normalize_cost=per_run,
        )
        if dp.n_traces < 2:
            raise TrainingError(
                f"{dp.n_traces} trace: cross-validation needs at least 2 traces (better: many tasks)"
            )
        mean_cost = float((dp.trace_c_final * dp.cost_scale).mean())
        share = self.cost_share
        if self.lam is None and share is None:
            share = DEFAULT_COST_SHARE
        if per_run:
            lam_value, arg_lam, arg_share = float(share or 0.0), None, share
        elif self.lam is not None:
            lam_value, arg_lam, arg_share = float(self.lam), float(self.lam), None
        else:
            lam_value = float(share or 0.0) / mean_cost if mean_cost > 0 else 0.0
            arg_lam, arg_share = lam_value, None
            if mean_cost <= 0:
                notes.append(f"no trace carries any cost in {dp.cost_unit}: the cost share has no effect")
        n_groups = int(np.unique(dp.group).size)
        if n_groups < 2:
            notes.append(
                f"only one group ({dp.group[0]!r}): grouped cross-validation is impossible; folds split "
                "the traces of that group instead, so the CV value is optimistic for unseen tasks"
            )
            dp = replace(dp, group=dp.trace_id.copy())
            n_groups = dp.n_traces
        if np.all(dp.trace_q_final == dp.trace_q_final[0]):
            notes.append(
                f"every trace has the same outcome ({dp.trace_q_final[0]:g}): the policy can only trade "
                "cost; the guard still compares it with the heuristics"
            )
        methods = METHODS if self.method == "auto" else (self.method,)
        min_turns = (1, 2, 3) if self.min_turns is None else (self.min_turns,)
        used = self._features_used()
        X = np.ascontiguousarray(dp.X, dtype=np.float64)  # noqa: N806
        unused = [j for j, n in enumerate(FEATURE_NAMES) if n not in used]
        if unused:
            X[:, unused] = np.nan  # never split on: the model reads only ``used``
        params = {**DEFAULT_PARAMS, **(self.params or {})}
        if params.get("min_data_in_leaf") == "auto":
            params["min_data_in_leaf"] = max(20, dp.n_rows // 100)
        weight = _ipw(dp)
        if not np.all(weight == 1.0):
            notes.append("logged decisions carry propensities < 1: rows are inverse-propensity weighted")
        trainer = _Trainer(X, weight, params)
        trace_fold = group_folds(dp.group, self.folds, self.seed)
        k = int(trace_fold.max()) + 1
        row_fold = trace_fold[dp.trace_idx]
        rng = np.random.default_rng(self.seed)
        rows_all = np.arange(dp.n_rows, dtype=np.int64)
        folds: list[_Fold] = []
        for f in range(k):
            train_traces = np.flatnonzero(trace_fold != f)
            valid_flag = _inner_split(dp.group[train_traces], rng)
            is_valid = np.zeros(dp.n_traces, dtype=bool)
            is_valid[train_traces[valid_flag]] = True
            in_train = (row_fold != f) & ~is_valid[dp.trace_idx]
            in_valid = (row_fold != f) & is_valid[dp.trace_idx]
            folds.append(_Fold(rows_all[in_train], rows_all[in_valid], rows_all[row_fold == f]))
        bar = _progress(k * (2 + ("optimal" in methods) * (1 + OPTIMAL_PASSES)) + 3, self.progress)

        oof: dict[str, FloatArray] = {}
        inner: dict[str, list[FloatArray]] = {}

        def cross_fit(target: _Target) -> None:
            oof[target.name] = np.zeros(dp.n_rows)
            inner[target.name] = []
            for f, fold in enumerate(folds):
                booster, best = trainer.train(target, fold.train, fold.valid, self.max_rounds, self.seed + f)
                fold.boosters[target.name] = booster
                fold.iters[target.name] = best
                oof[target.name][fold.test] = booster.predict(X[fold.test], raw_score=True)
                inner[target.name].append(
                    booster.predict(X[fold.valid], raw_score=True) if fold.valid.size else np.zeros(0)
                )
                if bar is not None:
                    bar.update(1)

        targets = _targets(dp)
        # S is fitted whatever the method: served, it gives q_stop and q_continue, and the
        # run's value V(s) = S + max(0, value of continuing) (message-level credit reads it)
        for name in ("g", "k", "s"):
            cross_fit(targets[name])

        # the best heuristic of each fold, tuned on the fold's training traces
        _, fold_heur = cross_fit_heuristics(dp, lam_value, min_turns=1, transferable=per_run, fold=trace_fold)
        heur_all = _tune_all(dp, lam_value, per_run)
        best_all = max(HEURISTICS, key=lambda h: heur_all[h].value)

        def template(method: str) -> Policy:
            """A policy without boosters: only its ``values`` (the one definition of V) is used."""
            return Policy(
                kind="none",
                safety=nets,
                manifest=self._value_manifest(method, dp, mean_cost, share, lam_value),
            )

        def v_of(method: str, raw: Mapping[str, FloatArray], rows: IntArray | slice) -> FloatArray:
            v, _, _ = template(method).values(
                raw, dp.turn[rows], dp.c_raw[rows], lam=arg_lam, cost_share=arg_share
            )
            return np.asarray(v, dtype=np.float64)

        # --------------------------------------------------------- optimal: fitted backward induction
        c_target: _Target | None = None
        if "optimal" in methods:
            stop_rule = np.zeros(dp.n_rows, dtype=bool)  # pass 0: the later rule is "continue as logged"
            fires_all = heur_all[best_all].stop_mask(dp)
            for p in range(OPTIMAL_PASSES):
                y = _next_stop_value(dp, stop_rule, lam_value) + lam_value * dp.c
                c_target = _Target("c", y, "regression")
                cross_fit(c_target)
                v_opt = v_of("optimal", oof, slice(None))
                tuned = tune_policy(
                    dp, v_opt, fires_all, lam_value, min_turns=min_turns, strata=_strata(dp, per_run)
                )
                stop_rule = learned_mask(
                    dp,
                    v_opt,
                    fires_all,
                    margin_stop=tuned.margin_stop,
                    margin_continue=tuned.margin_continue,
                    min_turns=tuned.min_turns,
                )
                say(f"optimal pass {p + 1}/{OPTIMAL_PASSES}: gain {tuned.gain:.4g}")

        # --------------------------------------------------------- per fold: base rule, margins, method
        fold_policies: list[Policy] = []
        fold_choice: list[dict[str, Any]] = []
        for f, fold in enumerate(folds):
            tuned_h = fold_heur[f]
            base_name = max(HEURISTICS, key=lambda h: tuned_h[h].value)
            base = tuned_h[base_name]
            choice: tuple[str, Tuned] | None = None
            if fold.valid.size:
                sub = dp.subset(np.unique(dp.trace_idx[fold.valid]))
                fires = base.stop_mask(sub)
                for method in methods:
                    raw = {n: inner[n][f] for n in METHOD_MODELS[method]}
                    v = v_of(method, raw, fold.valid)
                    t = tune_policy(
                        sub, v, fires, lam_value, min_turns=min_turns, strata=_strata(sub, per_run)
                    )
                    if choice is None or t.score > choice[1].score + 1e-12:
                        choice = (method, t)
            if choice is None or not choice[1].deviates:
                fold_policies.append(base.policy())
                fold_choice.append({"base": base_name, "deviates": False})
                continue
            method, t = choice
            fold_manifest = {
                **self._value_manifest(method, dp, mean_cost, share, lam_value),
                **_rule_fields(base, t),
            }
            fold_policies.append(
                Policy(
                    kind="model",
                    safety=nets,
                    manifest=fold_manifest,
                    rule=base.to_safety_config(),
                    boosters={n: fold.boosters[n] for n in METHOD_MODELS[method]},
                    engine=REPLAY_ENGINE,
                )
            )
            fold_choice.append({"base": base_name, "deviates": True, "method": method, **_tuned_dict(t)})
        if bar is not None:
            bar.update(1)

        # --------------------------------------------------------- CV: every fold policy through decide
        say("replaying the cross-validated policies through Policy.decide")
        heur_policies = [{h: fold_heur[f][h].policy() for h in HEURISTICS} for f in range(k)]
        stops = replay_decide(
            iter(source),
            dp,
            lambda i: [fold_policies[trace_fold[i]], *heur_policies[trace_fold[i]].values()],
            lam=arg_lam,
            cost_share=arg_share,
        )
        if bar is not None:
            bar.update(1)
        reps = {"learned": replay_rows(dp, stops[0], lam_value)}
        for j, h in enumerate(HEURISTICS, start=1):
            reps[h] = replay_rows(dp, stops[j], lam_value)
        reps["behavior"] = replay(dp, np.zeros(dp.n_rows, dtype=bool), lam_value)
        r_stop = dp.r_stop(lam_value)
        best_row = np.maximum.reduceat(r_stop, dp.offsets[:-1])
        reps["oracle"] = replay(dp, r_stop >= np.repeat(best_row, np.diff(dp.offsets)) - 1e-12, lam_value)
        policies = {name: _summary(r) for name, r in reps.items()}
        best_heur = max(HEURISTICS, key=lambda h: policies[h]["value"])
        by_dataset = {
            str(d): {
                name: float(reps[name].value[dp.dataset == d].mean())
                for name in ("learned", best_heur, "behavior", "oracle")
            }
            for d in np.unique(dp.dataset)
        }

        # --------------------------------------------------------- the guard
        diff = reps["learned"].value - reps[best_heur].value
        draws = bootstrap_diff(diff, dp.group, n_boot=self.n_boot, seed=self.seed)
        lower = float(np.quantile(draws, GUARD_QUANTILE))
        upper = float(np.quantile(draws, 1 - GUARD_QUANTILE))
        mean_diff = float(diff.mean())
        enough = n_groups >= self.min_groups
        ship_model = enough and lower >= 0.0 and mean_diff > 1e-12
        if not enough:
            notes.append(
                f"too little data to trust a learned policy: {n_groups} groups, the guard needs at least "
                f"{self.min_groups} (set by --min-groups); the tuned heuristic ships"
            )

        # --------------------------------------------------------- final models, tuned on out-of-fold values
        models: dict[str, str] = {}
        entries: dict[str, dict[str, Any]] = {}
        importance: dict[str, float] = {}
        final_heur = heur_all[best_heur]
        manifest: dict[str, Any]
        final_tuned: tuple[str, Tuned] | None = None
        if ship_model:
            fires = final_heur.stop_mask(dp)
            for method in methods:
                raw = {n: oof[n] for n in METHOD_MODELS[method]}
                t = tune_policy(
                    dp,
                    v_of(method, raw, slice(None)),
                    fires,
                    lam_value,
                    min_turns=min_turns,
                    strata=_strata(dp, per_run),
                )
                if final_tuned is None or t.score > final_tuned[1].score + 1e-12:
                    final_tuned = (method, t)
            if final_tuned is None or not final_tuned[1].deviates:
                ship_model = False
                notes.append(
                    "tuned on every out-of-fold value, the learned policy never deviates from its base rule: "
                    "the heuristic ships"
                )
        if ship_model and final_tuned is not None:
            method, t = final_tuned
            all_targets = dict(targets)
            if c_target is not None:
                all_targets["c"] = c_target
            for name in sorted({*METHOD_MODELS[method], "g", "s"}):
                rounds = max(1, round(float(np.mean([fo.iters[name] for fo in folds])) * 1.1))
                booster, _ = trainer.train(all_targets[name], rows_all, None, rounds, self.seed)
                models[name] = booster.model_to_string()
                entries[name] = {
                    "target": _TARGET_DOC[name],
                    "objective": all_targets[name].objective,
                    "rounds": rounds,
                }
                gains = booster.feature_importance(importance_type="gain")
                total = float(gains.sum())
                if total > 0:
                    for fname, g in zip(FEATURE_NAMES, gains, strict=True):
                        importance[fname] = importance.get(fname, 0.0) + float(g) / total / len(
                            METHOD_MODELS[method]
                        )
            manifest = {
                "kind": "model",
                **self._value_manifest(method, dp, mean_cost, share, lam_value),
                **_rule_fields(final_heur, t),
                "models": entries,
            }
        else:
            manifest = {
                **final_heur.manifest(),
                **{
                    k_: v_
                    for k_, v_ in self._value_manifest("heuristic", dp, mean_cost, share, lam_value).items()
                },
            }
            manifest["method"] = "heuristic"
        if bar is not None:
            bar.update(1)
        total_gain = sum(importance.values()) or 1.0
        importance = dict(
            sorted(((k_, v_ / total_gain) for k_, v_ in importance.items()), key=lambda kv: -kv[1])
        )

        # --------------------------------------------------------- in-sample replay of what ships
        shipped = Policy.from_manifest(manifest, models, source="trained policy", engine=REPLAY_ENGINE)
        in_rows = replay_decide(iter(source), dp, lambda i: [shipped], lam=arg_lam, cost_share=arg_share)[0]
        in_sample = replay_rows(dp, in_rows, lam_value)
        if bar is not None:
            bar.update(1)
            bar.close()

        chosen = "learned" if ship_model else best_heur
        never_stops = not ship_model and final_heur.rule.describe(dp.cost_unit).startswith("never stop")
        if never_stops:
            notes.append(
                "THE SHIPPED POLICY NEVER STOPS A RUN ON ITS OWN: no tuned cap beat running to the end, so "
                "only the safety nets (loop detector, quality_met, budgets) and the orchestrator's proposed "
                "stops end runs"
            )
        guard: dict[str, Any] = {
            "learned_cv_value": policies["learned"]["value"],
            "best_heuristic": best_heur,
            "best_heuristic_cv_value": policies[best_heur]["value"],
            "difference": mean_diff,
            "difference_interval_90": [lower, upper],
            "lower_bound_quantile": GUARD_QUANTILE,
            "n_groups": n_groups,
            "min_groups": self.min_groups,
            "shipped": "learned model" if ship_model else f"heuristic {best_heur}",
            "shipped_rule": final_heur.rule.describe(dp.cost_unit),
            "in_sample_value": in_sample.mean_value,
            "in_sample_replay": {
                "labels_from_rewards": labels_from_rewards,
                "lambda": arg_lam,
                "cost_share": arg_share,
            },
        }
        cv: dict[str, Any] = {
            "folds": k,
            "group_by": group_by,
            "groups": n_groups,
            "lambda": lam_value,
            "cost_share": share,
            "policies": policies,
            "best_heuristic": best_heur,
            "by_dataset": by_dataset,
            "fold_choices": fold_choice,
        }
        if final_tuned is not None:
            cv["final_tuning"] = {"method": final_tuned[0], **_tuned_dict(final_tuned[1])}
        manifest.update(
            {
                "feature_names": list(FEATURE_NAMES),
                "features_used": list(used),
                "guard": guard,
                "training_data": fingerprint(dp),
                "cv": cv,
                "feature_importance": {k_: round(v_, 6) for k_, v_ in list(importance.items())[:20]},
                "params": {**params, "max_rounds": self.max_rounds, "early_stopping": EARLY_STOPPING},
                "labels_from_rewards": labels_from_rewards,
                "group_by": group_by,
                "notes": notes,
            }
        )
        manifest["model_version"] = _version(manifest)
        self.dp_ = dp
        self.manifest_ = manifest
        self.models_ = models
        self.cv_ = cv
        self.guard_ = guard
        self.chosen_ = chosen
        self.importance_ = importance
        self.notes_ = notes
        self.timings_ = {"total_s": time.perf_counter() - t_start, "lightgbm_train_s": trainer.seconds}
        return self

    def _value_manifest(
        self, method: str, dp: DecisionPoints, mean_cost: float, share: float | None, lam_value: float
    ) -> dict[str, Any]:
        """How the policy weighs cost: the manifest fields ``stopserve.policy`` reads."""
        if self.cost_scale == "per_run":
            return {
                "method": method,
                "cost_unit": dp.cost_unit,
                "cost_scale": {"kind": "per_run"},
                "default_lambda": None,
                "default_cost_share": share,
                "objective": {"lambda": None, "cost_share": share},
            }
        return {
            "method": method,
            "cost_unit": dp.cost_unit,
            "cost_scale": {"kind": "fixed", "mean_behavior_cost": mean_cost},
            "default_lambda": lam_value,
            "default_cost_share": share if self.lam is None else None,
            "objective": {"lambda": lam_value, "cost_share": None},
        }

    # ----------------------------------------------------------------- results

    def _check_fitted(self) -> None:
        if not hasattr(self, "manifest_"):
            raise TrainingError("this PolicyLearner is not fitted yet: call fit(traces) first")

    def policy(self) -> Policy:
        """The shipped policy, ready to decide."""
        self._check_fitted()
        return Policy.from_manifest(self.manifest_, self.models_, source="trained policy")

    def save(self, out_dir: str | Path) -> Path:
        """Write the model directory (see :mod:`stopserve.artifacts`)."""
        self._check_fitted()
        return save_model_dir(out_dir, self.manifest_, self.models_)


def _strata(dp: DecisionPoints, per_run: bool) -> IntArray | None:
    """For a model meant for unseen systems, each trace's data set: no set may lose to the rule."""
    if not per_run:
        return None
    _, inverse = np.unique(dp.dataset, return_inverse=True)
    return np.asarray(inverse, dtype=np.int64)


def _tune_all(dp: DecisionPoints, lam: float, per_run: bool) -> dict[str, TunedHeuristic]:
    from stopserve.training.heuristics import tune_heuristics

    return tune_heuristics(dp, lam, min_turns=1, transferable=per_run)


def _rule_fields(base: TunedHeuristic, tuned: Tuned) -> dict[str, Any]:
    return {
        "rule": base.to_safety_config().to_dict(),
        "rule_name": base.name,
        "rule_text": base.rule.describe(base.cost_unit),
        "margins": {
            "stop": tuned.margin_stop if math.isfinite(tuned.margin_stop) else None,
            "continue": tuned.margin_continue if math.isfinite(tuned.margin_continue) else None,
        },
        "min_turns": tuned.min_turns,
    }


def _tuned_dict(t: Tuned) -> dict[str, Any]:
    return {
        "margin_stop": t.margin_stop if math.isfinite(t.margin_stop) else None,
        "margin_continue": t.margin_continue if math.isfinite(t.margin_continue) else None,
        "min_turns": t.min_turns,
        "score": t.score,
        "gain": t.gain,
    }


def _summary(r: Any) -> dict[str, float]:
    return {"value": r.mean_value, "success": float(r.q.mean()), "cost": float(r.c.mean())}


def _version(manifest: Mapping[str, Any]) -> str:
    digest = str(manifest.get("training_data", {}).get("sha256", ""))[:8]
    return f"{manifest.get('kind')}-{manifest.get('method')}-{time.strftime('%Y%m%d%H%M%S')}-{digest}"


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="training", unit=" steps", file=sys.stderr)


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
    progress = not args.no_progress
    features: str | list[str] = args.features
    if features not in ("all", "scale-free"):
        features = [f.strip() for f in str(features).split(",") if f.strip()]
    learner = PolicyLearner(
        lam=args.lam,
        cost_share=args.cost_share,
        cost_scale=args.cost_scale.replace("-", "_"),
        method=args.method,
        min_turns=None if args.min_turns == "auto" else int(args.min_turns),
        features=features,
        folds=args.folds,
        seed=args.seed,
        min_groups=args.min_groups,
        progress=progress,
    ).fit(
        [str(p) for p in args.traces],
        cost_unit=args.cost_unit,
        labels_from_rewards=args.labels_from_rewards,
        group_by=args.group_by,
    )
    out = learner.save(args.output)
    dp = learner.dp_
    cv = learner.cv_
    guard = learner.guard_
    pol = cv["policies"]
    rows: list[tuple[str, ...]] = [("policy", "CV value", "success", f"cost ({dp.cost_unit})")]
    for name in ("learned", cv["best_heuristic"], "behavior", "oracle"):
        p = pol[name]
        label = name if name != cv["best_heuristic"] else f"{name} (best heuristic)"
        rows.append((label, f"{p['value']:.4f}", f"{p['success']:.3f}", f"{p['cost']:.4g}"))
    weight = (
        f"cost share {cv['cost_share']:g} (lambda {cv['lambda']:.4g}"
        if cv["cost_share"] is not None
        else (f"lambda {cv['lambda']:g} (")
    )
    print(
        f"\n{dp.n_traces} traces, {dp.n_rows} decision points, {cv['folds']}-fold CV grouped by "
        f"{cv['group_by']} ({cv['groups']} groups), {weight} per {dp.cost_unit})",
        file=sys.stderr,
    )
    print(_table(rows), file=sys.stderr)
    lo, hi = guard["difference_interval_90"]
    print(
        f"\nguard: learned - {guard['best_heuristic']} = {guard['difference']:+.4f} per run, "
        f"90% interval [{lo:+.4f}, {hi:+.4f}] over {guard['n_groups']} groups "
        f"(ships a model only when the lower end is >= 0 with >= {guard['min_groups']} groups)",
        file=sys.stderr,
    )
    if learner.importance_:
        print("\ntop features (gain share):", file=sys.stderr)
        imp = [("feature", "share")] + [(n, f"{s:.3f}") for n, s in list(learner.importance_.items())[:10]]
        print(_table(imp), file=sys.stderr)
    for note in learner.notes_:
        print(f"\nNOTE: {note}", file=sys.stderr)
    print(
        f"\nchosen policy: {guard['shipped']} ({guard['shipped_rule']}"
        f"{'' if learner.chosen_ != 'learned' else ' as its base rule'}); in-sample value "
        f"{guard['in_sample_value']:.4f}; wrote {out}",
        file=sys.stderr,
    )
    return 0
