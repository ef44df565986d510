"""From log records to a typed summary: what the service stopped, why, and what that saved.

:class:`Summarizer` folds records one at a time (O(1) each, bounded memory: aggregates per
run, decision timelines for the most recently active runs only) and :meth:`Summarizer.summary`
builds the :class:`Summary` the views draw. The same fold serves the report (every line of a
log directory) and the live page (the lines appended since its last look).

How a run ended (:data:`EndKind`): ``budget`` a safety net (turns, time, tokens, dollars:
your caps or the default ones) stopped it; ``rule`` the loop detector or ``quality_met``;
``model`` the learned value of going on (or the model's base rule); ``agent`` its outcome was
posted and the service had not stopped it; ``open`` no outcome yet.

**Cost saved, estimated.** For each run the service stopped, the cost it would still have
spent: the stop decision's ``cost_to_go`` (the model's expected cost still to come) when the
model that made it prices cost in the report's unit; otherwise the median of what runs like
it (same system, else any) that went on past as many decision points still spent after that
point; otherwise none (the run is counted as not estimated). An estimate, not a measurement:
a stopped run's future is not observed.
"""

from __future__ import annotations

import math
import statistics
import time
from array import array
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from stopserve.report.read import Problem, RecordKind

__all__ = [
    "BUDGET_NETS",
    "END_KINDS",
    "ChallengerRow",
    "CostEstimate",
    "DecisionPoint",
    "EndKind",
    "LoopCaught",
    "Models",
    "OutcomeRow",
    "PromotionRow",
    "RunRow",
    "Summarizer",
    "Summary",
    "TimeBin",
]

EndKind = Literal["budget", "rule", "model", "agent", "open"]
END_KINDS: Final[tuple[EndKind, ...]] = ("budget", "rule", "model", "agent", "open")
#: ``stopserve.safety.BUDGET_NETS`` (not imported: the report reads logs, it needs no policy code;
#: tests/report keeps them equal)
BUDGET_NETS: Final = ("max_turns", "max_seconds", "max_tokens", "max_usd", "max_tool_calls")
COST_UNITS: Final = ("ktokens", "usd", "seconds")
#: Text fields an event may carry that the user logged (extras format v1 keeps): shown for loops.
SNIPPET_FIELDS: Final = ("snippet", "text", "summary", "content", "command")
SNIPPET_CHARS: Final = 240
#: Decision points kept per timeline (the latest).
MAX_POINTS: Final = 1000
#: Runs that went on kept as references for the median estimate (the latest).
MAX_REFERENCE_RUNS: Final = 5000


@dataclass(frozen=True, slots=True)
class DecisionPoint:
    """One decision of a run, as its timeline shows it."""

    seq: int
    ts: float | None
    turn: int | None
    action: str
    reason: str | None
    v_stop: float | None
    q_continue: float | None
    q_stop: float | None
    cost_to_go: float | None
    safety_net: str | None
    pattern: str | None
    explored: bool
    #: a hook call: its event and what the hook did (``Stop -> would block``)
    note: str | None = None


@dataclass(frozen=True, slots=True)
class RunRow:
    """One run, as the runs table shows it."""

    run_id: str
    started: float | None
    last_seen: float | None
    decisions: int
    turn: int | None
    end: EndKind
    reason: str | None
    safety_net: str | None
    pattern: str | None
    rule: str | None
    cost: float | None
    saved: float | None
    saved_how: str | None
    reward: float | None
    success: bool | None
    explored: bool
    system: str | None


@dataclass(frozen=True, slots=True)
class LoopCaught:
    """A loop the service stopped (or named on a model stop): the repeated action, by its hash."""

    run_id: str
    ts: float | None
    turn: int | None
    pattern: str
    stopped_by_loop_rule: bool
    action: str | None = None  # "tool_use bash by coder"
    action_ref: str | None = None
    result_ref: str | None = None
    repeats: int | None = None
    error: bool = False
    sketch: str | None = None
    snippet: str | None = None
    #: why the action is not shown (no trace logged yet, no content ref)
    missing: str | None = None


@dataclass(frozen=True, slots=True)
class TimeBin:
    """Runs started in ``[start, start + width)``, by how they ended."""

    start: float
    ends: dict[str, int]


@dataclass(frozen=True, slots=True)
class CostEstimate:
    """Cost spent by the runs logged whole, and the estimate of what the stops saved."""

    unit: str
    spent: float
    runs_costed: int
    saved: float
    saved_by_end: dict[str, float]
    #: stopped runs estimated by each method: ``cost_to_go``, ``median``, ``none``
    methods: dict[str, int]
    #: (time, cumulative spent, cumulative saved), at most a few hundred points
    cumulative: list[tuple[float, float, float]]


@dataclass(frozen=True, slots=True)
class OutcomeRow:
    """Runs with an outcome, by how they ended."""

    end: str
    runs: int
    successes: int
    mean_reward: float | None


@dataclass(frozen=True, slots=True)
class ChallengerRow:
    """A shadow challenger: how often it agreed, and where it would have stopped the champion's stops."""

    name: str
    decisions: int
    agreed: int
    earlier: int
    same: int
    later: int


@dataclass(frozen=True, slots=True)
class PromotionRow:
    """One line of the promotions log: a promotion, a refusal or a rollback, with its figures."""

    ts: float | None
    kind: str
    version: str | None
    reason: str | None
    runs_judged: int | None
    champion: float | None
    champion_ci: tuple[float, float] | None
    candidate: float | None
    candidate_ci: tuple[float, float] | None
    difference: float | None
    difference_ci: tuple[float, float] | None
    policy: str | None


@dataclass(frozen=True, slots=True)
class Models:
    """The champion, its history, challengers, promotions, and the model versions seen deciding."""

    champion: str | None
    champion_path: str | None
    history: list[tuple[str | None, float | None]]
    challengers: list[ChallengerRow]
    promotions: list[PromotionRow]
    versions: list[tuple[str, int]]


@dataclass(frozen=True)
class Summary:
    """Everything the report and the live page show."""

    title: str
    source: str
    generated: float
    files: list[tuple[str, int]]
    problems: list[Problem]
    n_problems: int
    n_runs: int
    n_decisions: int
    n_stopped: int
    ends: dict[str, int]
    runs: list[RunRow]
    bins: list[TimeBin]
    bin_seconds: float
    stops_by_reason: list[tuple[str, str, int]]
    stops_by_net: list[tuple[str, int]]
    stops_by_rule: list[tuple[str, int]]
    loops: list[LoopCaught]
    n_loops: int
    cost: CostEstimate
    outcomes: list[OutcomeRow]
    success_at: float
    timelines: dict[str, list[DecisionPoint]]
    models: Models
    hook: dict[str, Any] | None = None
    #: the live page: what part of the logs it covers
    window: str | None = None
    notes: list[str] = field(default_factory=list)


class _Run:
    """What the fold keeps of one run (small: a few numbers and strings)."""

    __slots__ = (
        "chal_stops",
        "cost",
        "ends_run",
        "explored",
        "first_stop",
        "first_ts",
        "last_seq",
        "last_ts",
        "loop",
        "loop_info",
        "n_decisions",
        "n_points",
        "reward",
        "rule",
        "session",
        "stop",
        "system",
        "traced",
        "turn",
    )

    def __init__(self) -> None:
        self.n_decisions = 0
        self.last_seq = -1
        self.first_ts: float | None = None
        self.last_ts: float | None = None
        self.turn: int | None = None
        self.stop: dict[str, Any] | None = None  # the last answer, when it was a stop
        self.ends_run = False
        self.first_stop: int | None = None
        self.chal_stops: dict[str, int] | None = None
        self.explored = False
        self.loop: tuple[str, str | None, int | None, float | None, bool] | None = None
        self.loop_info: dict[str, Any] | None = None
        self.traced = False
        self.cost: tuple[float, float, float] | None = None  # ktokens, usd, seconds
        self.n_points: int | None = None  # decided events in its trace
        self.reward: float | None = None
        self.system: str | None = None
        self.session: str | None = None
        self.rule: str | None = None


def end_kind(stop: Mapping[str, Any] | None, traced: bool) -> EndKind:
    """How a run ended, from its last answer (a stop, or None) and whether its outcome was posted."""
    if stop is None:
        return "agent" if traced else "open"
    net = stop.get("safety_net")
    if isinstance(net, str) and net:
        parts = net.split("&")
        if stop.get("reason") == "budget_exhausted" or any(p in BUDGET_NETS for p in parts):
            return "budget"
        return "rule"
    if stop.get("reason") == "budget_exhausted":
        return "budget"
    return "model"


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    f = float(x)
    return f if math.isfinite(f) else None


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _str(x: Any) -> str | None:
    return x if isinstance(x, str) and x else None


def _ci(x: Any) -> tuple[float, float] | None:
    if isinstance(x, list | tuple) and len(x) == 2:
        lo, hi = _num(x[0]), _num(x[1])
        if lo is not None and hi is not None:
            return lo, hi
    return None


class Summarizer:
    """Fold log records (:meth:`add`) into a :class:`Summary` (:meth:`summary`).

    ``units`` maps a model version to the cost unit it prices cost in (from the model
    directories found), so a stop's ``cost_to_go`` is read only in the report's unit;
    ``cost_unit`` is that unit (default: the unit of most decisions' models, else ktokens).
    """

    def __init__(
        self,
        *,
        units: Mapping[str, str] | None = None,
        cost_unit: str | None = None,
        success_at: float = 0.5,
        max_timelines: int = 300,
        max_runs_shown: int = 500,
    ) -> None:
        self.units = dict(units or {})
        self.cost_unit = cost_unit
        self.success_at = success_at
        self.max_timelines = max_timelines
        self.max_runs_shown = max_runs_shown
        self._runs: dict[str, _Run] = {}
        self._timelines: OrderedDict[str, deque[DecisionPoint]] = OrderedDict()
        self._n_decisions = 0
        self._versions: Counter[str] = Counter()
        self._chal: dict[str, list[int]] = {}  # name -> [decisions, agreed]
        # runs that went on: (system, cumulative cost at each decision point per unit, final per unit)
        self._refs: deque[tuple[str | None, tuple[array[float], array[float], array[float]]]] = deque(
            maxlen=MAX_REFERENCE_RUNS
        )
        self._promotions: list[PromotionRow] = []
        self._hook_records: list[dict[str, Any]] = []
        self._labels: dict[str, float] = {}
        self.champion: dict[str, Any] | None = None
        self.problems: list[Problem] = []
        self.n_problems = 0
        self.files: dict[str, int] = {}
        self.notes: list[str] = []

    @property
    def n_runs(self) -> int:
        """Runs folded so far."""
        return len(self._runs)

    # ------------------------------------------------------------------ the fold

    def add(self, kind: RecordKind, rec: dict[str, Any]) -> None:
        """Fold one record (the reader's sink)."""
        if kind == "decision":
            self._decision(rec)
        elif kind == "trace":
            self._trace(rec)
        elif kind == "hook":
            self._hook(rec)
        elif kind == "label":
            sid, reward = _str(rec.get("session_id")), _num(rec.get("reward"))
            if sid is not None and reward is not None:
                self._labels[sid] = reward
        elif kind == "promotion":
            self._promotion(rec)

    def problem(self, p: Problem, *, keep: int = 100) -> None:
        """Note a problem (the first ``keep`` are listed)."""
        self.n_problems += 1
        if len(self.problems) < keep:
            self.problems.append(p)

    def read_file(self, name: str, records: int) -> None:
        """Note that ``records`` records were read from the file ``name``."""
        self.files[name] = self.files.get(name, 0) + records

    def _run(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = _Run()
        return run

    def _point(self, run_id: str, point: DecisionPoint) -> None:
        line = self._timelines.get(run_id)
        if line is None:
            line = self._timelines[run_id] = deque(maxlen=MAX_POINTS)
            if len(self._timelines) > self.max_timelines:
                self._timelines.popitem(last=False)
        else:
            self._timelines.move_to_end(run_id)
        line.append(point)

    def _decision(self, rec: Mapping[str, Any]) -> None:
        run_id = _str(rec.get("run_id"))
        self._n_decisions += 1
        if run_id is None:
            return  # a stateless call without a run id: counted, no run
        run = self._run(run_id)
        seq = _int(rec.get("seq"))
        if seq is None:
            seq = run.last_seq + 1
        elif seq <= run.last_seq and rec.get("replayed"):
            self._n_decisions -= 1  # logged again by the replica that answered a retry
            return
        run.last_seq = max(run.last_seq, seq)
        run.n_decisions += 1
        ts = _num(rec.get("ts"))
        if ts is not None:
            run.first_ts = ts if run.first_ts is None else min(run.first_ts, ts)
            run.last_ts = ts if run.last_ts is None else max(run.last_ts, ts)
        run.turn = _int(rec.get("turn"))
        action = str(rec.get("action"))
        explored = bool(rec.get("explored"))
        run.explored = run.explored or explored
        version = _str(rec.get("model_version"))
        if version is not None:
            self._versions[version] += 1
        if action == "stop":
            run.stop = {
                k: rec.get(k)
                for k in ("reason", "safety_net", "pattern", "rule", "cost_to_go", "model_version", "turn")
            }
            run.ends_run = True
            if run.first_stop is None:
                run.first_stop = seq
            pattern = _str(rec.get("pattern"))
            if pattern is not None:
                stopped = rec.get("reason") == "loop_detected"
                run.loop = (pattern, _str(rec.get("event_id")), run.turn, ts, stopped)
        else:
            run.stop, run.ends_run = None, False
        challengers = rec.get("challengers")
        if isinstance(challengers, dict):
            for name, theirs in challengers.items():
                if not isinstance(theirs, dict):
                    continue
                counts = self._chal.setdefault(str(name), [0, 0])
                counts[0] += 1
                counts[1] += theirs.get("action") == action
                if theirs.get("action") == "stop":
                    if run.chal_stops is None:
                        run.chal_stops = {}
                    run.chal_stops.setdefault(str(name), seq)
        self._point(
            run_id,
            DecisionPoint(
                seq=seq,
                ts=ts,
                turn=run.turn,
                action=action,
                reason=_str(rec.get("reason")),
                v_stop=_num(rec.get("v_stop")),
                q_continue=_num(rec.get("q_continue")),
                q_stop=_num(rec.get("q_stop")),
                cost_to_go=_num(rec.get("cost_to_go")),
                safety_net=_str(rec.get("safety_net")),
                pattern=_str(rec.get("pattern")),
                explored=explored,
            ),
        )

    def _hook(self, rec: dict[str, Any]) -> None:
        """A hook call: kept for the hook's own numbers, and a decision point of its session."""
        self._hook_records.append(
            {
                k: rec.get(k)
                for k in (
                    "error",
                    "session_id",
                    "run_id",
                    "mode",
                    "event",
                    "turn_key",
                    "outcome",
                    "would_block",
                    "would_end",
                )
            }
        )
        run_id = _str(rec.get("run_id")) or _str(rec.get("session_id"))
        action = _str(rec.get("action"))
        if run_id is None or action is None:
            return  # failed open, or no decision: in the hook's numbers only
        self._n_decisions += 1
        run = self._run(run_id)
        run.session = _str(rec.get("session_id"))
        run.last_seq += 1
        run.n_decisions += 1
        ts = _num(rec.get("ts"))
        if ts is not None:
            run.first_ts = ts if run.first_ts is None else min(run.first_ts, ts)
            run.last_ts = ts if run.last_ts is None else max(run.last_ts, ts)
        run.turn = _int(rec.get("turn"))
        # a hook ends a run only when a tool hook ends its turn (a net fired); a stop answer to
        # the agent's own Stop is the agent's stop, let through
        if rec.get("would_end"):
            run.stop = {k: rec.get(k) for k in ("reason", "safety_net", "pattern", "turn")}
            run.ends_run = True
            pattern = _str(rec.get("pattern"))
            if pattern is not None:
                run.loop = (pattern, None, run.turn, ts, rec.get("reason") == "loop_detected")
        elif rec.get("event") in ("Stop", "SubagentStop"):
            run.stop, run.ends_run = None, False
        event, outcome = _str(rec.get("event")), _str(rec.get("outcome"))
        self._point(
            run_id,
            DecisionPoint(
                seq=run.last_seq,
                ts=ts,
                turn=run.turn,
                action=action,
                reason=_str(rec.get("reason")),
                v_stop=_num(rec.get("v_stop")),
                q_continue=_num(rec.get("q_continue")),
                q_stop=_num(rec.get("q_stop")),
                cost_to_go=None,
                safety_net=_str(rec.get("safety_net")),
                pattern=_str(rec.get("pattern")),
                explored=False,
                note=f"{event or '?'} -> {outcome or '-'}",
            ),
        )

    def _trace(self, rec: Mapping[str, Any]) -> None:
        run_id = _str(rec.get("trace_id"))
        events = rec.get("events")
        if run_id is None or not isinstance(events, list):
            return
        run = self._run(run_id)
        run.traced = True
        run.system = _str(rec.get("system"))
        metrics = rec.get("metrics") if isinstance(rec.get("metrics"), dict) else {}
        started = _num(metrics.get("service_started")) if isinstance(metrics, dict) else None
        if started is not None:
            run.first_ts = started if run.first_ts is None else min(run.first_ts, started)
        rewards = rec.get("rewards")
        if isinstance(rewards, dict):
            run.reward = _num(rewards.get("team"))
        tokens = usd = 0.0
        t0: float | None = None
        t_last = 0.0
        cum = (array("d"), array("d"), array("d"))
        for ev in events:
            if not isinstance(ev, dict):
                continue
            tokens += _num(ev.get("tokens")) or 0.0
            usd += _num(ev.get("usd")) or 0.0
            t = _num(ev.get("t"))
            if t is not None:
                t0 = t if t0 is None else t0
                t_last = t
            if "decision" in ev:
                cum[0].append(tokens / 1000.0)
                cum[1].append(usd)
                cum[2].append(t_last - (t0 or 0.0))
        seconds = t_last - (t0 or 0.0)
        run.cost = (tokens / 1000.0, usd, seconds)
        run.n_points = len(cum[0])
        if run.n_decisions == 0:
            # no decision log line of this run (another replica's log, rotated away): its trace says
            stop = rec.get("stop")
            if isinstance(stop, dict) and stop.get("by") in ("service", "safety_net"):
                last: Any = next(
                    (e["decision"] for e in reversed(events) if isinstance(e, dict) and "decision" in e),
                    {},
                )
                run.stop = {
                    "reason": stop.get("reason"),
                    "safety_net": last.get("safety_net") if isinstance(last, dict) else None,
                    "pattern": None,
                }
                if stop.get("by") == "safety_net" and not run.stop["safety_net"]:
                    run.stop["safety_net"] = (
                        "max_" + str(stop.get("limit")) if stop.get("limit") else "loop_detector"
                    )
                run.ends_run = True
        if not run.ends_run:
            self._refs.append((run.system, cum))
        if run.loop is not None:
            run.loop_info = _loop_action(events, run.loop[0], run.loop[1])

    def _promotion(self, rec: Mapping[str, Any]) -> None:
        kind = str(rec.get("kind"))
        ev = rec.get("evidence") if isinstance(rec.get("evidence"), dict) else {}
        assert isinstance(ev, dict)
        estimates = ev.get("estimates") if isinstance(ev.get("estimates"), dict) else {}
        assert isinstance(estimates, dict)

        def dr(name: str) -> tuple[float | None, tuple[float, float] | None]:
            e = estimates.get(name)
            if not isinstance(e, dict):
                return None, None
            return _num(e.get("dr")), _ci(e.get("dr_ci90"))

        diff = ev.get("difference") if isinstance(ev.get("difference"), dict) else {}
        assert isinstance(diff, dict)
        judged = ev.get("judged_on") if isinstance(ev.get("judged_on"), dict) else {}
        assert isinstance(judged, dict)
        champion, champion_ci = dr("champion")
        candidate, candidate_ci = dr("candidate")
        version: str | None
        if kind == "rollback":
            to = rec.get("to")
            version = _str(to.get("version")) if isinstance(to, dict) else None
        elif kind == "promotion":
            version = _str(rec.get("version"))
        else:
            cand = ev.get("candidate")
            version = _str(cand.get("version")) if isinstance(cand, dict) else None
        self._promotions.append(
            PromotionRow(
                ts=_num(rec.get("ts")),
                kind=kind,
                version=version,
                reason=_str(rec.get("reason")) or _str(ev.get("reason")),
                runs_judged=_int(judged.get("runs")),
                champion=champion,
                champion_ci=champion_ci,
                candidate=candidate,
                candidate_ci=candidate_ci,
                difference=_num(diff.get("mean")),
                difference_ci=_ci(diff.get("ci90")),
                policy=_str(diff.get("policy")),
            )
        )

    # ------------------------------------------------------------------ the summary

    def _unit(self) -> str:
        if self.cost_unit is not None:
            return self.cost_unit
        units: Counter[str] = Counter()
        for version, n in self._versions.items():
            unit = self.units.get(version)
            if unit is not None:
                units[unit] += n
        return units.most_common(1)[0][0] if units else "ktokens"

    def summary(
        self, *, title: str = "stopserve report", source: str = "", window: str | None = None
    ) -> Summary:
        """The summary of everything folded so far."""
        unit = self._unit()
        u = COST_UNITS.index(unit) if unit in COST_UNITS else 0
        medians = _MedianRemaining(self._refs, u)
        labels = self._labels
        rows: list[RunRow] = []
        ends: Counter[str] = Counter()
        by_reason: Counter[tuple[str, str]] = Counter()
        by_net: Counter[str] = Counter()
        by_rule: Counter[str] = Counter()
        saved_by: dict[str, float] = dict.fromkeys(END_KINDS[:3], 0.0)
        methods = {"cost_to_go": 0, "median": 0, "none": 0}
        spent = saved = 0.0
        costed = 0
        timeline: list[tuple[float, float, float]] = []
        outcomes: dict[str, list[float]] = {}
        loops: list[LoopCaught] = []
        n_loops = 0
        chal_runs: dict[str, list[int]] = {name: [0, 0, 0] for name in self._chal}
        for run_id, run in self._runs.items():
            reward = run.reward
            if reward is None and run.session is not None:
                reward = labels.get(run.session)
            stop = run.stop if run.ends_run else None
            kind = end_kind(stop, run.traced or reward is not None)
            ends[kind] += 1
            cost = run.cost[u] if run.cost is not None else None
            if cost is not None:
                spent += cost
                costed += 1
            run_saved: float | None = None
            how: str | None = None
            if stop is not None:
                reason = str(stop.get("reason") or "unknown")
                by_reason[(reason, kind)] += 1
                net = _str(stop.get("safety_net"))
                if net is not None:
                    by_net[net] += 1
                rule = _str(stop.get("rule"))
                if rule is not None:
                    by_rule[rule] += 1
                ctg = _num(stop.get("cost_to_go"))
                version = _str(stop.get("model_version"))
                if ctg is not None and version is not None and self.units.get(version) == unit:
                    run_saved, how = ctg, "cost_to_go"
                else:
                    at = run.n_points if run.n_points is not None else run.last_seq + 1
                    found = medians.at(at, run.system)
                    if found is not None:
                        run_saved, how = found[0], f"median of {found[1]} runs like it"
                if run_saved is None:
                    methods["none"] += 1
                else:
                    methods["cost_to_go" if how == "cost_to_go" else "median"] += 1
                    saved += run_saved
                    saved_by[kind] += run_saved
            if run.chal_stops is not None or (run.first_stop is not None and chal_runs):
                for name, counts in chal_runs.items():
                    theirs = (run.chal_stops or {}).get(name)
                    if run.first_stop is None:
                        continue
                    if theirs is None:
                        counts[2] += 1
                    else:
                        counts[0 if theirs < run.first_stop else 1 if theirs == run.first_stop else 2] += 1
            when = run.last_ts if run.last_ts is not None else run.first_ts
            if when is not None and (cost is not None or run_saved is not None):
                timeline.append((when, cost or 0.0, run_saved or 0.0))
            if reward is not None:
                outcomes.setdefault(kind, []).append(reward)
            if run.loop is not None:
                n_loops += 1
                loops.append(_loop_row(run_id, run))
            rows.append(
                RunRow(
                    run_id=run_id,
                    started=run.first_ts,
                    last_seen=run.last_ts,
                    decisions=run.n_decisions,
                    turn=run.turn,
                    end=kind,
                    reason=_str(stop.get("reason")) if stop else None,
                    safety_net=_str(stop.get("safety_net")) if stop else None,
                    pattern=_str(stop.get("pattern")) if stop else None,
                    rule=_str(stop.get("rule")) if stop else None,
                    cost=cost,
                    saved=run_saved,
                    saved_how=how,
                    reward=reward,
                    success=None if reward is None else reward >= self.success_at,
                    explored=run.explored,
                    system=run.system,
                )
            )
        n_stopped = sum(ends[k] for k in ("budget", "rule", "model"))
        bins, width = _bins(rows)
        timeline.sort()
        cumulative: list[tuple[float, float, float]] = []
        total_spent = total_saved = 0.0
        step = max(1, len(timeline) // 400)
        for i, (when, c, s) in enumerate(timeline):
            total_spent += c
            total_saved += s
            if i % step == 0 or i == len(timeline) - 1:
                cumulative.append((when, total_spent, total_saved))
        rows.sort(key=lambda r: r.last_seen or r.started or 0.0, reverse=True)
        loops.sort(key=lambda r: r.ts or 0.0, reverse=True)
        champion = self.champion or {}
        history = champion.get("history") if isinstance(champion.get("history"), list) else []
        assert isinstance(history, list)
        models = Models(
            champion=_str(champion.get("version")),
            champion_path=_str(champion.get("path")),
            history=[(_str(h.get("version")), _num(h.get("at"))) for h in history if isinstance(h, dict)],
            challengers=[
                ChallengerRow(name, d, a, *chal_runs.get(name, [0, 0, 0]))
                for name, (d, a) in sorted(self._chal.items())
            ],
            promotions=sorted(self._promotions, key=lambda p: p.ts or 0.0),
            versions=self._versions.most_common(),
        )
        hook = None
        if self._hook_records:
            from stopserve.hooks.report import report as hook_report

            hook = hook_report(self._hook_records, labels, fail_below=self.success_at)
        return Summary(
            title=title,
            source=source,
            generated=time.time(),
            files=sorted(self.files.items()),
            problems=list(self.problems),
            n_problems=self.n_problems,
            n_runs=len(self._runs),
            n_decisions=self._n_decisions,
            n_stopped=n_stopped,
            ends={k: ends[k] for k in END_KINDS},
            runs=rows[: self.max_runs_shown],
            bins=bins,
            bin_seconds=width,
            stops_by_reason=[(r, k, n) for (r, k), n in by_reason.most_common()],
            stops_by_net=by_net.most_common(),
            stops_by_rule=by_rule.most_common(),
            loops=loops[:200],
            n_loops=n_loops,
            cost=CostEstimate(
                unit=unit,
                spent=spent,
                runs_costed=costed,
                saved=saved,
                saved_by_end=saved_by,
                methods=methods,
                cumulative=cumulative,
            ),
            outcomes=[
                OutcomeRow(
                    end=k,
                    runs=len(outcomes[k]),
                    successes=sum(1 for r in outcomes[k] if r >= self.success_at),
                    mean_reward=statistics.fmean(outcomes[k]),
                )
                for k in END_KINDS
                if k in outcomes
            ],
            success_at=self.success_at,
            timelines={run_id: list(points) for run_id, points in reversed(self._timelines.items())},
            models=models,
            hook=hook,
            window=window,
            notes=list(self.notes),
        )


class _MedianRemaining:
    """The median cost runs like one still spent after its n-th decision point (runs that went on)."""

    def __init__(self, refs: Iterable[tuple[str | None, tuple[array[float], ...]]], unit: int) -> None:
        self._refs = [(system, cum[unit]) for system, cum in refs]
        self._cache: dict[tuple[int, str | None], tuple[float, int] | None] = {}

    def at(self, n: int, system: str | None) -> tuple[float, int] | None:
        """(median remaining cost, runs it is the median of), or None when no run went on past ``n``."""
        key = (n, system)
        if key not in self._cache:
            found = self._median(n, system) if system is not None else None
            self._cache[key] = found if found is not None else self._median(n, None)
        return self._cache[key]

    def _median(self, n: int, system: str | None) -> tuple[float, int] | None:
        rest = [
            cum[-1] - cum[n - 1] if n > 0 else cum[-1]
            for s, cum in self._refs
            if (system is None or s == system) and len(cum) > n
        ]
        return (statistics.median(rest), len(rest)) if rest else None


_ACTION_PATTERNS: Final = ("repeated_action_observation", "repeated_action_error", "alternating_actions")


def _loop_action(events: list[Any], pattern: str, event_id: str | None) -> dict[str, Any]:
    """The repeated action of a loop, from its trace: its hash, how often, a snippet the user logged."""
    end = len(events) - 1
    if event_id is not None:
        for i in range(len(events) - 1, -1, -1):
            ev = events[i]
            if isinstance(ev, dict) and ev.get("id") == event_id:
                end = i
                break
    wanted = ("tool_use",) if pattern in _ACTION_PATTERNS else None
    anchor: dict[str, Any] | None = None
    at = end
    for i in range(end, -1, -1):
        ev = events[i]
        if not isinstance(ev, dict) or not ev.get("content_ref"):
            continue
        if wanted is None or ev.get("type") in wanted:
            anchor, at = ev, i
            break
    if anchor is None:
        return {"missing": "no event with a content ref before the stop"}
    key = (anchor.get("type"), anchor.get("agent"), anchor.get("tool"), anchor.get("content_ref"))
    repeats = 0
    for i in range(at, -1, -1):
        ev = events[i]
        if not isinstance(ev, dict) or ev.get("type") != anchor.get("type"):
            continue
        if (ev.get("type"), ev.get("agent"), ev.get("tool"), ev.get("content_ref")) == key:
            repeats += 1
        elif pattern != "alternating_actions":
            break
    result: dict[str, Any] | None = None
    for ev in events[at + 1 : end + 1]:
        if isinstance(ev, dict) and ev.get("type") == "return":
            result = ev
            break
    what = " ".join(
        str(x) for x in (anchor.get("type"), anchor.get("tool"), "by", anchor.get("agent")) if x is not None
    )
    snippet = next(
        (
            str(ev.get(k))[:SNIPPET_CHARS]
            for ev in (anchor, result)
            if ev is not None
            for k in SNIPPET_FIELDS
            if isinstance(ev.get(k), str) and ev.get(k)
        ),
        None,
    )
    sketch = anchor.get("sketch")
    return {
        "action": what,
        "action_ref": str(anchor.get("content_ref")),
        "result_ref": str(result.get("content_ref")) if result and result.get("content_ref") else None,
        "repeats": repeats,
        "error": bool(anchor.get("error") or (result or {}).get("error")),
        "sketch": sketch if isinstance(sketch, str) else None,
        "snippet": snippet,
    }


def _loop_row(run_id: str, run: _Run) -> LoopCaught:
    assert run.loop is not None
    pattern, _, turn, ts, stopped = run.loop
    info = run.loop_info or {"missing": "its trace is not logged (no outcome posted yet)"}
    return LoopCaught(
        run_id=run_id,
        ts=ts,
        turn=turn,
        pattern=pattern,
        stopped_by_loop_rule=stopped,
        action=info.get("action"),
        action_ref=info.get("action_ref"),
        result_ref=info.get("result_ref"),
        repeats=info.get("repeats"),
        error=bool(info.get("error")),
        sketch=info.get("sketch"),
        snippet=info.get("snippet"),
        missing=info.get("missing"),
    )


_BIN_WIDTHS: Final = (60.0, 300.0, 900.0, 3600.0, 6 * 3600.0, 86400.0, 7 * 86400.0, 30 * 86400.0)


def _bins(rows: list[RunRow]) -> tuple[list[TimeBin], float]:
    """Runs by start time, in at most ~60 bins of a round width, by how they ended."""
    starts = [(r.started, r.end) for r in rows if r.started is not None]
    if not starts:
        return [], 0.0
    lo = min(s for s, _ in starts)
    hi = max(s for s, _ in starts)
    width = next((w for w in _BIN_WIDTHS if (hi - lo) / w <= 60), _BIN_WIDTHS[-1])
    first = math.floor(lo / width) * width
    counts: dict[int, Counter[str]] = {}
    for s, kind in starts:
        assert s is not None
        counts.setdefault(int((s - first) // width), Counter())[kind] += 1
    return [
        TimeBin(first + i * width, {k: counts[i][k] for k in END_KINDS if counts[i][k]})
        for i in sorted(counts)
    ], width
