"""Decision points and their labels, read from traces by the live featurizer.

Every trace is folded once, event by event, through
:class:`stopserve.features.RunState` -- the same path the service runs -- and a
row is taken after every event for which :func:`stopserve.trace.is_decision_point`
holds. A trace with no decision point at all gets one row at its last event.

Each row carries the features, the labels of ``shared/spec/trace-format.md``
(``q_t``, ``c_t``) and what the heuristic baselines need (turn, elapsed
seconds, tokens, usd, latest reward, a loop flag at default thresholds).
``R_stop(t) = q_t - lam * c_t``; ``lam`` is in cost units per unit of reward:
with task success worth $5, ``lam = 0.2`` per usd.

>>> dp = build_decision_points(traces)            # doctest: +SKIP
>>> r_stop = dp.r_stop(0.2)                        # doctest: +SKIP
"""

from __future__ import annotations

import csv
import math
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from stopserve.errors import TrainingError
from stopserve.evidence import DEFAULT_EVIDENCE, Evidence, stall
from stopserve.features import FEATURE_NAMES, RunState
from stopserve.objective import COST_UNITS
from stopserve.progress import progress as _progress
from stopserve.safety import SafetyConfig
from stopserve.trace import Event, Trace, is_decision_point, read_traces
from stopserve.training.parameters import GROUP_BY

__all__ = [
    "COST_UNITS",
    "GROUP_BY",
    "DecisionPart",
    "DecisionPoints",
    "assemble_decision_points",
    "build_decision_points",
    "choose_cost_unit",
    "decision_part",
    "feature_columns",
    "fold_events",
    "load_decision_points",
    "write_features_csv",
]


# GROUP_BY (declared with the trainer's settings, where the command line reads it): how traces
# are grouped for cross-validation: by task id, by repository (the task id's prefix before "__",
# SWE-bench style), by producing system (e.g. one model's runs), or by data set (the system up
# to the first "/").

#: Reward channel read as the quality label with ``labels_from_rewards``.
LABEL_CHANNEL: Final = "quality"

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
StrArray = npt.NDArray[np.str_]

#: A rule replayed on every decision point's live state (e.g. a policy's decide call).
StopRule = Callable[[RunState, bool], bool]


@dataclass
class DecisionPoints:
    """One row per decision point of a set of traces (plus per-trace arrays).

    Rows of trace ``i`` are ``offsets[i]:offsets[i + 1]``; every trace has at
    least one row. ``q_final``/``c_final`` are the logged end (all events
    folded); a replayed policy that never stops gets them.
    """

    cost_unit: str
    X: FloatArray
    trace_idx: IntArray
    turn: IntArray
    q: FloatArray
    c: FloatArray
    q_final: FloatArray
    c_final: FloatArray
    propensity: FloatArray
    is_last: BoolArray
    #: the decision logged here said stop (the logging policy stopped the run here, unless events
    #: follow: then the caller went on regardless)
    logged_stop: BoolArray
    #: q here is the run's final outcome filled in at its own stop (no grade, no reward label):
    #: the quality a run hands back because it ends there, not one a stop could take earlier
    q_filled: BoolArray
    elapsed: FloatArray
    tokens: FloatArray
    usd: FloatArray
    latest_reward: FloatArray  # nan before the first reward event
    #: the loop detector of the safety config in force (``nets`` of :func:`build_decision_points`) fires
    loop: BoolArray
    #: its ``quality_met`` fires (only where ``min_turns`` allows a stop)
    quality: BoolArray
    #: the run shows a stall here (:func:`stopserve.evidence.stall`): a model stopping on evidence may stop
    stall: BoolArray
    #: a net (a budget of that config, or the run's own budget) fires here: it always wins
    net_stop: BoolArray
    #: the nets' ``min_turns`` is reached: a rule, model or proposed stop may happen
    allowed: BoolArray
    #: the orchestrator proposed to stop here (a ``stop`` event with ``proposed: true``)
    proposed: BoolArray
    #: the cost so far in the cost unit, never normalised (what the live policy reads)
    c_raw: FloatArray
    # per trace
    offsets: IntArray
    task_id: StrArray
    group: StrArray
    trace_id: StrArray
    trace_q_final: FloatArray
    trace_c_final: FloatArray
    #: what a trace's success and cost floors are kept against: the logged runs' own stop, i.e. the
    #: logged end, or, for a run-to-cap log that says where its behavior policy stopped
    #: (``metrics.behavior_stop_index``), the outcome and cost there (what that policy got)
    trace_q_behavior: FloatArray
    trace_c_behavior: FloatArray
    optimal_value: FloatArray  # nan when the trace carries none
    optimal_lambda: FloatArray
    run_to_cap: BoolArray
    #: the run ended at a cap (its stop is ``budget_exhausted``, it ran to the cap, or it used up its
    #: budget): censored, it did not show what going on would have gained
    censored: BoolArray
    #: the trace's data set (its ``system`` up to the first "/"), e.g. ``mint``
    dataset: StrArray
    #: what each trace's costs were divided by (1 unless costs are normalised per data set)
    cost_scale: FloatArray
    feature_names: tuple[str, ...] = FEATURE_NAMES
    #: stop flags of the ``stop_rules`` given to :func:`build_decision_points`, one column each
    rule_stops: BoolArray = field(default_factory=lambda: np.zeros((0, 0), dtype=bool))

    @property
    def n_rows(self) -> int:
        """Number of decision points."""
        return int(self.q.shape[0])

    @property
    def cut(self) -> BoolArray:
        """Rows where the logging policy stopped the run and it ended there (a service's stop).

        Such a row shows what stopping there hands back, and nothing of going on: what the run
        would have gained past it is not in the log.
        """
        return self.logged_stop & self.is_last

    @property
    def n_traces(self) -> int:
        """Number of traces."""
        return int(self.offsets.shape[0] - 1)

    def r_stop(self, lam: float) -> FloatArray:
        """``R_stop(t) = q_t - lam * c_t`` for every row."""
        return self.q - lam * self.c

    def mean_costs(self) -> dict[str, float]:
        """Mean logged cost of a run per data set, in the cost unit (never normalised)."""
        raw = self.trace_c_final * self.cost_scale
        return {str(d): float(raw[self.dataset == d].mean()) for d in np.unique(self.dataset)}

    def cost_to_go(self) -> FloatArray:
        """``c_final - c_t`` for every row: the cost still spent if the run continues as logged."""
        return self.c_final - self.c

    def subset(self, traces: npt.ArrayLike) -> DecisionPoints:
        """The decision points of the given trace indices (in that order)."""
        idx = np.asarray(traces, dtype=np.int64)
        starts, ends = self.offsets[idx], self.offsets[idx + 1]
        lengths = ends - starts
        rows = (
            np.concatenate([np.arange(s, e) for s, e in zip(starts, ends, strict=True)])
            if idx.size
            else np.zeros(0, dtype=np.int64)
        )
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return DecisionPoints(
            cost_unit=self.cost_unit,
            X=self.X[rows],
            trace_idx=np.repeat(np.arange(idx.size, dtype=np.int64), lengths),
            turn=self.turn[rows],
            q=self.q[rows],
            c=self.c[rows],
            q_final=self.q_final[rows],
            c_final=self.c_final[rows],
            propensity=self.propensity[rows],
            is_last=self.is_last[rows],
            logged_stop=self.logged_stop[rows],
            q_filled=self.q_filled[rows],
            elapsed=self.elapsed[rows],
            tokens=self.tokens[rows],
            usd=self.usd[rows],
            latest_reward=self.latest_reward[rows],
            loop=self.loop[rows],
            quality=self.quality[rows],
            stall=self.stall[rows],
            net_stop=self.net_stop[rows],
            allowed=self.allowed[rows],
            proposed=self.proposed[rows],
            c_raw=self.c_raw[rows],
            offsets=offsets,
            task_id=self.task_id[idx],
            group=self.group[idx],
            trace_id=self.trace_id[idx],
            trace_q_final=self.trace_q_final[idx],
            trace_c_final=self.trace_c_final[idx],
            trace_q_behavior=self.trace_q_behavior[idx],
            trace_c_behavior=self.trace_c_behavior[idx],
            optimal_value=self.optimal_value[idx],
            optimal_lambda=self.optimal_lambda[idx],
            run_to_cap=self.run_to_cap[idx],
            censored=self.censored[idx],
            dataset=self.dataset[idx],
            cost_scale=self.cost_scale[idx],
            feature_names=self.feature_names,
            rule_stops=self.rule_stops[rows] if self.rule_stops.size else self.rule_stops,
        )


# --------------------------------------------------------------------------- building


class _Columns:
    """Row buffers: compact typed arrays (8 bytes a value), the feature matrix grown by doubling."""

    def __init__(self, n_features: int, n_rules: int) -> None:
        self.n = 0
        self._X = np.empty((1024, n_features), dtype=np.float64)
        self.trace_idx = array("q")
        self.turn = array("q")
        self.q = array("d")
        self.c_usd = array("d")
        self.tokens = array("d")
        self.c_sec = array("d")
        self.propensity = array("d")
        self.is_last = array("b")
        self.logged_stop = array("b")
        self.q_filled = array("b")
        self.latest_reward = array("d")
        self.loop = array("b")
        self.quality = array("b")
        self.stall = array("b")
        self.net_stop = array("b")
        self.allowed = array("b")
        self.proposed = array("b")
        self.rule_stops = array("b")
        self.n_rules = n_rules

    def add_features(self, x: FloatArray) -> None:
        if self.n == self._X.shape[0]:
            grown = np.empty((2 * self.n, self._X.shape[1]), dtype=np.float64)
            grown[: self.n] = self._X
            self._X = grown
        self._X[self.n] = x
        self.n += 1

    def matrix(self) -> FloatArray:
        return self._X[: self.n].copy()


def fold_events(trace: Trace, state: RunState) -> Iterator[tuple[Event, bool]]:
    """Fold ``trace`` into ``state`` one event at a time, yielding ``(event, is_row)``.

    ``is_row`` marks a decision point (:func:`stopserve.trace.is_decision_point`), and the
    last event of a trace that has none, so every trace has at least one row. The one
    definition of a row: decision points and policy replays both walk traces with it.
    """
    n = len(trace.events)
    rows = 0
    for k, ev in enumerate(trace.events):
        state.fold(ev)
        row = is_decision_point(ev) or (k == n - 1 and rows == 0)
        rows += row
        yield ev, row


def _behavior_stop(trace: Trace) -> int | None:
    """The event where a run-to-cap log's behavior policy stopped (``metrics.behavior_stop_index``)."""
    m = trace.metrics
    if m.get("run_to_cap") != 1.0 or "behavior_stop_index" not in m:
        return None
    at = m["behavior_stop_index"]
    return int(at) if math.isfinite(at) and 0 <= at < len(trace.events) else None


def _quality_met(nets: SafetyConfig, state: RunState) -> bool:
    """The config's own ``quality_met`` rule (its flat part: composed parts are not tuned)."""
    if nets.quality_met is None:
        return False
    value = state.latest_reward_on(nets.quality_channel)
    return value is not None and value >= nets.quality_met


def _censored(trace: Trace, state: RunState) -> bool:
    """Whether the run ended at a cap rather than on its own (``state``: every event folded)."""
    if trace.stop is not None and trace.stop.reason == "budget_exhausted":
        return True
    if trace.metrics.get("run_to_cap") == 1.0:
        return True
    budget = trace.budget
    if budget is None:
        return False
    used = {
        "max_turns": state.turn,
        "max_seconds": state.elapsed,
        "max_tokens": state.tokens,
        "max_usd": state.usd,
    }
    return any(getattr(budget, k) is not None and v >= getattr(budget, k) for k, v in used.items())


def _team_outcome(trace: Trace) -> float | None:
    team = trace.rewards.get("team")
    if team is None or not math.isfinite(team):
        return None
    return float(team)


@dataclass
class DecisionPart:
    """The decision points of some traces (e.g. one file), before the cost unit is chosen.

    What :func:`decision_part` collects and :func:`assemble_decision_points` joins: rows
    carry every cost unit (usd, tokens, seconds) and traces their final cost in each, so
    parts built apart (one per file, on different machines) assemble into the same
    :class:`DecisionPoints` as one pass over every trace.
    """

    X: FloatArray
    trace_idx: IntArray  # from 0 within the part
    turn: IntArray
    q: FloatArray
    usd: FloatArray
    tokens: FloatArray
    seconds: FloatArray
    propensity: FloatArray
    is_last: BoolArray
    logged_stop: BoolArray
    q_filled: BoolArray
    latest_reward: FloatArray
    loop: BoolArray
    quality: BoolArray
    stall: BoolArray
    net_stop: BoolArray
    allowed: BoolArray
    proposed: BoolArray
    rule_stops: BoolArray
    # per trace
    offsets: IntArray
    task_id: StrArray
    trace_id: StrArray
    q_final: FloatArray
    #: each trace's logged end in usd, thousands of tokens and seconds (``COST_UNITS`` order)
    c_final: FloatArray
    #: the behavior's own stop (``DecisionPoints.trace_q_behavior``): its outcome and costs
    q_behavior: FloatArray
    c_behavior: FloatArray
    optimal_value: FloatArray
    optimal_lambda: FloatArray
    run_to_cap: BoolArray
    censored: BoolArray
    system: StrArray
    #: some event carries usd / every costed event carries usd (what the default cost unit reads)
    any_usd: bool
    every_costed_has_usd: bool

    @property
    def n_traces(self) -> int:
        """Number of traces."""
        return int(self.offsets.shape[0] - 1)

    @property
    def n_rows(self) -> int:
        """Number of decision points."""
        return int(self.q.shape[0])


def build_decision_points(
    traces: Iterable[Trace],
    *,
    cost_unit: str | None = None,
    labels_from_rewards: bool = False,
    group_by: str = "task",
    progress: bool = False,
    stop_rules: Sequence[StopRule] = (),
    nets: SafetyConfig | None = None,
    normalize_cost: bool = False,
    cost_scales: Mapping[str, float] | None = None,
    evidence: Evidence = DEFAULT_EVIDENCE,
) -> DecisionPoints:
    """Fold every trace once and collect one row per decision point.

    ``cost_unit`` None picks ``"usd"`` when every costed event carries usd, else
    ``"ktokens"`` (a *costed* event carries ``tokens`` or ``usd``; events that cost
    nothing, a reward or a stop, are not missing money); a missing cost on an event
    counts as 0 in the unit chosen. ``group_by`` is ``"task"`` (the task id) or
    ``"repo"`` (the task id's prefix before ``"__"``, e.g. ``django`` for
    ``django__django-12345``). ``stop_rules`` are called as ``rule(state,
    proposed_stop)`` at every decision point; their answers fill ``rule_stops``.
    ``nets`` (default :data:`stopserve.safety.DEFAULT_SAFETY`) is the safety config a
    served policy runs with: where its budgets (or the run's own) fire fills
    ``net_stop``, where its rules fire fills ``loop`` and ``quality``, where its
    ``min_turns`` allows a stop fills ``allowed``, so replays give every candidate
    policy the same handicaps. ``normalize_cost`` divides each trace's costs by the
    mean logged cost of its data set (``system`` up to the first "/"), so that a
    behavior run costs 1 on average in every set: λ is then the cost share of the
    evaluation protocol, and sets of 1k- and 1M-token runs weigh alike.
    ``cost_scales`` (data set -> mean cost, in the cost unit) gives those means instead,
    e.g. from the training side of a split; a data set it lacks uses its own mean.
    ``evidence`` sets what counts as a stall (the ``stall`` column).

    The same as :func:`assemble_decision_points` of one :func:`decision_part`.
    Raises :class:`TrainingError` when there are no traces, or a trace has no
    outcome (no graded event, no ``rewards.team``, and no reward on the label
    channel when ``labels_from_rewards``).
    """
    _check_options(cost_unit, group_by)
    part = decision_part(
        traces,
        labels_from_rewards=labels_from_rewards,
        progress=progress,
        stop_rules=stop_rules,
        nets=nets,
        evidence=evidence,
    )
    return assemble_decision_points(
        [part], cost_unit=cost_unit, group_by=group_by, normalize_cost=normalize_cost, cost_scales=cost_scales
    )


def _check_options(cost_unit: str | None, group_by: str) -> None:
    if cost_unit is not None and cost_unit not in COST_UNITS:
        raise TrainingError(f"cost unit {cost_unit!r} is not one of {', '.join(COST_UNITS)}")
    if group_by not in GROUP_BY:
        raise TrainingError(f"group_by {group_by!r} is not one of {', '.join(GROUP_BY)}")


def decision_part(
    traces: Iterable[Trace],
    *,
    labels_from_rewards: bool = False,
    progress: bool = False,
    stop_rules: Sequence[StopRule] = (),
    nets: SafetyConfig | None = None,
    evidence: Evidence = DEFAULT_EVIDENCE,
) -> DecisionPart:
    """Fold every trace once: the rows of :func:`build_decision_points`, in every cost unit.

    No traces give an empty part. Raises :class:`TrainingError` when a trace has no outcome.
    """
    if nets is None:
        from stopserve.safety import DEFAULT_SAFETY

        nets = DEFAULT_SAFETY
    cols = _Columns(len(FEATURE_NAMES), len(stop_rules))
    offsets: list[int] = [0]
    task_ids: list[str] = []
    trace_ids: list[str] = []
    q_finals: list[float] = []
    c_finals: list[tuple[float, float, float]] = []
    q_behaviors: list[float] = []
    c_behaviors: list[tuple[float, float, float]] = []
    opt_value: list[float] = []
    opt_lambda: list[float] = []
    run_to_cap: list[bool] = []
    censored: list[bool] = []
    systems: list[str] = []
    every_costed_has_usd = True
    any_usd = False

    iterator = _progress(traces, desc="decision points", unit=" traces", enabled=progress)

    for ti, trace in enumerate(iterator):
        state = RunState(topology=trace.topology, budget=trace.budget)
        team = _team_outcome(trace)
        grade: float | None = None
        reward_label: float | None = None
        usd = tok = 0.0
        b_stop = _behavior_stop(trace)
        b_at: tuple[float, tuple[float, float, float]] | None = None  # (q, costs) at the behavior's stop
        for k, (ev, is_row) in enumerate(fold_events(trace, state)):
            if ev.usd is not None:
                usd += ev.usd
                any_usd = True
            elif ev.tokens is not None:
                every_costed_has_usd = False
            if ev.tokens is not None:
                tok += ev.tokens
            if ev.grade is not None:
                grade = ev.grade
            if (
                ev.type == "reward"
                and ev.value is not None
                and (ev.channel or LABEL_CHANNEL) == LABEL_CHANNEL
            ):
                reward_label = ev.value
            if not is_row:
                continue
            if grade is not None:
                q = grade
            elif labels_from_rewards and reward_label is not None:
                q = reward_label
            else:
                q = 0.0  # before the run's own stop; the last row is fixed below
            if b_stop is not None and k <= b_stop:
                # its outcome there, where the events grade it (else the run's own end stands)
                b_at = None if grade is None else (float(grade), (usd, tok / 1000.0, float(ev.t)))
            cols.add_features(state.features())
            cols.trace_idx.append(ti)
            cols.turn.append(int(state.turn))
            cols.q.append(float(q))
            cols.c_usd.append(usd)
            cols.tokens.append(tok)
            cols.c_sec.append(float(ev.t))
            cols.propensity.append(ev.decision.propensity if ev.decision is not None else 1.0)
            cols.is_last.append(0)
            cols.logged_stop.append(ev.decision is not None and ev.decision.action == "stop")
            cols.q_filled.append(0)
            # the reward the quality_met net reads: the run's primary channel
            latest = state.latest_reward
            cols.latest_reward.append(math.nan if latest is None else float(latest))
            allowed = nets.allows_stop(state)
            cols.loop.append(nets.loop.check(state) is not None or nets.ledger.check(state) is not None)
            cols.quality.append(allowed and _quality_met(nets, state))
            cols.stall.append(stall(state, evidence) is not None)
            proposed = ev.type == "stop" and bool(ev.proposed)
            cols.proposed.append(proposed)
            cols.net_stop.append(nets.check_budgets(state) is not None)
            cols.allowed.append(allowed)
            if stop_rules:
                cols.rule_stops.extend(bool(rule(state, proposed)) for rule in stop_rules)
        # the logged end: every event folded
        # the spec's order: grade, then (when rewards are grades) the reward, then the outcome
        from_reward = labels_from_rewards and reward_label is not None
        if grade is not None:
            q_end = grade
        elif from_reward and reward_label is not None:
            q_end = reward_label
        elif team is not None:
            q_end = team
        else:
            hint = " or a reward on channel 'quality'" if labels_from_rewards else ""
            raise TrainingError(
                f"trace {trace.trace_id!r} has no outcome: no event carries 'grade' and "
                f"'rewards.team' is missing{hint}; grade the run or give its final reward"
            )
        last = len(cols.q) - 1
        cols.is_last[last] = 1
        if grade is None and not from_reward:
            # spec: the last decision point is the run's own stop, where the final outcome holds
            cols.q[last] = q_end
            cols.q_filled[last] = 1
        offsets.append(len(cols.q))
        task_ids.append(trace.task_id)
        trace_ids.append(trace.trace_id)
        q_finals.append(q_end)
        c_finals.append((usd, tok / 1000.0, float(trace.events[-1].t)))
        q_behaviors.append(q_end if b_at is None else b_at[0])
        c_behaviors.append(c_finals[-1] if b_at is None else b_at[1])
        opt_value.append(float(trace.metrics.get("optimal_value", math.nan)))
        opt_lambda.append(float(trace.metrics.get("optimal_lambda", math.nan)))
        run_to_cap.append(trace.metrics.get("run_to_cap") == 1.0)
        censored.append(_censored(trace, state))
        systems.append(trace.system or "unknown")

    n_rows = len(cols.q)
    return DecisionPart(
        X=cols.matrix(),
        trace_idx=np.array(cols.trace_idx, dtype=np.int64),
        turn=np.array(cols.turn, dtype=np.int64),
        q=np.array(cols.q, dtype=np.float64),
        usd=np.array(cols.c_usd, dtype=np.float64),
        tokens=np.array(cols.tokens, dtype=np.float64),
        seconds=np.array(cols.c_sec, dtype=np.float64),
        propensity=np.array(cols.propensity, dtype=np.float64),
        is_last=np.array(cols.is_last, dtype=bool),
        logged_stop=np.array(cols.logged_stop, dtype=bool),
        q_filled=np.array(cols.q_filled, dtype=bool),
        latest_reward=np.array(cols.latest_reward, dtype=np.float64),
        loop=np.array(cols.loop, dtype=bool),
        quality=np.array(cols.quality, dtype=bool),
        stall=np.array(cols.stall, dtype=bool),
        net_stop=np.array(cols.net_stop, dtype=bool),
        allowed=np.array(cols.allowed, dtype=bool),
        proposed=np.array(cols.proposed, dtype=bool),
        rule_stops=np.frombuffer(cols.rule_stops, dtype=np.int8)
        .astype(bool)
        .reshape(n_rows, len(stop_rules)),
        offsets=np.asarray(offsets, dtype=np.int64),
        task_id=np.asarray(task_ids, dtype=np.str_),
        trace_id=np.asarray(trace_ids, dtype=np.str_),
        q_final=np.asarray(q_finals, dtype=np.float64),
        c_final=np.asarray(c_finals, dtype=np.float64).reshape(len(c_finals), 3),
        q_behavior=np.asarray(q_behaviors, dtype=np.float64),
        c_behavior=np.asarray(c_behaviors, dtype=np.float64).reshape(len(c_behaviors), 3),
        optimal_value=np.asarray(opt_value, dtype=np.float64),
        optimal_lambda=np.asarray(opt_lambda, dtype=np.float64),
        run_to_cap=np.asarray(run_to_cap, dtype=bool),
        censored=np.asarray(censored, dtype=bool),
        system=np.asarray(systems, dtype=np.str_),
        any_usd=any_usd,
        every_costed_has_usd=every_costed_has_usd,
    )


def choose_cost_unit(flags: Iterable[tuple[bool, bool]], override: str | None = None) -> str:
    """The cost unit of the decision points of some parts: ``override``, else usd or ktokens.

    ``flags`` holds each part's ``(any_usd, every_costed_has_usd)``; the unit is the one
    :func:`resolve_cost_unit` gives over all their traces.
    """
    flags = list(flags)
    any_usd = any(a for a, _ in flags)
    unit = override or ("usd" if any_usd and all(e for _, e in flags) else "ktokens")
    if unit == "usd" and not any_usd:
        raise TrainingError(
            "cost unit 'usd' asked for, but no event carries 'usd'; use --cost-unit ktokens or seconds"
        )
    return unit


def assemble_decision_points(
    parts: Sequence[DecisionPart],
    *,
    cost_unit: str | None = None,
    group_by: str = "task",
    normalize_cost: bool = False,
    cost_scales: Mapping[str, float] | None = None,
) -> DecisionPoints:
    """Join parts (in order) into the decision points of all their traces.

    The cost unit, the groups and the per-data-set cost scales are chosen over every
    part, as :func:`build_decision_points` (whose options these are) chooses them over
    every trace: parts built apart give the same decision points as one pass.
    """
    _check_options(cost_unit, group_by)
    parts = [p for p in parts if p.n_traces]
    if not parts:
        raise TrainingError("no traces: the input holds no valid trace to learn or evaluate from")
    unit = choose_cost_unit([(p.any_usd, p.every_costed_has_usd) for p in parts], cost_unit)
    which = COST_UNITS.index(unit)

    def cat(name: str) -> npt.NDArray[Any]:
        return np.concatenate([getattr(p, name) for p in parts])

    trace_base = np.cumsum([0] + [p.n_traces for p in parts[:-1]])
    row_base = np.cumsum([0] + [p.n_rows for p in parts[:-1]])
    trace_idx = np.concatenate([p.trace_idx + b for p, b in zip(parts, trace_base, strict=True)])
    offsets = np.concatenate([[0], *(p.offsets[1:] + b for p, b in zip(parts, row_base, strict=True))])
    tokens = cat("tokens")
    c_raw = {0: cat("usd"), 1: tokens / 1000.0, 2: cat("seconds")}[which]
    trace_c_final = np.concatenate([p.c_final[:, which] for p in parts]).astype(np.float64)
    tasks = cat("task_id")
    systems = cat("system")
    dataset = np.asarray([name.split("/", 1)[0] for name in systems.tolist()], dtype=np.str_)
    trace_q_final = cat("q_final")
    trace_c_behavior = np.concatenate([p.c_behavior[:, which] for p in parts]).astype(np.float64)
    scale = np.ones(len(tasks))
    if normalize_cost:
        for name in np.unique(dataset):
            mine = dataset == name
            given = None if cost_scales is None else cost_scales.get(str(name))
            mean = float(trace_c_final[mine].mean()) if given is None else float(given)
            scale[mine] = mean if mean > 0 else 1.0
    rule_stops = cat("rule_stops")
    return DecisionPoints(
        cost_unit=unit,
        X=cat("X"),
        trace_idx=trace_idx,
        turn=cat("turn"),
        q=cat("q"),
        c=c_raw / scale[trace_idx],
        q_final=trace_q_final[trace_idx],
        c_final=(trace_c_final / scale)[trace_idx],
        propensity=cat("propensity"),
        is_last=cat("is_last"),
        logged_stop=cat("logged_stop"),
        q_filled=cat("q_filled"),
        elapsed=cat("seconds"),
        tokens=tokens,
        usd=cat("usd"),
        latest_reward=cat("latest_reward"),
        loop=cat("loop"),
        quality=cat("quality"),
        stall=cat("stall"),
        net_stop=cat("net_stop"),
        allowed=cat("allowed"),
        proposed=cat("proposed"),
        c_raw=c_raw,
        offsets=offsets.astype(np.int64),
        task_id=tasks,
        group=_groups(group_by, tasks, systems, dataset),
        trace_id=cat("trace_id"),
        trace_q_final=trace_q_final,
        trace_c_final=trace_c_final / scale,
        trace_q_behavior=cat("q_behavior"),
        trace_c_behavior=trace_c_behavior / scale,
        optimal_value=cat("optimal_value"),
        optimal_lambda=cat("optimal_lambda"),
        run_to_cap=cat("run_to_cap"),
        censored=cat("censored"),
        dataset=dataset,
        cost_scale=scale,
        rule_stops=rule_stops if rule_stops.shape[1] else np.zeros((0, 0), dtype=bool),
    )


def _groups(group_by: str, tasks: StrArray, systems: StrArray, dataset: StrArray) -> StrArray:
    """The group of each trace: runs of one group never straddle a train/test split."""
    if group_by == "repo":
        return np.asarray([t.split("__", 1)[0] for t in tasks.tolist()], dtype=np.str_)
    if group_by == "system":
        return systems
    if group_by == "dataset":
        return dataset
    return tasks


def load_decision_points(
    paths: Sequence[str | Path],
    *,
    cost_unit: str | None = None,
    labels_from_rewards: bool = False,
    group_by: str = "task",
    progress: bool = False,
    stop_rules: Sequence[StopRule] = (),
) -> DecisionPoints:
    """:func:`build_decision_points` over trace files, streamed (one trace in memory at a time)."""
    return build_decision_points(
        read_traces(paths, errors="all"),  # every bad trace listed, as validate does
        cost_unit=cost_unit,
        labels_from_rewards=labels_from_rewards,
        group_by=group_by,
        progress=progress,
        stop_rules=stop_rules,
    )


# --------------------------------------------------------------------------- CLI


def feature_columns(dp: DecisionPoints) -> dict[str, npt.NDArray[Any]]:
    """The columns ``stopserve features`` writes, in order: one value per decision point.

    ``trace_id``, ``turn``, every feature but ``turn`` (the same number, written once),
    ``q_t``, ``c_t``, ``q_final`` and ``cost_to_go``; CSV and Parquet carry the same.
    """
    cols: dict[str, npt.NDArray[Any]] = {"trace_id": dp.trace_id[dp.trace_idx], "turn": dp.turn}
    for j, name in enumerate(dp.feature_names):
        if name != "turn":
            cols[name] = dp.X[:, j]
    cols.update(q_t=dp.q, c_t=dp.c, q_final=dp.q_final, cost_to_go=dp.cost_to_go())
    return cols


def write_features_csv(dp: DecisionPoints, path: str | Path) -> None:
    """:func:`feature_columns` as one CSV file (a row per decision point), and a line on stderr."""
    out = Path(path)
    try:
        fh = out.open("w", newline="")
    except OSError as exc:
        raise TrainingError(f"{out}: cannot write: {exc.strerror or exc}") from exc
    cols = feature_columns(dp)
    with fh:
        writer = csv.writer(fh)
        writer.writerow(list(cols))
        trace_ids, turns = cols.pop("trace_id"), cols.pop("turn")
        numbers = np.column_stack(list(cols.values()))
        for i in range(dp.n_rows):
            writer.writerow([trace_ids[i], int(turns[i]), *(repr(float(v)) for v in numbers[i])])
    print(
        f"wrote {dp.n_rows} decision points of {dp.n_traces} traces to {out} (cost unit {dp.cost_unit})",
        file=sys.stderr,
    )
