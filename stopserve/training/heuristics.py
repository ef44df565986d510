"""Heuristic stop rules, replayed on logged decision points by truncation, and their tuning.

A rule stops a run at its first decision point where it fires; a run it never
stops gets its logged end (no policy can continue past what was logged). Its
value on a trace is ``q - lam * c`` there. The baselines are the rules a user
could set by hand, each served as a :class:`stopserve.policy.Policy` of kind
``heuristic`` (its safety config and base rule):

* ``never_stop``: no rule at all, proposed stops refused: the run goes on to its end
  (or to a budget net);
* ``loop_detector``: the default rules alone (the loop detector, ``quality_met`` at the
  config's quality target, proposed stops accepted): what a service with no model does;
* ``turn_cap``, ``cost_cap``, ``reward_threshold``: the default rules plus one tuned cap;
* ``combination``: the best combination of every part (caps, reward threshold, loop
  detector on or off, ``quality_met`` on or off, proposals accepted or refused), by
  coordinate ascent from the best single family.

Thresholds are tuned by a mean-minus-standard-error rule (:data:`PESSIMISM` standard
errors of the per-trace gain over the rule without it must be cleared), not the
in-sample maximum, so a cap whose gain rests on a few runs is not taken; families are
ranked by cross-validation repeated over several grouped fold assignments
(:func:`rank_families`). With ``fixed_rules`` (a model meant for systems it has not
seen) the loop detector and ``quality_met`` are always on; with ``transferable`` only
rules that mean the same on any system are tuned (no turn or cost cap, no reward
threshold below the quality target).

>>> tuned = tune_heuristics(dp, lam=0.2)           # doctest: +SKIP
>>> tuned["combination"].policy()                  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from stopserve.errors import TrainingError
from stopserve.manifest import BaseRule, Gates, Manifest
from stopserve.objective import cost_budget
from stopserve.policy import Deviation, Policy, RuleFires, stop_mask
from stopserve.safety import DEFAULT_SAFETY, SafetyConfig
from stopserve.training.labels import BoolArray, DecisionPoints, FloatArray, IntArray

__all__ = [
    "HEURISTICS",
    "PESSIMISM",
    "Floors",
    "HeuristicRule",
    "Replay",
    "RuleFires",
    "TunedHeuristic",
    "canonical_name",
    "cross_fit_heuristics",
    "group_folds",
    "oracle_mask",
    "policy_mask",
    "rank_families",
    "replay",
    "success_kept",
    "sweep",
    "tune_heuristics",
]

#: Names of the tuned baselines, in report order.
HEURISTICS: Final[tuple[str, ...]] = (
    "never_stop",
    "loop_detector",
    "turn_cap",
    "cost_cap",
    "reward_threshold",
    "combination",
)

#: Minimum turns before a rule's reward threshold may fire (``SafetyConfig.min_turns`` default).
DEFAULT_MIN_TURNS: Final = 1
#: A policy that is its rules: no margin, nothing overruled.
NO_DEVIATION: Final = Deviation()

#: Candidate thresholds tried per parameter (quantiles of the observed values).
GRID_SIZE: Final = 64

#: Standard errors of the per-trace gain a tuned parameter must clear (mean − PESSIMISM·SE > 0).
PESSIMISM: Final = 1.0

#: Repetitions of grouped cross-validation that rank the families (fold assignments by seed).
RANK_REPEATS: Final = 3

#: At most this many groups: families are ranked by leave-one-group-out instead.
LOGO_MAX_GROUPS: Final = 12

_EPS: Final = 1e-12


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


def policy_mask(dp: DecisionPoints, fires: RuleFires) -> BoolArray:
    """Where a served policy with these rules (and no model) stops: a net, or any rule.

    :func:`stopserve.policy.stop_mask` with no deviation (``Policy.decide``; tested against it).
    """
    return stop_mask(dp, np.zeros(dp.n_rows), fires, NO_DEVIATION)


@dataclass(frozen=True)
class HeuristicRule:
    """A hand-set rule; ``None`` turns a cap off.

    ``cost_cap`` is in the decision points' cost unit; a cap fires at the first decision
    point where the value reaches it (``>=``), as the nets do. ``loop`` and ``quality``
    switch the safety config's loop detector and ``quality_met`` on or off; ``proposals``
    says whether the orchestrator's proposed stops are taken.
    """

    turn_cap: int | None = None
    cost_cap: float | None = None
    reward_threshold: float | None = None
    loop: bool = True
    quality: bool = True
    proposals: bool = True
    min_turns: int = DEFAULT_MIN_TURNS

    def fires(self, dp: DecisionPoints) -> RuleFires:
        """Where each part of this rule fires on ``dp`` (see :class:`RuleFires`)."""
        cap = np.zeros(dp.n_rows, dtype=bool)
        if self.turn_cap is not None:
            cap |= dp.turn >= self.turn_cap
        if self.cost_cap is not None:
            cap |= dp.c_raw >= self.cost_cap
        if self.reward_threshold is not None:
            with np.errstate(invalid="ignore"):
                met = dp.latest_reward >= self.reward_threshold  # nan (no reward yet) -> False
            cap |= met & (dp.turn >= self.min_turns)
        off = np.zeros(dp.n_rows, dtype=bool)
        return RuleFires(
            loop=dp.loop if self.loop else off,
            quality=dp.quality if self.quality else off,
            rule=cap & dp.allowed,
            proposed=dp.proposed & dp.allowed if self.proposals else off,
        )

    def stop_mask(self, dp: DecisionPoints) -> BoolArray:
        """Per-row flags: where this rule, served as a policy, stops (nets included)."""
        return policy_mask(dp, self.fires(dp))

    @property
    def is_never_stop(self) -> bool:
        """No part of the rule can stop a run."""
        return (
            self.turn_cap is None
            and self.cost_cap is None
            and self.reward_threshold is None
            and not self.loop
            and not self.quality
            and not self.proposals
        )

    def base_config(self, cost_unit: str) -> SafetyConfig:
        """The base rule as a :class:`stopserve.safety.SafetyConfig`: its caps and threshold only.

        The reward threshold reads the run's primary channel, as the tuning did; the
        config's ``min_turns`` is the reward threshold's gate.
        """
        data: dict[str, Any] = {
            "max_turns": self.turn_cap,
            "max_seconds": None,
            "max_tokens": None,
            "max_usd": None,
            "quality_met": self.reward_threshold,
            "quality_channel": None,
            "min_turns": self.min_turns,
            "loop": None,
        }
        if self.cost_cap is not None:
            key, cap = cost_budget(cost_unit, self.cost_cap)
            data[key] = cap
        return SafetyConfig.model_validate(data)

    def own_config(self, nets: SafetyConfig) -> SafetyConfig:
        """The safety config this rule serves with: ``nets`` with its loop and quality_met switched."""
        changes: dict[str, Any] = {}
        if not self.loop:
            changes["loop"] = {**nets.loop.model_dump(), "enabled": False}
        if not self.quality:
            changes["quality_met"] = None
        return nets.replace(**changes) if changes else nets

    def describe(self, cost_unit: str) -> str:
        """Short human form, e.g. ``turn cap 12 | loop detector | quality_met``."""
        parts: list[str] = []
        if self.turn_cap is not None:
            parts.append(f"turn cap {self.turn_cap}")
        if self.cost_cap is not None:
            parts.append(f"cost cap {self.cost_cap:.4g} {cost_unit}")
        if self.reward_threshold is not None:
            parts.append(f"reward >= {self.reward_threshold:.4g}")
        if self.loop:
            parts.append("loop detector")
        if self.quality:
            parts.append("quality_met")
        if self.proposals:
            parts.append("proposed stops")
        return " | ".join(parts) or "never stop (run to the logged end)"


#: Each family's starting rule and the parameter it tunes (``None``: nothing tuned).
_FAMILIES: Final[dict[str, tuple[HeuristicRule, str | None]]] = {
    "never_stop": (HeuristicRule(loop=False, quality=False, proposals=False), None),
    "loop_detector": (HeuristicRule(), None),
    "turn_cap": (HeuristicRule(), "turn_cap"),
    "cost_cap": (HeuristicRule(), "cost_cap"),
    "reward_threshold": (HeuristicRule(), "reward_threshold"),
}
#: Parameters coordinate ascent may move in ``combination``.
_PARAMS: Final[tuple[str, ...]] = ("turn_cap", "cost_cap", "reward_threshold", "loop", "quality", "proposals")
#: Parameters that mean the same on any system (``transferable``): a cap tuned on one system's
#: runs would cut another's, and a reward threshold below the target is a hidden quality target.
_TRANSFERABLE: Final = frozenset({"loop", "quality", "proposals"})
#: Parameters ``fixed_rules`` keeps as they are (the loop detector and quality_met always on).
_RULE_SWITCHES: Final = frozenset({"loop", "quality"})


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
        """The tuned caps that are on, and the rule switches."""
        rule = self.rule
        on: dict[str, Any] = {
            k: getattr(rule, k)
            for k in ("turn_cap", "cost_cap", "reward_threshold")
            if getattr(rule, k) is not None
        }
        if rule.reward_threshold is not None:
            on["min_turns"] = rule.min_turns
        on.update(
            loop=rule.loop, quality_met=rule.quality, proposals="accept" if rule.proposals else "refuse"
        )
        return on

    @property
    def display_name(self) -> str:
        """The family name, or the simpler family's its tuned rule is (:func:`canonical_name`)."""
        return canonical_name(self.rule) or self.name

    def stop_mask(self, dp: DecisionPoints) -> BoolArray:
        """Where the tuned rule, served as a policy, stops on (other) decision points."""
        self._check_unit(dp)
        return self.rule.stop_mask(dp)

    def fires(self, dp: DecisionPoints) -> RuleFires:
        """Where each part of the tuned rule fires on (other) decision points."""
        self._check_unit(dp)
        return self.rule.fires(dp)

    def _check_unit(self, dp: DecisionPoints) -> None:
        if dp.cost_unit != self.cost_unit and self.rule.cost_cap is not None:
            raise TrainingError(
                f"heuristic tuned with cost unit {self.cost_unit!r} applied to {dp.cost_unit!r} costs"
            )

    def to_safety_config(self) -> SafetyConfig:
        """The base rule (caps and threshold) as a :class:`stopserve.safety.SafetyConfig`."""
        return self.rule.base_config(self.cost_unit)

    def manifest(self, nets: SafetyConfig | None = None) -> Manifest:
        """The manifest of a heuristic policy serving this rule (``kind: heuristic``).

        ``nets`` is the safety config the rule was tuned with (default
        :data:`stopserve.safety.DEFAULT_SAFETY`); the policy's own config is that config
        with the rule's loop detector and ``quality_met`` switches.
        """
        own = self.rule.own_config(DEFAULT_SAFETY if nets is None else nets)
        base = self.to_safety_config()
        return Manifest(
            kind="heuristic",
            method="heuristic",
            cost_unit=self.cost_unit,
            gates=Gates(veto_min_turns=own.min_turns, reward_rule_min_turns=base.min_turns),
            safety=own,
            base_rule=BaseRule(name=self.display_name, text=self.rule.describe(self.cost_unit), config=base),
            proposals="accept" if self.rule.proposals else "refuse",
            overrules=(),
            heuristic=self.to_dict(),
        )

    def policy(self, nets: SafetyConfig | None = None) -> Policy:
        """This rule as a served :class:`stopserve.policy.Policy` (for replays through ``decide``)."""
        return Policy.from_manifest(self.manifest(nets), source=f"heuristic {self.name}")

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
    """Values tried for one parameter (other than the rule's own)."""
    if param == "turn_cap":
        return [None, *(int(v) for v in _grid(dp.turn.astype(np.float64)) if v >= 1)]
    if param == "cost_cap":
        return [None, *(v for v in _grid(dp.c_raw) if v > 0)]
    if param == "reward_threshold":
        return [None, *_grid(dp.latest_reward)]
    if param in ("loop", "quality", "proposals"):
        return [False, True]
    raise ValueError(param)


def oracle_mask(dp: DecisionPoints, lam: float) -> BoolArray:
    """Hindsight: each trace's earliest decision point worth its best ``q − λ·c`` (the logged end
    included: a trace whose end is worth most is never stopped)."""
    r = dp.r_stop(lam)
    best_row = np.maximum.reduceat(r, dp.offsets[:-1])
    best = np.maximum(best_row, dp.trace_q_final - lam * dp.trace_c_final)
    return np.asarray(r >= best[dp.trace_idx] - 1e-12, dtype=bool)


def _mean_se(gain: FloatArray) -> tuple[float, float]:
    """Mean and standard error of per-trace gains."""
    n = gain.size
    if n == 0:
        return 0.0, 0.0
    return float(gain.mean()), float(gain.std()) / math.sqrt(n)


def _conservative(param: str, value: Any) -> tuple[int, float]:
    """Sort key of a parameter's settings, the most conservative (the one that stops least) first."""
    if value is None:
        return (0, 0.0)  # off: stops nothing
    if param in ("turn_cap", "cost_cap", "reward_threshold"):
        return (1, -float(value))  # a higher cap or threshold stops later
    return (1, 0.0)


def _best(dp: DecisionPoints, rule: HeuristicRule, param: str, lam: float) -> tuple[HeuristicRule, float]:
    """The setting of ``param`` to take on top of ``rule``, and the value it gives.

    A mean-minus-standard-error rule, not the in-sample maximum: a setting is taken only
    where its per-trace gain over ``rule`` clears :data:`PESSIMISM` standard errors, and of
    the settings whose mean gain is within one standard error of the best, the most
    conservative one (the highest cap or threshold) is taken, so a cap is not set at the
    knife edge of the longest run that paid. No setting clearing the bound keeps ``rule``.
    """
    ref = replay(dp, rule.stop_mask(dp), lam).value
    current = getattr(rule, param)
    scored: list[tuple[Any, float, float]] = []  # (setting, mean gain, standard error)
    for v in _candidates(dp, param):
        if v == current:
            continue
        gain = replay(dp, replace(rule, **{param: v}).stop_mask(dp), lam).value - ref
        mean, se = _mean_se(gain)
        if mean - PESSIMISM * se > _EPS:
            scored.append((v, mean, se))
    if not scored:
        return rule, float(ref.mean())
    top_mean, top_se = max(((m, e) for _, m, e in scored), key=lambda x: x[0])
    near = [v for v, m, _ in scored if m >= top_mean - top_se - _EPS]
    chosen = min(near, key=lambda v: _conservative(param, v))
    best_rule = replace(rule, **{param: chosen})
    return best_rule, replay(dp, best_rule.stop_mask(dp), lam).mean_value


def _allowed_params(fixed_rules: bool, transferable: bool) -> tuple[str, ...]:
    return tuple(
        p
        for p in _PARAMS
        if (not transferable or p in _TRANSFERABLE) and not (fixed_rules and p in _RULE_SWITCHES)
    )


def tune_heuristics(
    dp: DecisionPoints,
    lam: float,
    *,
    min_turns: int = DEFAULT_MIN_TURNS,
    rounds: int = 3,
    transferable: bool = False,
    fixed_rules: bool = False,
) -> dict[str, TunedHeuristic]:
    """Tune every family on ``dp`` at ``lam`` (keys: :data:`HEURISTICS`).

    Each single family tunes its one cap (a setting is taken only where its per-trace
    gain over the rule without it clears :data:`PESSIMISM` standard errors);
    ``combination`` moves every allowed part by coordinate ascent from the best single
    family, with the same bound at every move (it is never below that family
    in-sample). ``transferable`` tunes only the parts that mean the same on any system;
    ``fixed_rules`` keeps the loop detector and ``quality_met`` on (``never_stop`` then
    only refuses proposals). Every candidate is replayed as it would be served.
    """
    if lam < 0 or not math.isfinite(lam):
        raise TrainingError(f"lambda must be a finite number >= 0, got {lam}")
    allowed = _allowed_params(fixed_rules, transferable)
    out: dict[str, TunedHeuristic] = {}
    for name, (start, param) in _FAMILIES.items():
        rule = replace(start, min_turns=min_turns)
        if fixed_rules:
            rule = replace(rule, loop=True, quality=True)
        if param is not None and param in allowed:
            rule, value = _best(dp, rule, param, lam)
        else:
            value = replay(dp, rule.stop_mask(dp), lam).mean_value
        out[name] = TunedHeuristic(name, rule, value, dp.cost_unit, lam)
    start_h = max(out.values(), key=lambda h: h.value)
    rule, value = start_h.rule, start_h.value
    for _ in range(rounds):
        moved = False
        for param in allowed:
            new_rule, new_value = _best(dp, rule, param, lam)
            if new_rule != rule:
                rule, value, moved = new_rule, new_value, True
        if not moved:
            break
    out["combination"] = TunedHeuristic("combination", rule, value, dp.cost_unit, lam)
    return out


def canonical_name(rule: HeuristicRule) -> str | None:
    """The simplest family whose rule this is, or ``None``: the name a shipped rule goes by.

    Ties in the ranking keep the simpler family, but a family's tuned rule may still be a
    simpler one's (a reward threshold tuned to "off"): it is named for what it is.
    """
    if rule.turn_cap is not None or rule.cost_cap is not None or rule.reward_threshold is not None:
        return None
    if not (rule.loop or rule.quality or rule.proposals):
        return "never_stop"
    if rule.loop:
        return "loop_detector"
    return None


def sweep(dp: DecisionPoints, name: str, lam: float) -> list[tuple[Any, Replay]]:
    """Every candidate setting of one single-cap family with its replay (for Pareto plots)."""
    base, param = _FAMILIES[name]
    if param is None:
        return [(None, replay(dp, base.stop_mask(dp), lam))]
    return [(v, replay(dp, replace(base, **{param: v}).stop_mask(dp), lam)) for v in _candidates(dp, param)]


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
    fixed_rules: bool = False,
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
                dp.subset(all_traces[fold != f]),
                lam,
                min_turns=min_turns,
                transferable=transferable,
                fixed_rules=fixed_rules,
            )
        )
    return fold, tuned


@dataclass(frozen=True)
class FamilyRanking:
    """Families ranked by repeated grouped cross-validation (:func:`rank_families`)."""

    #: family -> mean cross-validated value over traces (each trace's value averaged over repeats)
    values: Mapping[str, float]
    #: family -> each trace's cross-validated value, averaged over the repeats
    per_trace: Mapping[str, FloatArray]
    #: the chosen family: the best mean, ties going to the simpler family (HEURISTICS order)
    best: str
    #: how the folds were drawn: "logo" (leave one group out) or "k-fold x repeats"
    scheme: str
    #: families that kept the floors in every stratum (all of them when no floors were asked)
    eligible: tuple[str, ...] = HEURISTICS
    #: family -> each trace's cross-validated quality handed back, averaged over the repeats
    per_trace_q: Mapping[str, FloatArray] = field(default_factory=dict)


@dataclass(frozen=True)
class Floors:
    """What a tuned policy must keep in every stratum (e.g. every system), against the logged runs.

    ``value``: its mean value may fall at most this far below the logged runs' (behavior);
    ``success``: its mean quality handed back at most this far below theirs. The logged runs'
    figures are those at their own stop (``DecisionPoints.trace_q_behavior``): the logged end,
    or where a run-to-cap log's behavior policy stopped. A model meant for systems it has never
    seen is tuned with both (``docs/training.md``).
    """

    value: float | None = None
    success: float | None = None
    #: a success loss beyond the floor is kept where the value gained pays for it twice over
    #: (:func:`success_kept`); ``False``: the floor holds whatever is saved (``--strict-floor``)
    paid: bool = True

    @property
    def active(self) -> bool:
        """Whether either floor is set."""
        return self.value is not None or self.success is not None


def success_kept(
    q_gain: npt.ArrayLike,
    v_gain: npt.ArrayLike,
    floor: npt.ArrayLike,
    tol: npt.ArrayLike = 0.0,
    *,
    paid: bool = True,
) -> BoolArray:
    """Whether a policy keeps the success floor, from its gains over the logged runs (sums or means).

    It keeps it if it loses at most ``floor`` of success (``-q_gain <= floor``), or if what
    it saves pays for what it loses twice over: the value gained is at least the success lost
    (``v_gain >= -q_gain``; put otherwise, it still beats the logged runs were cost worth half
    of what the objective says). Trading a point of success for a few cents of cost (what no
    user would take: issue 34's SWE runs) is refused; stopping far earlier where the objective
    says cost is dear (a lambda at which even the optimum gives success up) is not.
    ``paid=False`` (a strict floor, :attr:`Floors.paid`): the floor holds whatever is saved.
    """
    q, v = np.asarray(q_gain, dtype=np.float64), np.asarray(v_gain, dtype=np.float64)
    f, e = np.asarray(floor, dtype=np.float64), np.asarray(tol, dtype=np.float64)
    within = -q <= f + e
    return np.asarray(within | (v + q >= -e) if paid else within, dtype=bool)


def rank_families(
    dp: DecisionPoints,
    lam: float,
    *,
    folds: int = 5,
    repeats: int = RANK_REPEATS,
    seed: int = 0,
    min_turns: int = DEFAULT_MIN_TURNS,
    transferable: bool = False,
    fixed_rules: bool = False,
    strata: npt.NDArray[np.str_] | None = None,
    floors: Floors | None = None,
) -> FamilyRanking:
    """Rank the families by cross-validation repeated over ``repeats`` grouped fold assignments.

    Every trace is scored by each family tuned without its group, once per repeat; its
    values are averaged over the repeats, and a family's figure is the mean over traces.
    With at most :data:`LOGO_MAX_GROUPS` groups the folds leave one group out (one repeat:
    there is nothing to reshuffle). One noisy split no longer picks the family. With
    ``strata`` (per trace) and ``floors`` ``(value, success)``, only families whose
    cross-validated mean value and success stay within those of the logged runs in every
    stratum may be chosen (where none does, the one that falls short least).
    """
    n_groups = int(np.unique(dp.group).size)
    if n_groups < 2:
        raise TrainingError(f"only {n_groups} group in the traces: families cannot be cross-validated")
    assignments: list[IntArray]
    if n_groups <= LOGO_MAX_GROUPS:
        _, gid = np.unique(dp.group, return_inverse=True)
        assignments = [np.asarray(gid, dtype=np.int64)]
        scheme = "leave one group out"
    else:
        assignments = [group_folds(dp.group, folds, seed + r) for r in range(repeats)]
        scheme = f"{min(folds, n_groups)}-fold x {repeats}"
    sums = {h: np.zeros(dp.n_traces) for h in HEURISTICS}
    q_sums = {h: np.zeros(dp.n_traces) for h in HEURISTICS}
    traces = np.arange(dp.n_traces)
    for fold in assignments:
        _, per_fold = cross_fit_heuristics(
            dp, lam, min_turns=min_turns, transferable=transferable, fixed_rules=fixed_rules, fold=fold
        )
        for f, tuned in enumerate(per_fold):
            mine = traces[fold == f]
            sub = dp.subset(mine)
            for h in HEURISTICS:
                rep = replay(sub, tuned[h].stop_mask(sub), lam)
                sums[h][mine] += rep.value
                q_sums[h][mine] += rep.q
    per_trace = {h: s / len(assignments) for h, s in sums.items()}
    values = {h: float(v.mean()) for h, v in per_trace.items()}
    shortfall = dict.fromkeys(HEURISTICS, 0.0)
    if strata is not None and floors is not None:
        behavior = {"value": dp.trace_q_behavior - lam * dp.trace_c_behavior, "success": dp.trace_q_behavior}
        value_floor, success_floor = floors.value, floors.success
        for h in HEURISTICS:
            got = {"value": per_trace[h], "success": q_sums[h] / len(assignments)}
            for name in np.unique(strata):
                m = strata == name
                loss = {what: float(behavior[what][m].mean() - got[what][m].mean()) for what in behavior}
                if value_floor is not None:
                    shortfall[h] = max(shortfall[h], loss["value"] - value_floor)
                if success_floor is not None and not success_kept(
                    -loss["success"], -loss["value"], success_floor, paid=floors.paid
                ):
                    # short by the lesser of: the loss past the floor, the value still to pay for it
                    short = loss["success"] - success_floor
                    if floors.paid:
                        short = min(short, loss["success"] - (-loss["value"]))
                    shortfall[h] = max(shortfall[h], short)
    eligible = tuple(h for h in HEURISTICS if shortfall[h] <= 1e-9)
    pool = eligible or (min(HEURISTICS, key=lambda h: shortfall[h]),)
    best = pool[0]
    for h in pool:  # strictly better than every simpler family, beyond rounding
        if values[h] > values[best] + 1e-9:
            best = h
    return FamilyRanking(
        values=values,
        per_trace=per_trace,
        best=best,
        scheme=scheme,
        eligible=eligible,
        per_trace_q={h: s / len(assignments) for h, s in q_sums.items()},
    )
