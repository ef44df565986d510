"""Heuristic stop rules, replayed on logged decision points by truncation, and their tuning.

A rule stops a run at its first decision point where it fires; a run it never
stops gets its logged end (no policy can continue past what was logged). Its
value on a trace is ``q - lam * c`` there. The baselines are the nets a user
could set by hand: a turn cap, a cost cap, a reward threshold (``quality_met``),
the loop detector, and the best combination of them. Each tuned rule converts
to a :class:`stopserve.safety.SafetyConfig`, so it can ship as a policy.

>>> tuned = tune_heuristics(dp, lam=0.2)           # doctest: +SKIP
>>> tuned["combination"].to_safety_config()               # doctest: +SKIP
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from stopserve.errors import TrainingError
from stopserve.training.labels import BoolArray, DecisionPoints, FloatArray, IntArray

__all__ = [
    "HEURISTICS",
    "HeuristicRule",
    "Replay",
    "TunedHeuristic",
    "cross_fit_heuristics",
    "group_folds",
    "oracle_mask",
    "policy_mask",
    "replay",
    "sweep",
    "tune_heuristics",
]

#: Names of the tuned baselines, in report order.
HEURISTICS: Final[tuple[str, ...]] = (
    "turn_cap",
    "cost_cap",
    "reward_threshold",
    "loop_detector",
    "combination",
)

#: Minimum turns before a rule's reward threshold may fire (``SafetyConfig.min_turns`` default).
DEFAULT_MIN_TURNS: Final = 1

#: Candidate thresholds tried per parameter (quantiles of the observed values).
GRID_SIZE: Final = 64


@dataclass(frozen=True)
class Replay:
    """Per-trace outcome of replaying a stop rule: where it stopped and what that was worth."""

    value: FloatArray
    q: FloatArray
    c: FloatArray
    stop_row: IntArray  # row index of the stop, -1 when the run got its logged end
    stopped: BoolArray

    @property
    def mean_value(self) -> float:
        """Mean value over traces."""
        return float(self.value.mean())


def replay(dp: DecisionPoints, stop: npt.NDArray[np.bool_], lam: float) -> Replay:
    """Replay per-row stop flags: the first stop of each trace wins; no stop -> the logged end."""
    stop = np.asarray(stop, dtype=bool)
    if stop.shape != (dp.n_rows,):
        raise TrainingError(f"stop flags have shape {stop.shape}, expected ({dp.n_rows},): one per row")
    n = dp.n_rows
    candidates = np.where(stop, np.arange(n, dtype=np.int64), n)
    first = np.minimum.reduceat(candidates, dp.offsets[:-1])
    stopped = first < dp.offsets[1:]
    rows = np.where(stopped, first, 0)
    q = np.where(stopped, dp.q[rows], dp.trace_q_final)
    c = np.where(stopped, dp.c[rows], dp.trace_c_final)
    return Replay(
        value=q - lam * c,
        q=q,
        c=c,
        stop_row=np.where(stopped, first, -1).astype(np.int64),
        stopped=stopped,
    )


@dataclass(frozen=True)
class HeuristicRule:
    """A combination of hand-set nets; ``None`` turns a net off.

    ``cost_cap`` is in the decision points' cost unit; a cap fires at the first
    decision point where the value reaches it (``>=``), as the safety nets do.
    """

    turn_cap: int | None = None
    cost_cap: float | None = None
    reward_threshold: float | None = None
    loop: bool = False
    min_turns: int = DEFAULT_MIN_TURNS

    def stop_mask(self, dp: DecisionPoints) -> BoolArray:
        """Per-row flags: where this rule fires (see :func:`policy_mask` for the served policy)."""
        stop = np.zeros(dp.n_rows, dtype=bool)
        if self.turn_cap is not None:
            stop |= dp.turn >= self.turn_cap
        if self.cost_cap is not None:
            stop |= dp.c_raw >= self.cost_cap
        if self.reward_threshold is not None:
            with np.errstate(invalid="ignore"):
                met = dp.latest_reward >= self.reward_threshold  # nan (no reward yet) -> False
            stop |= met & (dp.turn >= self.min_turns)
        if self.loop:
            stop |= dp.loop
        return stop

    def to_safety_config(self, cost_unit: str) -> Any:
        """This rule as a :class:`stopserve.safety.SafetyConfig` (every other net off).

        The reward threshold reads the run's primary channel, as the tuning did.
        """
        from stopserve.safety import SafetyConfig

        data: dict[str, Any] = {
            "max_turns": self.turn_cap,
            "max_seconds": None,
            "max_tokens": None,
            "max_usd": None,
            "quality_met": self.reward_threshold,
            "quality_channel": None,
            "min_turns": self.min_turns,
        }
        if self.cost_cap is not None:
            if cost_unit == "usd":
                data["max_usd"] = self.cost_cap
            elif cost_unit == "ktokens":
                data["max_tokens"] = math.ceil(self.cost_cap * 1000.0 - 1e-9)
            elif cost_unit == "seconds":
                data["max_seconds"] = self.cost_cap
            else:
                raise TrainingError(f"cost unit {cost_unit!r} has no safety-net budget")
        if not self.loop:
            data["loop"] = None
        return SafetyConfig.model_validate(data)

    def describe(self, cost_unit: str) -> str:
        """Short human form, e.g. ``turn cap 12 | cost cap 0.5 usd``."""
        parts: list[str] = []
        if self.turn_cap is not None:
            parts.append(f"turn cap {self.turn_cap}")
        if self.cost_cap is not None:
            parts.append(f"cost cap {self.cost_cap:.4g} {cost_unit}")
        if self.reward_threshold is not None:
            parts.append(f"reward >= {self.reward_threshold:.4g}")
        if self.loop:
            parts.append("loop detector")
        return " | ".join(parts) or "never stop (run to the logged end)"


@dataclass(frozen=True)
class TunedHeuristic:
    """A heuristic tuned on some traces: its rule, its mean value there and its parameter."""

    name: str
    rule: HeuristicRule
    value: float
    cost_unit: str
    lam: float

    @property
    def parameter(self) -> dict[str, Any]:
        """The tuned parameter(s) that are on (``min_turns`` only with a reward threshold)."""
        on = {k: v for k, v in asdict(self.rule).items() if v is not None and v is not False}
        if self.rule.reward_threshold is None:
            on.pop("min_turns", None)
        return on

    def stop_mask(self, dp: DecisionPoints) -> BoolArray:
        """Where the tuned rule stops on (other) decision points."""
        if dp.cost_unit != self.cost_unit and self.rule.cost_cap is not None:
            raise TrainingError(
                f"heuristic tuned with cost unit {self.cost_unit!r} applied to {dp.cost_unit!r} costs"
            )
        return self.rule.stop_mask(dp)

    def to_safety_config(self) -> Any:
        """The tuned rule as a :class:`stopserve.safety.SafetyConfig`, ready to ship as a policy."""
        return self.rule.to_safety_config(self.cost_unit)

    def manifest(self) -> dict[str, Any]:
        """The manifest of a heuristic policy serving this rule (``kind: heuristic``)."""
        return {
            "kind": "heuristic",
            "method": "heuristic",
            "cost_unit": self.cost_unit,
            "rule": self.to_safety_config().to_dict(),
            "rule_name": self.name,
            "rule_text": self.rule.describe(self.cost_unit),
            "heuristic": self.to_dict(),
        }

    def policy(self) -> Any:
        """This rule as a served :class:`stopserve.policy.Policy` (for replays through ``decide``)."""
        from stopserve.policy import Policy

        return Policy.from_manifest(self.manifest(), source=f"heuristic {self.name}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {
            "name": self.name,
            "parameter": self.parameter,
            "value": self.value,
            "cost_unit": self.cost_unit,
            "lambda": self.lam,
            "rule": self.rule.describe(self.cost_unit),
        }


# --------------------------------------------------------------------------- tuning


def _grid(values: FloatArray, size: int = GRID_SIZE) -> list[float]:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return []
    uniq = np.unique(finite)
    if uniq.size <= size:
        return [float(v) for v in uniq]
    return [float(v) for v in np.unique(np.quantile(uniq, np.linspace(0.0, 1.0, size), method="nearest"))]


def _candidates(dp: DecisionPoints, param: str) -> list[Any]:
    """Values tried for one parameter; ``None`` (off) always first, so ties keep the net off."""
    if param == "turn_cap":
        return [None, *(int(v) for v in _grid(dp.turn.astype(np.float64)) if v >= 1)]
    if param == "cost_cap":
        return [None, *(v for v in _grid(dp.c_raw) if v > 0)]
    if param == "reward_threshold":
        return [None, *_grid(dp.latest_reward)]
    if param == "loop":
        return [False, True]
    raise ValueError(param)


def oracle_mask(dp: DecisionPoints, lam: float) -> BoolArray:
    """Hindsight: each trace's earliest decision point worth its best ``q − λ·c`` (the logged end
    included: a trace whose end is worth most is never stopped)."""
    r = dp.r_stop(lam)
    best_row = np.maximum.reduceat(r, dp.offsets[:-1])
    best = np.maximum(best_row, dp.trace_q_final - lam * dp.trace_c_final)
    return np.asarray(r >= best[dp.trace_idx] - 1e-12, dtype=bool)


def policy_mask(dp: DecisionPoints, fires: BoolArray) -> BoolArray:
    """Where a served policy whose base rule fires at ``fires`` (and that has no model) stops.

    The same handicaps as every other policy: the safety nets in force stop the run, and
    after the nets' ``min_turns`` the rule's stops and the orchestrator's proposed stops
    are taken (``Policy.decide``; tested against it).
    """
    return dp.net_stop | (dp.allowed & (fires | dp.proposed))


def _best(dp: DecisionPoints, base: HeuristicRule, param: str, lam: float) -> tuple[HeuristicRule, float]:
    best_rule, best_value = base, -math.inf
    for v in _candidates(dp, param):
        rule = replace(base, **{param: v})
        value = replay(dp, policy_mask(dp, rule.stop_mask(dp)), lam).mean_value
        if value > best_value + 1e-12:
            best_rule, best_value = rule, value
    return best_rule, best_value


_SINGLE: Final[dict[str, str]] = {
    "turn_cap": "turn_cap",
    "cost_cap": "cost_cap",
    "reward_threshold": "reward_threshold",
    "loop_detector": "loop",
}


def tune_heuristics(
    dp: DecisionPoints,
    lam: float,
    *,
    min_turns: int = DEFAULT_MIN_TURNS,
    rounds: int = 3,
    transferable: bool = False,
) -> dict[str, TunedHeuristic]:
    """Tune every baseline to the best mean value on ``dp`` at ``lam``.

    Keys are :data:`HEURISTICS`; ``"combination"`` is the best combination, found by
    coordinate ascent from the best single net (it is never below any single
    one). A net that does not help is left off: e.g. ``reward_threshold`` with
    no reward events is "never stop", worth the behavior value. Every candidate is
    replayed as it would be served (:func:`policy_mask`). ``transferable`` keeps only
    rules that mean the same on any system, the reward threshold (rewards are in [0, 1])
    and the loop detector: a turn or cost cap tuned on one system's runs would cut
    another's, whose runs are ten times longer or dearer.
    """
    if lam < 0 or not math.isfinite(lam):
        raise TrainingError(f"lambda must be a finite number >= 0, got {lam}")
    base = HeuristicRule(min_turns=min_turns)
    params = {k: v for k, v in _SINGLE.items() if not transferable or v in ("reward_threshold", "loop")}
    out: dict[str, TunedHeuristic] = {}
    for name, param in _SINGLE.items():
        if param in params.values():
            rule, value = _best(dp, base, param, lam)
        else:
            rule, value = base, replay(dp, policy_mask(dp, base.stop_mask(dp)), lam).mean_value
        out[name] = TunedHeuristic(name, rule, value, dp.cost_unit, lam)
    start = max(out.values(), key=lambda h: h.value)
    rule, value = start.rule, start.value
    for _ in range(rounds):
        improved = False
        for param in params.values():
            new_rule, new_value = _best(dp, rule, param, lam)
            if new_value > value + 1e-12:
                rule, value, improved = new_rule, new_value, True
        if not improved:
            break
    out["combination"] = TunedHeuristic("combination", rule, value, dp.cost_unit, lam)
    return out


def sweep(dp: DecisionPoints, name: str, lam: float) -> list[tuple[Any, Replay]]:
    """Every candidate setting of one single-net heuristic with its replay (for Pareto plots)."""
    param = _SINGLE[name]
    base = HeuristicRule()
    return [
        (v, replay(dp, policy_mask(dp, replace(base, **{param: v}).stop_mask(dp)), lam))
        for v in _candidates(dp, param)
    ]


def group_folds(groups: npt.NDArray[np.str_], folds: int, seed: int) -> IntArray:
    """Fold number per trace, keeping each group in one fold (groups shuffled by ``seed``)."""
    uniq, inverse = np.unique(groups, return_inverse=True)
    if uniq.size < 2:
        raise TrainingError(
            f"only {uniq.size} group (task or repository) in the traces: cross-fitting needs at least 2; "
            "give more tasks or --tune-on traces"
        )
    k = min(folds, int(uniq.size))
    order = np.random.default_rng(seed).permutation(uniq.size)
    fold_of_group = np.empty(uniq.size, dtype=np.int64)
    fold_of_group[order] = np.arange(uniq.size) % k
    return fold_of_group[inverse].astype(np.int64)


def cross_fit_heuristics(
    dp: DecisionPoints,
    lam: float,
    *,
    folds: int = 5,
    seed: int = 0,
    min_turns: int = DEFAULT_MIN_TURNS,
    transferable: bool = False,
    fold: IntArray | None = None,
) -> tuple[IntArray, list[dict[str, TunedHeuristic]]]:
    """Every baseline tuned once per fold without that fold's groups (grouped k-fold).

    Returns the fold of each trace and, per fold, the tuned heuristics (by name) that
    score that fold's traces: no trace is ever scored by a rule tuned on its own group.
    ``fold`` gives the assignment (default :func:`group_folds`).
    """
    if fold is None:
        fold = group_folds(dp.group, folds, seed)
    all_traces = np.arange(dp.n_traces)
    tuned: list[dict[str, TunedHeuristic]] = []
    for f in range(int(fold.max()) + 1):
        tuned.append(
            tune_heuristics(
                dp.subset(all_traces[fold != f]), lam, min_turns=min_turns, transferable=transferable
            )
        )
    return fold, tuned
