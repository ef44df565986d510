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

What cost is worth: an :class:`~stopserve.objective.Objective`, λ (per cost unit) or a
cost share s ("a whole behavior run costs s of what a success is worth", resolved to
λ = s / the mean logged cost, recorded in the manifest; the default is
:data:`~stopserve.objective.DEFAULT_OBJECTIVE`, s = 0.3). ``cost_scale="per_run"`` trains a
model meant to serve systems it has never seen: costs are normalised per data set,
the base rule can only be one that means the same on any system (a reward threshold,
the loop detector: no turn or cost cap), and served, λ comes from each run's own
expected total cost (``stopserve.policy``).
"""

from __future__ import annotations

import hashlib
import math
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from stopserve.artifacts import save_model_dir
from stopserve.errors import TrainingError
from stopserve.evidence import DEFAULT_EVIDENCE, Evidence
from stopserve.features import FEATURE_NAMES, scale_free_features
from stopserve.manifest import BaseRule, CostScale, Gates, Manifest, Margins, ModelEntry
from stopserve.objective import DEFAULT_OBJECTIVE, Objective
from stopserve.policy import METHOD_MODELS, Policy, stop_mask
from stopserve.progress import progress_bar
from stopserve.safety import DEFAULT_SAFETY, SafetyConfig
from stopserve.trace import Trace
from stopserve.training.backend import EARLY_STOPPING, Backend, LocalBackend, TraceSource, Trainer
from stopserve.training.heuristics import (
    HEURISTICS,
    LOGO_MAX_GROUPS,
    FamilyRanking,
    Replay,
    RuleFires,
    TunedHeuristic,
    cross_fit_heuristics,
    group_folds,
    oracle_mask,
    rank_families,
    replay,
    tune_heuristics,
)
from stopserve.training.labels import DecisionPoints, FloatArray, IntArray
from stopserve.training.parameters import TrainerSettings, check_parameter
from stopserve.training.replay import REPLAY_ENGINE, replay_rows
from stopserve.training.tuning import ALL_RULES, DEFAULT_FLOORS, Floors, Tuned, floor_losses, tune_policy

__all__ = [
    "DEFAULT_PARAMS",
    "MIN_GROUPS",
    "Backend",
    "LocalBackend",
    "PolicyLearner",
    "TraceSource",
    "Trainer",
    "model_version",
    "print_summary",
]

BoolArray = npt.NDArray[np.bool_]

#: The trainer's settings as the table declares them (each default once: ``training/parameters.py``).
_DEFAULTS: Final = TrainerSettings()
_DEFAULT_OBJECTIVE: Final = _DEFAULTS.objective()
_DEFAULT_FEATURES: Final = _DEFAULTS.feature_names()
#: Fewer task groups than this: the guard cannot tell a model from luck; the heuristic ships.
MIN_GROUPS: Final[int] = _DEFAULTS.min_groups
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
#: Inverse-propensity weights are clipped here (variance control).
MAX_IPW: Final = 20.0
#: Passes of fitted backward induction for ``method="optimal"``.
OPTIMAL_PASSES: Final = 3
#: The turn-equivalent cost-to-go target is clipped here (a first turn that cost nothing).
MAX_K_TURNS: Final = 1000.0
METHODS: Final = ("behavior", "optimal")

_TARGET_DOC: Final = {
    "g": "E[q_T - q_t | s_t]: quality still gained by continuing to the run's own end",
    "k": "E[(c_T - c_t) / (c_t / turn) | s_t]: cost still to come, in turn-equivalents of this run",
    "s": "E[q_t | s_t]: quality handed back if the run stops now",
    "c": "E[q_tau - lambda (c_tau - c_t) | s_t] under the fitted later rule (method optimal)",
}


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


def _next_stop_value(
    dp: DecisionPoints, stop: BoolArray, lam: float, beyond: FloatArray | None = None
) -> FloatArray:
    """For each row t: ``q_j − λ·c_j`` at the rule's first stop j > t in the trace, else the logged end.

    ``beyond`` (per row, read at each trace's last row; NaN: none) is what going on past a
    logged end is worth where the log has no more of the run: a run the logging policy cut
    that the rule would not have stopped there. Without it, the logged end.
    """
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
    end = dp.q_final - lam * dp.c_final
    if beyond is not None:
        tail = beyond[dp.offsets[1:] - 1][dp.trace_idx]
        end = np.where(np.isnan(tail), end, tail)
    return np.where(stopped, dp.q[j] - lam * dp.c[j], end)


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

    @property
    def transform(self) -> Literal["sigmoid", "identity"]:
        """How a served policy turns the raw score into the target's scale (``stopserve.policy``)."""
        return "sigmoid" if self.objective == "cross_entropy" else "identity"


def _targets(dp: DecisionPoints, uncensored: BoolArray | None = None) -> dict[str, _Target]:
    """The boosters' targets; ``uncensored`` (rows) limits G to runs that ended on their own.

    G (and C, which learns from G's rows) is the value of going on: a row where the logging
    policy stopped the run (``DecisionPoints.cut``) did not go on, and teaches neither; its "gain of
    0" would teach a retrain that runs like it end there, whatever going on would have given.
    """
    went_on = ~dp.cut
    rows = went_on if uncensored is None else uncensored & went_on
    return {
        "g": _Target("g", dp.q_final - dp.q, "regression", rows=None if rows.all() else rows),
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
    #: rows the fold's margins are tuned on: its held-out inner part, or (``inner_cv``) all its
    #: training rows, each predicted by a model that did not see its group
    tune: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


@dataclass
class _FitState:
    """What one :meth:`PolicyLearner.fit` works on, passed from step to step."""

    dp: DecisionPoints
    nets: SafetyConfig
    per_run: bool
    #: what cost is worth, as asked (a share, or a λ per cost unit of ``dp``)
    objective: Objective
    mean_cost: float
    #: λ per (normalised, with ``per_run``) cost unit: what values are measured at
    lam_value: float
    #: what the replays tell ``decide`` (a λ, resolved from a share with the mean cost; a share per run)
    served: Objective
    methods: tuple[str, ...]
    min_turns: tuple[int, ...]
    used: tuple[str, ...]
    X: FloatArray
    params: dict[str, Any]
    trainer: Trainer
    trace_fold: IntArray
    folds: list[_Fold]
    targets: dict[str, _Target]
    notes: list[str]
    source: TraceSource = field(default_factory=lambda: TraceSource([]))
    oof: dict[str, FloatArray] = field(default_factory=dict)
    inner: dict[str, list[FloatArray]] = field(default_factory=dict)
    fold_heur: list[dict[str, TunedHeuristic]] = field(default_factory=list)
    #: each fold's base family, ranked by repeated cross-validation on the fold's training traces
    fold_family: list[str] = field(default_factory=list)
    heur_all: dict[str, TunedHeuristic] = field(default_factory=dict)
    #: the families ranked by repeated cross-validation on every trace (what ships as the base)
    ranking: FamilyRanking | None = None
    #: the rule kinds a learned model may overrule
    overrules: frozenset[str] = ALL_RULES
    c_target: _Target | None = None
    bar: Any = None
    #: each trace's cross-validated value, per policy (learned, each heuristic, behavior, oracle)
    cv_values: dict[str, FloatArray] = field(default_factory=dict)

    @property
    def k(self) -> int:
        """Number of folds."""
        return len(self.folds)

    @property
    def n_groups(self) -> int:
        """Number of groups the folds keep apart."""
        return int(np.unique(self.dp.group).size)


def _folds(dp: DecisionPoints, trace_fold: IntArray, seed: int, *, inner_cv: bool = False) -> list[_Fold]:
    """Rows of each fold: its training part, its held-out inner part (about 25% of the groups), its test.

    The margins are tuned on the held-out inner part, or with ``inner_cv`` on every row
    but the test's (predicted by nested cross-fitting).
    """
    row_fold = trace_fold[dp.trace_idx]
    rng = np.random.default_rng(seed)
    rows_all = np.arange(dp.n_rows, dtype=np.int64)
    folds: list[_Fold] = []
    for f in range(int(trace_fold.max()) + 1):
        train_traces = np.flatnonzero(trace_fold != f)
        valid_flag = _inner_split(dp.group[train_traces], rng)
        is_valid = np.zeros(dp.n_traces, dtype=bool)
        is_valid[train_traces[valid_flag]] = True
        in_train = (row_fold != f) & ~is_valid[dp.trace_idx]
        in_valid = (row_fold != f) & is_valid[dp.trace_idx]
        tune = rows_all[row_fold != f] if inner_cv else rows_all[in_valid]
        folds.append(_Fold(rows_all[in_train], rows_all[in_valid], rows_all[row_fold == f], tune=tune))
    return folds


class PolicyLearner:
    """Learn a stop policy from traces; see the module docstring.

    >>> learner = PolicyLearner(objective=Objective(cost_share=0.3)).fit(traces)   # doctest: +SKIP
    >>> learner.save("model/")                                 # doctest: +SKIP
    >>> learner.guard_["shipped"]                              # doctest: +SKIP
    'learned model'
    """

    def __init__(
        self,
        *,
        objective: Objective | None = _DEFAULT_OBJECTIVE,
        cost_scale: str = _DEFAULTS.cost_scale.replace("-", "_"),
        method: str = _DEFAULTS.method,
        min_turns: int | None = None if _DEFAULTS.min_turns == "auto" else _DEFAULTS.min_turns,
        features: str | Sequence[str] = _DEFAULT_FEATURES,
        folds: int = _DEFAULTS.folds,
        seed: int = _DEFAULTS.seed,
        params: Mapping[str, Any] | None = None,
        max_rounds: int = MAX_ROUNDS,
        min_groups: int = MIN_GROUPS,
        n_boot: int = N_BOOT,
        nets: SafetyConfig | None = None,
        progress: bool = False,
        log: Callable[[str], None] | None = None,
        backend: Backend | None = None,
        fixed_rules: bool = _DEFAULTS.rules == "fixed",
        stop_on: str = _DEFAULTS.stop_on,
        censored: str = _DEFAULTS.censored,
        floors: Floors | None = DEFAULT_FLOORS,
        overrules: Sequence[str] | None = None,
        evidence: Evidence | None = _DEFAULTS.evidence,
        inner_cv: bool = _DEFAULTS.inner_cv,
    ) -> None:
        self.objective = objective
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
        self.backend = backend
        self.fixed_rules = fixed_rules
        self.stop_on = stop_on
        self.censored = censored
        self.floors = floors
        self.overrules = overrules
        self.evidence = evidence
        self.inner_cv = inner_cv

    @classmethod
    def from_settings(
        cls, settings: TrainerSettings, *, progress: bool = False, backend: Backend | None = None
    ) -> PolicyLearner:
        """The (unfitted) learner ``settings`` describe (``stopserve train``, ``retrain``)."""
        return cls(
            objective=settings.objective(),
            cost_scale=settings.cost_scale.replace("-", "_"),
            method=settings.method,
            min_turns=None if settings.min_turns == "auto" else int(settings.min_turns),
            features=settings.feature_names(),
            folds=settings.folds,
            seed=settings.seed,
            min_groups=settings.min_groups,
            progress=progress,
            backend=backend,
            fixed_rules=settings.rules == "fixed",
            stop_on=settings.stop_on,
            censored=settings.censored,
            evidence=settings.evidence,
            floors=Floors(
                value=settings.max_value_loss or None,
                success=settings.max_success_loss or None,
                paid=not settings.strict_floor,
            ),
            inner_cv=settings.inner_cv,
        )

    # ----------------------------------------------------------------- checks

    def _backend(self) -> Backend:
        return self.backend if self.backend is not None else LocalBackend()

    def _check_params(self) -> None:
        check_parameter("method", self.method)
        if self.cost_scale not in ("fixed", "per_run"):
            raise TrainingError(f"cost_scale must be 'fixed' or 'per_run', got {self.cost_scale!r}")
        if self.objective is not None and not isinstance(self.objective, Objective):
            raise TrainingError(f"objective must be an Objective, got {type(self.objective).__name__}")
        if self.cost_scale == "per_run" and self.objective is not None and not self.objective.is_share:
            raise TrainingError(
                "cost_scale per_run needs a cost share (λ then comes from each run's own cost)"
            )
        if self.folds < 2:
            raise TrainingError(f"folds must be at least 2 for cross-validation, got {self.folds}")
        if self.min_turns is not None and self.min_turns < 0:
            raise TrainingError(f"min_turns must be >= 0, got {self.min_turns}")
        if self.overrules is not None and not set(self.overrules) <= ALL_RULES:
            raise TrainingError(
                f"overrules: expected some of {', '.join(sorted(ALL_RULES))}, got {list(self.overrules)}"
            )
        check_parameter("censored", self.censored)
        check_parameter("stop_on", self.stop_on)

    def _floors(self) -> Floors | None:
        """The floors in force: None when neither is set."""
        return self.floors if self.floors is not None and self.floors.active else None

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
        comparison that chose what ships), ``cv_values_`` (each trace's cross-validated
        value per policy), ``chosen_``, ``importance_``, ``notes_`` and ``timings_``.
        ``cv_replays_`` holds each policy's cross-validated :class:`Replay` (value, quality
        and cost per trace). ``backend`` (default :class:`LocalBackend`) says where the work runs. Raises
        :class:`TrainingError` when the traces cannot train a policy.
        """
        self._check_params()
        if self.objective is not None and self.objective.unit is not None:
            if cost_unit is not None and cost_unit != self.objective.unit:
                raise TrainingError(
                    f"cost unit {cost_unit!r} asked for, but the objective is per {self.objective.unit}"
                )
            cost_unit = self.objective.unit
        t_start = time.perf_counter()
        source = traces if isinstance(traces, TraceSource) else TraceSource(traces)
        st = self._prepare(source, cost_unit, labels_from_rewards, group_by)
        st.source = source
        st.bar = _progress(st.k * (3 + ("optimal" in st.methods) * OPTIMAL_PASSES) + 4, self.progress)
        for name in ("g", "k", "s"):  # S whatever the method: q_stop, and a run's value for credit
            self._cross_fit(st, st.targets[name])
        self._heuristics(st)
        if "optimal" in st.methods:
            self._fit_optimal(st)
        fold_policies, fold_choice = self._fold_policies(st)
        reps = self._cross_validate(st, fold_policies)
        st.cv_values = {name: r.value for name, r in reps.items()}
        policies = {name: _summary(r) for name, r in reps.items()}
        assert st.ranking is not None
        best_heur = st.ranking.best
        guard = self._guard(st, reps, best_heur)
        models, manifest, final_tuned, importance = self._final(st, best_heur, ship=guard["ship"])
        chosen = "learned" if manifest.kind == "model" else best_heur
        final_rule = st.heur_all[best_heur].rule.describe(st.dp.cost_unit)
        if chosen != "learned" and final_rule.startswith("never stop"):
            st.notes.append(
                "THE SHIPPED POLICY NEVER STOPS A RUN ON ITS OWN: no tuned rule beat running to the end, so "
                "only the budget nets end runs"
            )
        # the shipped policy, replayed through decide on the training traces: evaluate gives the same
        shipped = Policy.from_manifest(manifest, models, source="trained policy", engine=REPLAY_ENGINE)
        in_rows = self._backend().replay(source, st.dp, lambda i: [shipped], objective=st.served)[0]
        guard.pop("ship")
        guard.update(
            shipped="learned model" if chosen == "learned" else f"heuristic {best_heur}",
            shipped_rule=final_rule,
            in_sample_value=replay_rows(st.dp, in_rows, st.lam_value).mean_value,
            in_sample_replay={
                "labels_from_rewards": labels_from_rewards,
                "lambda": st.served.lam,
                "cost_share": st.served.cost_share,
            },
        )
        if st.bar is not None:
            st.bar.update(1)
            st.bar.close()
        cv: dict[str, Any] = {
            "folds": st.k,
            "group_by": group_by,
            "groups": st.n_groups,
            "lambda": st.lam_value,
            "cost_share": st.objective.cost_share,
            "policies": policies,
            "best_heuristic": best_heur,
            "family_ranking": {
                "scheme": st.ranking.scheme,
                "values": dict(st.ranking.values),
                "best": st.ranking.best,
            },
            "rules": "fixed" if self.fixed_rules else "tuned",
            "overrules": sorted(st.overrules),
            "by_dataset": {
                str(d): {
                    n: float(reps[n].value[st.dp.dataset == d].mean())
                    for n in ("learned", best_heur, "behavior", "oracle")
                }
                for d in np.unique(st.dp.dataset)
            },
            # each data set's runs as the cross-validated policies decided them (with --group-by
            # dataset: decided by a policy fitted and tuned without that data set)
            "by_dataset_figures": _by_dataset(st.dp, reps, ("learned", best_heur, "behavior", "oracle")),
            "fold_choices": fold_choice,
        }
        if final_tuned is not None:
            cv["final_tuning"] = {"method": final_tuned[0], **_tuned_dict(final_tuned[1])}
        manifest = manifest.updated(
            feature_names=list(FEATURE_NAMES),
            features_used=list(st.used),
            guard=guard,
            training_data=fingerprint(st.dp),
            cv=cv,
            feature_importance={k_: round(v_, 6) for k_, v_ in list(importance.items())[:20]},
            params={**st.params, "max_rounds": self.max_rounds, "early_stopping": EARLY_STOPPING},
            labels_from_rewards=labels_from_rewards,
            group_by=group_by,
            censored=self._censoring(),
            notes=st.notes,
        )
        manifest = manifest.updated(model_version=model_version(manifest))
        self.dp_ = st.dp
        self.manifest_ = manifest
        self.models_ = models
        self.cv_ = cv
        self.cv_values_ = st.cv_values
        self.cv_replays_ = reps
        self.guard_ = guard
        self.chosen_ = chosen
        self.importance_ = importance
        self.notes_ = st.notes
        self.timings_ = {"total_s": time.perf_counter() - t_start, "lightgbm_train_s": st.trainer.seconds}
        return self

    # ----------------------------------------------------------------- the steps of fit

    def _prepare(
        self, source: TraceSource, cost_unit: str | None, labels_from_rewards: bool, group_by: str
    ) -> _FitState:
        """Decision points, the cost weight, features, folds and the trainer."""
        notes: list[str] = []
        nets = self.nets if self.nets is not None else DEFAULT_SAFETY
        per_run = self.cost_scale == "per_run"
        dp = self._backend().decision_points(
            source,
            cost_unit=cost_unit,
            labels_from_rewards=labels_from_rewards,
            group_by=group_by,
            progress=self.progress,
            nets=nets,
            normalize_cost=per_run,
            evidence=self._evidence(),
        )
        if dp.n_traces < 2:
            raise TrainingError(
                f"{dp.n_traces} trace: cross-validation needs at least 2 traces (better: many tasks)"
            )
        mean_cost = float((dp.trace_c_final * dp.cost_scale).mean())
        objective = (self.objective or DEFAULT_OBJECTIVE).in_unit(dp.cost_unit)  # type: ignore[arg-type]
        if per_run:
            # costs are normalised per data set: the share is λ per normalised unit
            assert objective.cost_share is not None
            lam_value, served = float(objective.cost_share), objective
        else:
            lam_value = objective.lam_at(mean_cost)
            served = Objective(lam=lam_value, unit=objective.unit)
            if objective.is_share and mean_cost <= 0:
                notes.append(f"no trace carries any cost in {dp.cost_unit}: the cost share has no effect")
        if np.unique(dp.group).size < 2:
            notes.append(
                f"only one group ({dp.group[0]!r}): grouped cross-validation is impossible; folds split "
                "the traces of that group instead, so the CV value is optimistic for unseen tasks"
            )
            dp = replace(dp, group=dp.trace_id.copy())
        if np.all(dp.trace_q_final == dp.trace_q_final[0]):
            notes.append(
                f"every trace has the same outcome ({dp.trace_q_final[0]:g}): the policy can only trade "
                "cost; the guard still compares it with the heuristics"
            )
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
        trace_fold = group_folds(dp.group, self.folds, self.seed)
        uncensored = None
        if self._censoring() == "unknown":
            n_cens = int(dp.censored.sum())
            if n_cens == dp.n_traces:
                raise TrainingError(
                    f"every one of the {dp.n_traces} traces ended at a cap (censored): with censored runs "
                    "unknown past their cap nothing is left to learn the gain of going on from; "
                    "use --censored horizon if the cap is your system's own"
                )
            uncensored = ~dp.censored[dp.trace_idx]
            if n_cens:
                notes.append(
                    f"{n_cens} of {dp.n_traces} traces ended at a cap (censored): they train the cost still "
                    "to come (as a lower bound) but not the gain of going on, which is unknown past the cap"
                )
        return _FitState(
            dp=dp,
            nets=nets,
            per_run=per_run,
            objective=objective,
            mean_cost=mean_cost,
            lam_value=lam_value,
            served=served,
            methods=METHODS if self.method == "auto" else (self.method,),
            min_turns=(1, 2, 3) if self.min_turns is None else (self.min_turns,),
            used=used,
            X=X,
            params=params,
            trainer=self._backend().trainer(X, weight, params, used),
            trace_fold=trace_fold,
            folds=_folds(dp, trace_fold, self.seed, inner_cv=self.inner_cv),
            targets=_targets(dp, uncensored),
            notes=notes,
            overrules=self._overrules(),
        )

    def _cross_fit(self, st: _FitState, target: _Target) -> None:
        """One target on every fold: out-of-fold and held-out-inner predictions, the fold boosters."""
        st.oof[target.name] = np.zeros(st.dp.n_rows)
        st.inner[target.name] = []
        for f, fold in enumerate(st.folds):
            booster, best = st.trainer.train(target, fold.train, fold.valid, self.max_rounds, self.seed + f)
            fold.boosters[target.name] = booster
            fold.iters[target.name] = best
            st.oof[target.name][fold.test] = booster.predict(st.X[fold.test], raw_score=True)
            if self.inner_cv:
                st.inner[target.name].append(self._inner_oof(st, target, fold, best, f))
            else:
                st.inner[target.name].append(
                    booster.predict(st.X[fold.valid], raw_score=True) if fold.valid.size else np.zeros(0)
                )
            if st.bar is not None:
                st.bar.update(1)

    def _inner_oof(self, st: _FitState, target: _Target, fold: _Fold, rounds: int, f: int) -> FloatArray:
        """Predictions on every training row of ``fold``, each by a model fitted without its group.

        Nested cross-fitting (leave one group out with few groups, else k folds): the fold's
        margins are then tuned on all its training groups, as the final model's are on all.
        """
        dp = st.dp
        rows = fold.tune
        groups = dp.group[dp.trace_idx[rows]]
        uniq = np.unique(groups)
        if uniq.size < 2:
            return np.asarray(fold.boosters[target.name].predict(st.X[rows], raw_score=True))
        inner = np.searchsorted(uniq, groups) if uniq.size <= LOGO_MAX_GROUPS else None
        if inner is None:
            inner = group_folds(groups, self.folds, self.seed + 100 + f)
        out = np.zeros(rows.size)
        for g in np.unique(inner):
            held = inner == g
            booster, _ = st.trainer.train(target, rows[~held], None, max(rounds, 1), self.seed + f)
            out[held] = booster.predict(st.X[rows[held]], raw_score=True)
        return out

    def _template(self, st: _FitState, method: str) -> Policy:
        """A policy without boosters: only its ``values`` (the one definition of V) is used."""
        manifest = Manifest(**self._value_fields(st, method), models=self._transforms(st))
        return Policy(kind="none", safety=st.nets, manifest=manifest)

    @staticmethod
    def _transforms(st: _FitState) -> dict[str, ModelEntry]:
        return {n: ModelEntry(transform=st.targets[n].transform) for n in st.targets}

    def _v(
        self, st: _FitState, method: str, raw: Mapping[str, FloatArray], rows: IntArray | slice
    ) -> FloatArray:
        v, _, _ = self._template(st, method).values(raw, st.dp.turn[rows], st.dp.c_raw[rows], st.served)
        return np.asarray(v, dtype=np.float64)

    def _tune(
        self,
        st: _FitState,
        dp: DecisionPoints,
        raw: Mapping[str, FloatArray],
        rows: IntArray | slice,
        fires: RuleFires,
    ) -> tuple[str, Tuned] | None:
        """The best (method, margins, min_turns) on ``dp`` against the base rule ``fires``."""
        best: tuple[str, Tuned] | None = None
        for method in st.methods:
            v = self._v(st, method, {n: raw[n] for n in METHOD_MODELS[method]}, rows)
            t = tune_policy(
                dp,
                v,
                fires,
                st.lam_value,
                min_turns=st.min_turns,
                strata=_strata(dp, st.per_run or self._floors() is not None),
                overrules=st.overrules,
                stall=self._stall(st, dp),
                floors=self._floors(),
            )
            if best is None or t.score > best[1].score + 1e-12:
                best = (method, t)
        return best

    def _heuristics(self, st: _FitState) -> None:
        """Tune every family per fold and on every trace; rank them by repeated cross-validation.

        Each fold's base family is ranked on that fold's training traces only, and the
        shipped family on every trace: a fold's test traces never choose its base rule.
        """
        opts: dict[str, Any] = {"min_turns": 1, "transferable": st.per_run, "fixed_rules": self.fixed_rules}
        _, st.fold_heur = cross_fit_heuristics(st.dp, st.lam_value, fold=st.trace_fold, **opts)
        st.heur_all = tune_heuristics(st.dp, st.lam_value, **opts)

        def rank(dp: DecisionPoints) -> FamilyRanking:
            floors = self._floors()
            strata = dp.dataset if floors is not None else None
            return rank_families(
                dp, st.lam_value, folds=self.folds, seed=self.seed, strata=strata, floors=floors, **opts
            )

        st.ranking = rank(st.dp)
        traces = np.arange(st.dp.n_traces)
        st.fold_family = []
        for f in range(st.k):
            sub = st.dp.subset(traces[st.trace_fold != f])
            st.fold_family.append(rank(sub).best if np.unique(sub.group).size >= 2 else st.ranking.best)
        if self.log is not None:
            self.log(
                f"heuristic families ({st.ranking.scheme}): best {st.ranking.best}; folds {st.fold_family}"
            )

    def _fold_fires(self, st: _FitState) -> RuleFires:
        """Each row's base-rule fires under its own fold's base rule (tuned without that fold)."""
        dp = st.dp
        row_fold = st.trace_fold[dp.trace_idx]
        parts = [st.fold_heur[f][st.fold_family[f]].fires(dp) for f in range(st.k)]
        pick = {
            name: np.choose(row_fold, [getattr(p, name) for p in parts])
            for name in ("loop", "quality", "rule", "proposed")
        }
        return RuleFires(**pick)

    def _fit_optimal(self, st: _FitState) -> None:
        """C by fitted backward induction: each pass regresses the value realised under the last rule.

        The later rule of a row is its fold's: the fold's base rule (never tuned on that
        fold's traces) with the margins the pass tunes.
        """
        dp = st.dp
        fires = self._fold_fires(st)
        stall = self._stall(st)
        stop_rule = np.zeros(dp.n_rows, dtype=bool)  # pass 0: the later rule is "continue as logged"
        cut = dp.cut
        beyond: FloatArray | None = None
        for p in range(OPTIMAL_PASSES):
            y = _next_stop_value(dp, stop_rule, st.lam_value, beyond) + st.lam_value * dp.c
            st.c_target = _Target("c", y, "regression", rows=st.targets["g"].rows)
            self._cross_fit(st, st.c_target)
            v_opt = self._v(st, "optimal", st.oof, slice(None))
            tuned = tune_policy(
                dp,
                v_opt,
                fires,
                st.lam_value,
                min_turns=st.min_turns,
                strata=_strata(dp, st.per_run or self._floors() is not None),
                overrules=st.overrules,
                stall=stall,
                floors=self._floors(),
            )
            deviation = tuned.deviation(st.overrules, on_evidence=stall is not None)
            stop_rule = stop_mask(dp, v_opt, fires, deviation, stall=stall)
            if cut.any():
                # where the logging policy cut a run and the fitted rule would go on, the log ends
                # before the rule's stop: going on is worth what C, fitted on runs that did go on
                # past such states (explored ones), says (fitted Q iteration), not the logged stop
                c_hat = st.oof["c"] - st.lam_value * dp.c
                beyond = np.where(cut & ~stop_rule, c_hat, np.nan)
            if self.log is not None:
                self.log(f"optimal pass {p + 1}/{OPTIMAL_PASSES}: gain {tuned.gain:.4g}")

    def _stall(self, st: _FitState, dp: DecisionPoints | None = None) -> BoolArray | None:
        """Where a run shows a stall (rows of ``dp``), for a model that stops on evidence only."""
        if self.stop_on != "evidence":
            return None
        return (st.dp if dp is None else dp).stall

    def _fold_policies(self, st: _FitState) -> tuple[list[Policy], list[dict[str, Any]]]:
        """Per fold: its best heuristic as the base rule, margins and method tuned on its held-out rows."""
        policies: list[Policy] = []
        choices: list[dict[str, Any]] = []
        for f, fold in enumerate(st.folds):
            base_name = st.fold_family[f]
            base = st.fold_heur[f][base_name]
            choice = None
            if fold.tune.size:
                sub = st.dp.subset(np.unique(st.dp.trace_idx[fold.tune]))
                choice = self._tune(
                    st, sub, {n: st.inner[n][f] for n in st.inner}, fold.tune, base.fires(sub)
                )
            if choice is None or not choice[1].deviates:
                policies.append(base.policy(st.nets))
                choices.append({"base": base_name, "base_rule": base.parameter, "deviates": False})
                continue
            method, t = choice
            manifest = Manifest(
                kind="model",
                **self._value_fields(st, method),
                **self._rule_fields(st, base, t),
                models=self._transforms(st),
            )
            policies.append(
                Policy(
                    kind="model",
                    safety=base.rule.own_config(st.nets),
                    manifest=manifest,
                    rule=base.to_safety_config(),
                    boosters={n: fold.boosters[n] for n in METHOD_MODELS[method]},
                    engine=REPLAY_ENGINE,
                )
            )
            choices.append(
                {
                    "base": base_name,
                    "base_rule": base.parameter,
                    "deviates": True,
                    "method": method,
                    **_tuned_dict(t),
                }
            )
        if st.bar is not None:
            st.bar.update(1)
        return policies, choices

    def _cross_validate(self, st: _FitState, fold_policies: list[Policy]) -> dict[str, Replay]:
        """Every fold's learned policy and tuned heuristics, replayed through ``decide`` on its fold."""
        if self.log is not None:
            self.log("replaying the cross-validated policies through Policy.decide")
        dp = st.dp
        heur = [[st.fold_heur[f][h].policy(st.nets) for h in HEURISTICS] for f in range(st.k)]
        stops = self._backend().replay(
            st.source,
            dp,
            lambda i: [fold_policies[st.trace_fold[i]], *heur[st.trace_fold[i]]],
            objective=st.served,
        )
        if st.bar is not None:
            st.bar.update(1)
        reps = {"learned": replay_rows(dp, stops[0], st.lam_value)}
        for j, h in enumerate(HEURISTICS, start=1):
            reps[h] = replay_rows(dp, stops[j], st.lam_value)
        reps["behavior"] = replay(dp, np.zeros(dp.n_rows, dtype=bool), st.lam_value)
        reps["oracle"] = replay(dp, oracle_mask(dp, st.lam_value), st.lam_value)
        return reps

    def _guard(self, st: _FitState, reps: Mapping[str, Replay], best_heur: str) -> dict[str, Any]:
        """Learned − best heuristic per run; a bootstrap over groups; whether a model may ship."""
        diff = reps["learned"].value - reps[best_heur].value
        draws = bootstrap_diff(diff, st.dp.group, n_boot=self.n_boot, seed=self.seed)
        lower = float(np.quantile(draws, GUARD_QUANTILE))
        upper = float(np.quantile(draws, 1 - GUARD_QUANTILE))
        mean_diff = float(diff.mean())
        enough = st.n_groups >= self.min_groups
        if not enough:
            st.notes.append(
                f"too little data to trust a learned policy: {st.n_groups} groups, the guard needs at least "
                f"{self.min_groups} (set by min_groups, --min-groups); the tuned heuristic ships"
            )
        within = self._within_floors(st, reps, best_heur)
        return {
            **within,
            "learned_cv_value": reps["learned"].mean_value,
            "best_heuristic": best_heur,
            "best_heuristic_cv_value": reps[best_heur].mean_value,
            "difference": mean_diff,
            "difference_interval_90": [lower, upper],
            "lower_bound_quantile": GUARD_QUANTILE,
            "n_groups": st.n_groups,
            "min_groups": self.min_groups,
            "ship": enough
            and lower >= 0.0
            and mean_diff > 1e-12
            and within.get("learned_within_floors", True),
        }

    def _within_floors(self, st: _FitState, reps: Mapping[str, Replay], best_heur: str) -> dict[str, Any]:
        """Each candidate's cross-validated worst loss against the logged runs; whether it keeps the floors.

        The learned policy ships only within them; the heuristic was ranked within them
        (:func:`~stopserve.training.heuristics.rank_families`), never-stop included, and
        its figures here are what its folds' replays show.
        """
        kept = self._floors()
        if kept is None:
            return {"success_floor": None, "value_floor": None}
        out: dict[str, Any] = {
            "success_floor": kept.success,
            "value_floor": kept.value,
            "success_floor_strict": not kept.paid,
        }
        limits = {"success": kept.success, "value": kept.value}
        assert st.ranking is not None
        ranked = reps[best_heur]
        if best_heur in st.ranking.per_trace_q:  # the figures it was ranked on
            ranked = replace(
                ranked, value=st.ranking.per_trace[best_heur], q=st.ranking.per_trace_q[best_heur]
            )
        for name, label, rep in (("learned", "learned", reps["learned"]), (best_heur, "heuristic", ranked)):
            losses = floor_losses(st.dp, rep, st.lam_value, paid=kept.paid)
            # success: a loss the value gained does not pay for twice over (tuning.success_kept),
            # any loss under a strict floor
            kept_on = {"success": losses["unpaid"], "value": losses["value"]}
            over = [
                f"{what} by {loss:.4f} on {where}"
                for what, (loss, where) in kept_on.items()
                if limits[what] is not None and loss > float(limits[what]) + 1e-9  # type: ignore[arg-type]
            ]
            out[f"{label}_success_loss"] = round(losses["success"][0], 6)
            # beyond the floor, but the value it gains pays for it twice over: kept
            paid = limits["success"] is not None and losses["success"][0] > float(limits["success"]) + 1e-9
            out[f"{label}_success_paid"] = paid and not over
            out[f"{label}_value_loss"] = round(losses["value"][0], 6)
            out[f"{label}_within_floors"] = not over
            if over and name == "learned":
                st.notes.append(
                    "the learned policy loses more than the floors allow in cross-validation ("
                    + "; ".join(over)
                    + f"; floors: success {_fmt_floor(kept.success)}"
                    + (" strict" if not kept.paid else "")
                    + f", value {_fmt_floor(kept.value)}, set by "
                    "floors (--max-success-loss / --max-value-loss / --strict-floor)): it does not ship"
                )
        return out

    def _final(
        self, st: _FitState, best_heur: str, *, ship: bool
    ) -> tuple[dict[str, str], Manifest, tuple[str, Tuned] | None, dict[str, float]]:
        """What ships: final models tuned on the out-of-fold values, or the best heuristic."""
        final_heur = st.heur_all[best_heur]
        final_tuned = None
        if ship:
            final_tuned = self._tune(st, st.dp, st.oof, slice(None), final_heur.fires(st.dp))
            if final_tuned is None or not final_tuned[1].deviates:
                ship = False
                st.notes.append(
                    "tuned on every out-of-fold value, the learned policy never deviates from its base rule: "
                    "the heuristic ships"
                )
        if not ship or final_tuned is None:
            manifest = final_heur.manifest(st.nets).updated(**self._value_fields(st, "heuristic"))
            return {}, manifest, final_tuned, {}
        method, t = final_tuned
        targets = {**st.targets, **({"c": st.c_target} if st.c_target is not None else {})}
        models: dict[str, str] = {}
        entries: dict[str, ModelEntry] = {}
        gain = np.zeros(len(FEATURE_NAMES))
        rows_all = np.arange(st.dp.n_rows, dtype=np.int64)
        for name in sorted({*METHOD_MODELS[method], "g", "s"}):
            rounds = max(1, round(float(np.mean([fo.iters[name] for fo in st.folds])) * 1.1))
            booster, _ = st.trainer.train(targets[name], rows_all, None, rounds, self.seed)
            models[name] = booster.model_to_string()
            entries[name] = ModelEntry(
                target=_TARGET_DOC[name],
                objective=targets[name].objective,
                transform=targets[name].transform,
                rounds=rounds,
            )
            g = booster.feature_importance(importance_type="gain")
            if float(g.sum()) > 0:
                gain += g / float(g.sum())
        if st.bar is not None:
            st.bar.update(1)
        share = gain / gain.sum() if gain.sum() > 0 else gain
        importance = dict(sorted(zip(FEATURE_NAMES, share.tolist(), strict=True), key=lambda kv: -kv[1]))
        manifest = Manifest(
            kind="model",
            **self._value_fields(st, method),
            **self._rule_fields(st, final_heur, t),
            models=entries,
        )
        return models, manifest, final_tuned, importance

    def _overrules(self) -> frozenset[str]:
        """The rule kinds the model may overrule: ``overrules``, else every rule with tuned rules and
        only the base rule and proposed stops with fixed ones."""
        if self.overrules is not None:
            return frozenset(self.overrules)
        return frozenset({"rule", "proposed"}) if self.fixed_rules else ALL_RULES

    def _censoring(self) -> str:
        """How runs that ended at a cap are read: ``horizon`` (the cap is the system's own end) or
        ``unknown`` (what going on would have gained is unknown: the default for a model meant for
        systems it has not seen, ``cost_scale="per_run"``)."""
        if self.censored != "auto":
            return self.censored
        return "unknown" if self.cost_scale == "per_run" else "horizon"

    def _rule_fields(self, st: _FitState, base: TunedHeuristic, tuned: Tuned) -> dict[str, Any]:
        return _rule_fields(base, tuned, st.nets, st.overrules, self.stop_on, self._evidence())

    def _evidence(self) -> Evidence:
        return DEFAULT_EVIDENCE if self.evidence is None else self.evidence

    def _value_fields(self, st: _FitState, method: str) -> dict[str, Any]:
        """How the policy weighs cost: its method, objective and cost scale (``Manifest`` fields).

        The objective is what the model was fitted for and serves by default: the share asked
        (resolved with the mean cost, or per run), or the λ asked.
        """
        scale = (
            CostScale(kind="per_run")
            if self.cost_scale == "per_run"
            else CostScale(kind="fixed", mean_behavior_cost=st.mean_cost)
        )
        return {
            "method": method,
            "cost_unit": st.dp.cost_unit,
            "objective": st.objective,
            "cost_scale": scale,
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


def _rule_fields(  # noqa: PLR0917
    base: TunedHeuristic,
    tuned: Tuned,
    nets: SafetyConfig,
    overrules: frozenset[str],
    stop_on: str,
    evidence: Evidence = DEFAULT_EVIDENCE,
) -> dict[str, Any]:
    """The ``Manifest`` fields of a learned policy's rules: its config, base rule, gates, margins,
    what it overrules."""
    own = base.rule.own_config(nets)
    config = base.to_safety_config()
    return {
        "safety": own,
        "base_rule": BaseRule(name=base.display_name, text=base.rule.describe(base.cost_unit), config=config),
        "gates": Gates(
            veto_min_turns=own.min_turns,
            model_min_turns=tuned.min_turns,
            reward_rule_min_turns=config.min_turns,
        ),
        "proposals": "accept" if base.rule.proposals else "refuse",
        "overrules": tuple(sorted(overrules)),
        "stop_on": stop_on,
        "evidence": evidence if stop_on == "evidence" else None,
        "margins": Margins(
            stop=tuned.margin_stop if math.isfinite(tuned.margin_stop) else None,
            continue_=tuned.margin_continue if math.isfinite(tuned.margin_continue) else None,
        ),
    }


def _tuned_dict(t: Tuned) -> dict[str, Any]:
    return {
        "margin_stop": t.margin_stop if math.isfinite(t.margin_stop) else None,
        "margin_continue": t.margin_continue if math.isfinite(t.margin_continue) else None,
        "min_turns": t.min_turns,
        "score": t.score,
        "gain": t.gain,
    }


def _by_dataset(dp: DecisionPoints, reps: Mapping[str, Replay], names: Sequence[str]) -> dict[str, Any]:
    """Per data set: runs, runs that ended at a cap, and each policy's value, success and cost."""
    out: dict[str, Any] = {}
    for d in np.unique(dp.dataset):
        mine = dp.dataset == d
        entry: dict[str, Any] = {"runs": int(mine.sum()), "censored": int(dp.censored[mine].sum())}
        for n in dict.fromkeys(names):
            r = reps[n]
            entry[n] = {
                "value": float(r.value[mine].mean()),
                "success": float(r.q[mine].mean()),
                "cost": float(r.c[mine].mean()),
                "cost_failed": float(r.c[mine & (dp.trace_q_final < 0.5)].sum()),
            }
        out[str(d)] = entry
    return out


def _fmt_floor(x: float | None) -> str:
    return "off" if x is None else f"{x:g}"


def _summary(r: Any) -> dict[str, float]:
    return {"value": r.mean_value, "success": float(r.q.mean()), "cost": float(r.c.mean())}


def model_version(manifest: Manifest) -> str:
    """A model directory's version: its kind and method, when it was made, its training data's digest."""
    digest = str((manifest.training_data or {}).get("sha256", ""))[:8]
    kind, method = manifest.kind, manifest.method
    name = kind if method in (None, kind) else f"{kind}-{method}"  # a heuristic is named once
    return f"{name}-{time.strftime('%Y%m%d%H%M%S')}-{digest}"


def _progress(total: int, enabled: bool) -> Any:
    # a step: one fold's boosters, a tuning or a replay, then the final fit
    return progress_bar(
        total, desc="train (fold fits, tunings, replays, final fit)", unit=" steps", enabled=enabled
    )


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


def _within_words(guard: Mapping[str, Any], who: str) -> str:
    """How a policy stands against the floors, in the summary's words."""
    if not guard.get(f"{who}_within_floors"):
        return "outside: refused"
    paid = guard.get(f"{who}_success_paid")
    return "within: the value it gains pays for it twice over" if paid else "within"


def print_summary(learner: PolicyLearner, out: Path) -> None:
    """What ``stopserve train`` prints on stderr: the CV table, the guard, features, notes, the choice."""
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
    if guard.get("success_floor") is not None or guard.get("value_floor") is not None:
        print(
            f"floors (--max-success-loss, --max-value-loss): success {_fmt_floor(guard['success_floor'])}"
            f"{' strict' if guard.get('success_floor_strict') else ''}, "
            f"value {_fmt_floor(guard['value_floor'])}; cross-validated worst loss per data set: learned "
            f"success {guard['learned_success_loss']:+.4f} "
            f"({_within_words(guard, 'learned')}), "
            f"{guard['best_heuristic']} success {guard['heuristic_success_loss']:+.4f}",
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
