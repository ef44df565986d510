"""Message-level credit: which events moved a run toward success, read from the learned value.

A trained model gives the value of a run at every decision point ``t``,

    V(s_t) = max(S(s_t), Q(s_t) − λ·K(s_t)) = S(s_t) + max(0, V_continue(s_t))

S is the quality the run hands back if it stops now (model ``s``) and ``V_continue`` the
value of going on, net of what the rest of the run costs — the one definition of
:meth:`stopserve.policy.Policy.values`. Before the first event (``s_0``) the run holds
nothing and has spent nothing: ``V(s_0) = 0``, the value of stopping before the start
(``baseline="model"`` takes the model's value of the empty run instead: a row it never
saw in training, and the credits then leave out what the task promised from the start).

**TD credit** (``method="td"``). The events between decision points ``t−1`` and ``t``
changed the value of the run by ``V(s_t) − V(s_{t−1})`` and cost ``c_t − c_{t−1}``; their
credit is the temporal-difference advantage

    δ_t = V(s_t) − V(s_{t−1}) − p_t · (c_t − c_{t−1})

with ``p_t`` the weight of one cost unit in quality units that the policy itself uses
(:func:`cost_price`): λ for an absolute λ, ``s / mean cost`` for a cost share on a
one-system model, and ``s / Ĉ_t`` for a cost share on a per-run model, where
``Ĉ_t = (c_t / turn_t)·(turn_t + K_t)`` is the run's expected total cost: the per-run
policy prices the rest of the run at ``w = s·K/(turn + K)``, which is exactly
``(s / Ĉ_t) × cost still to come``, so spent cost is priced at the same rate. Summed over
a run the credits telescope to ``V(s_last) − V(s_0) −`` the weighted cost: what the run
is worth at its last decision point, net of what it paid; nothing is counted twice.

How δ_t reaches the events: each event pays its own cost (``p_t ×`` its cost, known
exactly); the value change is shared in proportion to tokens (``split="tokens"``, the
default: the work each event did; equal shares where no event carries tokens) or
equally (``"equal"``). A ``reward`` event is an observation — a verifier's or an
environment's score of the work done since the previous score — so it is never credited a
value change: the change of an interval that holds one is shared over that work, every
event since the previous reward. Events after the last decision point get no credit
(``None``).

``window="reward"`` reads V only where the run is scored — at ``reward`` events — and at
the last decision point; the changes in between telescope into one interval per scored
window, split as above. Between two scores V moves on expectations the next score
settles (a new answer's expected grade, cost becoming sunk); where those are noisy, the
score-to-score change is the cleaner signal (``docs/credit.md`` has the measurements). A
run without rewards gets the same credit either way.

**Ablation credit** (``method="ablation"``): the leave-one-out counterfactual. The credit
of event ``e`` in the interval closed by decision point ``t`` is ``V(s_t) − V(s_t without
e) − p_t × cost(e)``: the state refolded from the prefix with ``e`` removed (a copy of the
state before ``e``, then the rest of the interval). It costs one refold per event, so it
is capped: only events of the chosen ``types`` (default: every type but ``reward``), only
in the last ``last_k`` intervals. It sees what the model reads from an
event's presence, never its consequences: an effect that only shows in a later score is
still in the prefix without the event.

Aggregates (:func:`aggregate`) sum credit by event, agent, role, type or (agent, type),
over one trace or many. ``docs/credit.md`` explains how to read a report.

>>> report = credit_trace(Policy.load("models/default"), trace)   # doctest: +SKIP
>>> [(e.agent, round(e.credit, 3)) for e in report.events]        # doctest: +SKIP
"""

from __future__ import annotations

import copy
import csv
import itertools
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from stopserve.errors import ConfigError, ModelError, TrainingError
from stopserve.features import RunState
from stopserve.objective import Objective, cost_so_far, event_cost
from stopserve.policy import Policy
from stopserve.progress import progress
from stopserve.trace import EVENT_TYPES, Event, Trace, read_traces
from stopserve.training.labels import fold_events

__all__ = [
    "ABLATION_TYPES",
    "BASELINES",
    "GROUPINGS",
    "METHODS",
    "SPLITS",
    "WINDOWS",
    "EventCredit",
    "TraceCredit",
    "ValuePoint",
    "aggregate",
    "cost_price",
    "credit_report",
    "credit_trace",
]

FloatArray = npt.NDArray[np.float64]

METHODS: Final[tuple[str, ...]] = ("td", "ablation")
SPLITS: Final[tuple[str, ...]] = ("tokens", "equal")
#: Where V is read: at every decision point, or only where the run is scored (rewards) and at its last.
WINDOWS: Final[tuple[str, ...]] = ("decision", "reward")
#: V(s_0): 0 (the value of stopping before the first event), or the model's value of the empty run.
BASELINES: Final[tuple[str, ...]] = ("zero", "model")
#: What credit can be summed by; ``agent_type`` is the (agent, type) pair.
GROUPINGS: Final[tuple[str, ...]] = ("event", "agent", "role", "type", "agent_type")
#: Event types ablated by default: every act (a reward is an observation; a final stop comes after
#: the last decision point, a proposed stop is an answer).
ABLATION_TYPES: Final[tuple[str, ...]] = tuple(t for t in EVENT_TYPES if t != "reward")
_OBSERVATION: Final = "reward"


@dataclass(frozen=True, slots=True)
class ValuePoint:
    """The run's value at one decision point (``index`` -1: the run before any event)."""

    index: int
    event_id: str | None
    turn: int
    cost: float  # cost so far, in the model's cost unit
    v: float  # V(s_t) = S + max(0, V_continue)
    s: float  # quality handed back if the run stops here
    v_continue: float  # value of going on, net of the rest of the run's cost
    price: float  # quality units per cost unit here (what spent cost is weighed with)


@dataclass(frozen=True, slots=True)
class EventCredit:
    """One event's credit; ``point`` is the decision point whose interval holds it (0: none)."""

    index: int
    event_id: str
    type: str
    agent: str
    role: str | None
    tokens: int
    cost: float  # its own cost in the model's cost unit
    point: int
    v_before: float | None  # V at the start of its interval
    v_after: float | None  # V at the decision point closing it
    credit: float | None  # None: after the last decision point, or not ablated
    contribution: float | None  # the offline label, when the trace carries it (simulator)


@dataclass(frozen=True)
class TraceCredit:
    """The credit report of one trace: its value path and every event's credit."""

    trace_id: str
    method: str
    split: str
    window: str
    baseline: str
    cost_unit: str
    lam: float | None
    cost_share: float | None
    values: tuple[ValuePoint, ...]
    events: tuple[EventCredit, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return {
            "trace_id": self.trace_id,
            "method": self.method,
            "split": self.split,
            "window": self.window,
            "baseline": self.baseline,
            "cost_unit": self.cost_unit,
            "lambda": self.lam,
            "cost_share": self.cost_share,
            "values": [asdict(v) for v in self.values],
            "events": [asdict(e) for e in self.events],
        }


# --------------------------------------------------------------------------- value along a run


def cost_price(policy: Policy, k_turns: Any, turn: Any, cost: Any, objective: Objective) -> Any:
    """Quality units one cost unit is worth at a state: ``w / cost_to_go`` of :meth:`Objective.weight`.

    λ for an absolute λ; ``s / mean cost`` for a cost share on a one-system model;
    ``s / ((cost / turn)·(turn + K))`` on a per-run model (the share of the run's expected
    total cost). 0 where nothing was spent yet (there is no cost to weigh).
    """
    k = np.maximum(np.asarray(k_turns, dtype=np.float64), 1e-9)  # the ratio's limit at K = 0
    w, ctg = objective.weight(k, turn, cost, mean_cost=policy.mean_behavior_cost)
    ctg = np.asarray(ctg, dtype=np.float64)
    safe = np.where(ctg > 0, ctg, 1.0)
    return np.where(ctg > 0, np.asarray(w, dtype=np.float64) / safe, 0.0)


def _check_policy(policy: Policy) -> None:
    if policy.kind != "model" or "s" not in policy.boosters or "k" not in policy.boosters:
        what = {"heuristic": "a tuned heuristic", "none": "no model"}.get(policy.kind, "no value model S")
        raise ModelError(
            f"credit reads the learned value V = max(S, Q − λK), but this model directory holds {what}"
            " (stopserve train ships a heuristic when the learned policy does not beat it): "
            "give a directory with a learned model (kind 'model')"
        )


@dataclass(frozen=True)
class _Reader:
    """Reads V along a run: the policy and what cost is worth."""

    policy: Policy
    objective: Objective

    def read(
        self, rows: FloatArray, turn: npt.ArrayLike, cost: npt.ArrayLike
    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """(V, S, V_continue, price) of feature rows, through :meth:`Policy.values`."""
        policy = self.policy
        raw = policy.raw_batch(rows)
        if "s" not in raw:  # a behavior model does not read S to decide, but it always ships it
            s_raw = policy.boosters["s"].predict(policy.columns(rows), raw_score=True)
            raw["s"] = np.asarray(s_raw, dtype=np.float64)
        turn_a = np.asarray(turn, dtype=np.float64)
        cost_a = np.asarray(cost, dtype=np.float64)
        v_cont, _, _ = policy.values(raw, turn_a, cost_a, self.objective)
        s = np.asarray(policy.transformed("s", raw["s"]), dtype=np.float64)
        v_cont = np.asarray(v_cont, dtype=np.float64)
        k = np.maximum(raw["k"], 0.0)
        price = cost_price(policy, k, turn_a, cost_a, self.objective)
        return s + np.maximum(v_cont, 0.0), s, v_cont, np.asarray(price, dtype=np.float64)


@dataclass(frozen=True)
class _Path:
    """A run walked once: its events, its decision points (``idx[0] = -1``: the start), V there."""

    events: Sequence[Event]
    idx: Sequence[int]
    v: FloatArray
    price: FloatArray
    ev_cost: Sequence[float]


def _event_cost(ev: Event, unit: str, previous_t: float) -> float:
    seconds = max(0.0, float(ev.t) - previous_t)
    return event_cost(unit, tokens=float(ev.tokens or 0), usd=float(ev.usd or 0.0), seconds=seconds)


# --------------------------------------------------------------------------- credit of one trace


def credit_trace(
    policy: Policy,
    trace: Trace,
    *,
    method: str = "td",
    split: str = "tokens",
    window: str = "decision",
    baseline: str = "zero",
    objective: Objective | None = None,
    types: Sequence[str] | None = None,
    last_k: int | None = None,
) -> TraceCredit:
    """Every event's credit in ``trace`` under ``policy``'s learned value (module docstring).

    ``window`` ``"reward"`` reads V only where the run is scored (module docstring);
    ``baseline`` ``"model"`` starts from the model's V of the empty run instead of 0.
    ``objective`` sets what cost is worth (default: the model's, as a decision would);
    ``types`` and ``last_k`` cap the ablation. Raises :class:`ModelError` for a directory
    without a learned value, :class:`ConfigError` for a bad option.
    """
    _check_options(method=method, split=split, window=window, baseline=baseline, types=types, last_k=last_k)
    _check_policy(policy)
    worth = policy.resolve(objective)
    unit = policy.cost_unit
    events = trace.events
    state = RunState(topology=trace.topology, budget=trace.budget)
    rows = [state.features()]
    turns, costs, idx = [0], [0.0], [-1]
    ev_cost: list[float] = []
    previous_t = 0.0
    for ev, is_row in fold_events(trace, state):
        ev_cost.append(_event_cost(ev, unit, previous_t))
        previous_t = float(ev.t)
        if is_row:
            rows.append(state.features())
            turns.append(state.turn)
            costs.append(cost_so_far(state, unit))
            idx.append(len(ev_cost) - 1)
    reader = _Reader(policy, worth)
    v, s, vc, price = reader.read(np.vstack(rows), turns, costs)
    if baseline == "zero":
        v[0] = s[0] = vc[0] = 0.0  # nothing held, nothing spent: the value of stopping before the start
    values = tuple(
        ValuePoint(
            index=idx[t],
            event_id=events[idx[t]].id if idx[t] >= 0 else None,
            turn=turns[t],
            cost=costs[t],
            v=float(v[t]),
            s=float(s[t]),
            v_continue=float(vc[t]),
            price=float(price[t]),
        )
        for t in range(len(idx))
    )
    # the decision points V is read at: every one, or (window "reward") the rewards and the last
    used = list(range(len(idx)))
    if window == "reward" and method == "td":
        scored = [t for t in used[1:-1] if events[idx[t]].type == _OBSERVATION]
        used = [0, *scored, len(idx) - 1] if len(idx) > 1 else [0]
    first = np.zeros(len(events), dtype=np.int64)  # the point opening each event's interval
    point = np.zeros(len(events), dtype=np.int64)  # the point closing it (0: after the last one)
    for a, b in itertools.pairwise(used):
        first[idx[a] + 1 : idx[b] + 1] = a
        point[idx[a] + 1 : idx[b] + 1] = b
    path = _Path(events, idx, v, price, ev_cost)
    if method == "td":
        credit = _td(path, used, split)
    else:
        snapshots = _snapshots(trace, _ablated(events, idx, types, last_k))
        credit = _ablation(reader, trace, path, snapshots, point)
    out = tuple(
        EventCredit(
            index=i,
            event_id=ev.id,
            type=ev.type,
            agent=ev.agent,
            role=ev.role,
            tokens=int(ev.tokens or 0),
            cost=ev_cost[i],
            point=int(point[i]),
            v_before=float(v[first[i]]) if point[i] else None,
            v_after=float(v[point[i]]) if point[i] else None,
            credit=credit[i],
            contribution=ev.contribution,
        )
        for i, ev in enumerate(events)
    )
    return TraceCredit(
        trace.trace_id, method, split, window, baseline, unit, worth.lam, worth.cost_share, values, out
    )


def _check_options(
    *, method: str, split: str, window: str, baseline: str, types: Sequence[str] | None, last_k: int | None
) -> None:
    for name, value, allowed in (
        ("method", method, METHODS),
        ("split", split, SPLITS),
        ("window", window, WINDOWS),
        ("baseline", baseline, BASELINES),
    ):
        if value not in allowed:
            raise ConfigError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
    if method == "ablation" and window != "decision":
        raise ConfigError("window: ablation reads V at the decision point after each event; window is for td")
    for name in types or ():
        if name not in EVENT_TYPES:
            raise ConfigError(f"types: {name!r} is not an event type ({', '.join(EVENT_TYPES)})")
    if last_k is not None and last_k < 1:
        raise ConfigError(f"last_k: expected a number above 0, got {last_k}")


def _ablated(
    events: Sequence[Event], idx: Sequence[int], types: Sequence[str] | None, last_k: int | None
) -> set[int]:
    """Indices of the events the ablation removes: chosen types, in the last ``last_k`` intervals.

    ``idx`` holds -1 (the start) and then the index of every decision point.
    """
    allowed = set(ABLATION_TYPES if types is None else types)
    first = 0
    if last_k is not None and len(idx) - 1 > last_k:
        first = idx[-last_k - 1] + 1
    return {i for i in range(first, idx[-1] + 1) if events[i].type in allowed}


def _snapshots(trace: Trace, keep: set[int]) -> list[tuple[int, RunState]]:
    """The state before each event in ``keep``: a second fold, copying the state where needed."""
    state = RunState(topology=trace.topology, budget=trace.budget)
    walker = fold_events(trace, state)
    out: list[tuple[int, RunState]] = []
    for i in range(len(trace.events)):
        if i in keep:
            out.append((i, copy.deepcopy(state)))
        next(walker)
    return out


def _shares(events: Sequence[Event], targets: Sequence[int], split: str) -> list[float]:
    if split == "tokens":
        tokens = [float(events[j].tokens or 0) for j in targets]
        total = sum(tokens)
        if total > 0:
            return [x / total for x in tokens]
    return [1.0 / len(targets)] * len(targets)


def _td(path: _Path, used: Sequence[int], split: str) -> list[float | None]:
    events, idx, v, price = path.events, path.idx, path.v, path.price
    credit: list[float | None] = [None] * len(events)
    last_reward = -1  # index of the latest reward before the current interval
    for a, b in itertools.pairwise(used):
        lo, hi = idx[a] + 1, idx[b]
        for j in range(lo, hi + 1):
            credit[j] = -float(price[b]) * path.ev_cost[j]
        scored = any(events[j].type == _OBSERVATION for j in range(lo, hi + 1))
        # a score's change goes to the work it scored: everything since the previous score
        first = last_reward + 1 if scored else lo
        acts = [j for j in range(first, hi + 1) if events[j].type != _OBSERVATION] or list(range(lo, hi + 1))
        dv = float(v[b] - v[a])
        for j, share in zip(acts, _shares(events, acts, split), strict=True):
            credit[j] = (credit[j] or 0.0) + dv * share
        for j in range(lo, hi + 1):
            if events[j].type == _OBSERVATION:
                last_reward = j
    return credit


def _ablation(
    reader: _Reader,
    trace: Trace,
    path: _Path,
    snapshots: Sequence[tuple[int, RunState]],
    point: npt.NDArray[np.int64],
) -> list[float | None]:
    credit: list[float | None] = [None] * len(trace.events)
    if not snapshots:
        return credit
    unit = reader.policy.cost_unit
    rows, turns, costs = [], [], []
    for i, before in snapshots:
        # the prefix up to the decision point after event i, without i: the state before i, then the rest
        before.fold_many(trace.events[i + 1 : path.idx[int(point[i])] + 1])
        rows.append(before.features())
        turns.append(before.turn)
        costs.append(cost_so_far(before, unit))
    without, _, _, _ = reader.read(np.vstack(rows), turns, costs)
    for (i, _), v_without in zip(snapshots, without, strict=True):
        t = int(point[i])
        credit[i] = float(path.v[t] - v_without) - float(path.price[t]) * path.ev_cost[i]
    return credit


# --------------------------------------------------------------------------- aggregates


def _key(e: EventCredit, by: str, trace_id: str) -> tuple[str, ...]:
    if by == "event":
        return (trace_id, str(e.index), e.event_id, e.type, e.agent)
    if by == "agent":
        return (e.agent,)
    if by == "role":
        return (e.role or "-",)
    if by == "type":
        return (e.type,)
    return (e.agent, e.type)


_KEY_NAMES: Final[Mapping[str, tuple[str, ...]]] = {
    "event": ("trace_id", "index", "event_id", "type", "agent"),
    "agent": ("agent",),
    "role": ("role",),
    "type": ("type",),
    "agent_type": ("agent", "type"),
}


def aggregate(reports: Iterable[TraceCredit], by: str) -> list[dict[str, Any]]:
    """Credit summed by ``by`` (one of :data:`GROUPINGS`) over the credited events of ``reports``.

    Each row: the key fields, ``events`` (credited), ``traces`` (holding one), ``credit``
    (sum), ``mean`` (per event), ``per_trace`` (sum over the traces holding one) and, when
    the traces carry the offline label, ``contribution`` (its sum). Largest credit first.
    """
    if by not in GROUPINGS:
        raise ConfigError(f"by: expected one of {', '.join(GROUPINGS)}, got {by!r}")
    sums: dict[tuple[str, ...], list[float]] = {}
    traces: dict[tuple[str, ...], set[str]] = {}
    labelled: dict[tuple[str, ...], bool] = {}
    for report in reports:
        for e in report.events:
            if e.credit is None:
                continue
            key = _key(e, by, report.trace_id)
            acc = sums.setdefault(key, [0.0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += e.credit
            acc[2] += e.contribution or 0.0
            traces.setdefault(key, set()).add(report.trace_id)
            labelled[key] = labelled.get(key, False) or e.contribution is not None
    rows = []
    for key, (count, total, truth) in sums.items():
        row: dict[str, Any] = dict(zip(_KEY_NAMES[by], key, strict=True))
        if by == "event":
            row["index"] = int(row["index"])
        n_traces = len(traces[key])
        row.update(
            events=int(count), traces=n_traces, credit=total, mean=total / count, per_trace=total / n_traces
        )
        if labelled[key]:
            row["contribution"] = truth
        rows.append(row)
    if by != "event":
        rows.sort(key=lambda r: -r["credit"])
    return rows


# --------------------------------------------------------------------------- CLI


def _fmt(x: float | None, digits: int = 4) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:+.{digits}f}"


def _aggregate_table(by: str, rows: Sequence[Mapping[str, Any]], limit: int | None) -> str:
    from stopserve.training.fit import _table  # the trainer's plain-text table (CLI output only)

    names = list(_KEY_NAMES[by])
    labelled = any("contribution" in r for r in rows)
    head = [*names, "events", "credit", "mean", "per trace", *(["contribution"] if labelled else [])]
    body = []
    for r in rows[:limit] if limit else rows:
        body.append(
            [
                *(str(r[k]) for k in names),
                str(r["events"]),
                _fmt(r["credit"]),
                _fmt(r["mean"]),
                _fmt(r["per_trace"]),
                *([_fmt(r.get("contribution"))] if labelled else []),
            ]
        )
    more = (
        f"\n... {len(rows) - limit} more rows (--json or --csv for all)"
        if limit and len(rows) > limit
        else ""
    )
    return _table([tuple(head), *(tuple(row) for row in body)]) + more


def _timeline_table(report: TraceCredit) -> str:
    from stopserve.training.fit import _table

    at_point = {p.index: p for p in report.values}
    labelled = any(e.contribution is not None for e in report.events)
    head = [
        "#",
        "event",
        "type",
        "agent",
        "tokens",
        "V after",
        "credit",
        *(["contribution"] if labelled else []),
    ]
    body = []
    for e in report.events:
        p = at_point.get(e.index)
        body.append(
            [
                str(e.index),
                e.event_id,
                e.type,
                e.agent,
                str(e.tokens),
                f"{p.v:.4f}" if p is not None else "",
                _fmt(e.credit),
                *([_fmt(e.contribution)] if labelled else []),
            ]
        )
    start = report.values[0]
    return f"V(s_0) = {start.v:.4f} before any event\n" + _table([tuple(head), *(tuple(r) for r in body)])


_CSV_FIELDS: Final = (
    "trace_id", "index", "event_id", "type", "agent", "role", "tokens", "cost", "point", "v_before",
    "v_after", "credit", "contribution",
)  # fmt: skip


def _write_csv(path: Path, reports: Sequence[TraceCredit]) -> None:
    try:
        fh = path.open("w", newline="")
    except OSError as exc:
        raise TrainingError(f"{path}: cannot write: {exc.strerror or exc}") from exc
    with fh:
        writer = csv.writer(fh)
        writer.writerow(_CSV_FIELDS)
        for r in reports:
            for e in r.events:
                writer.writerow(
                    [
                        r.trace_id, e.index, e.event_id, e.type, e.agent, e.role or "", e.tokens,
                        repr(e.cost), e.point or "", _num(e.v_before), _num(e.v_after), _num(e.credit),
                        _num(e.contribution),
                    ]
                )  # fmt: skip


def _num(x: float | None) -> str:
    return "" if x is None else repr(float(x))


def plot_timeline(report: TraceCredit, path: str | Path) -> None:
    """A PNG: V(s_t) along the run, and each event's credit as a bar coloured by agent."""
    from stopserve.plotting import pyplot, save

    plt = pyplot()
    agents = list(dict.fromkeys(e.agent for e in report.events))
    cmap = plt.get_cmap("tab10" if len(agents) <= 10 else "tab20")
    colour = {a: cmap(i % cmap.N) for i, a in enumerate(agents)}
    fig, (ax_v, ax_c) = plt.subplots(2, 1, figsize=(10, 6), sharex=True, height_ratios=(1, 1.2))
    xs = [p.index + 1 for p in report.values]  # x = events folded so far
    ax_v.step(xs, [p.v for p in report.values], where="post", color="black", label="V(s_t)")
    ax_v.plot(xs, [p.v for p in report.values], "o", color="black", markersize=3)
    ax_v.step(xs, [p.s for p in report.values], ":", where="post", color="grey", label="S (stop now)")
    ax_v.set_ylabel("value (quality units)")
    ax_v.legend(loc="best", fontsize=8)
    how = (
        report.method if report.method == "ablation" else f"td, split {report.split}, window {report.window}"
    )
    ax_v.set_title(f"{report.trace_id}\nvalue of the run, and credit per event ({how})", fontsize=9)
    credited = [e for e in report.events if e.credit is not None]
    ax_c.bar(
        [e.index + 1 for e in credited],
        [e.credit or 0.0 for e in credited],
        color=[colour[e.agent] for e in credited],
        width=0.8,
    )
    ax_c.axhline(0.0, color="black", linewidth=0.6)
    ax_c.set_ylabel("credit")
    ax_c.set_xlabel("events folded")
    from matplotlib.patches import Patch

    handles = [Patch(color=colour[a]) for a in agents]
    ax_c.legend(handles, agents, loc="best", fontsize=8, ncol=2)
    fig.tight_layout()
    save(fig, path)


def credit_report(
    traces: Sequence[str | Path],
    *,
    model: str | Path | None = None,
    method: str = "td",
    split: str = "tokens",
    window: str = "decision",
    baseline: str = "zero",
    lam: float | None = None,
    cost_share: float | None = None,
    by: str | None = None,
    trace_ids: Sequence[str] = (),
    types: str | None = None,
    last_k: int | None = None,
    as_json: bool = False,
    csv: str | None = None,
    plot: str | None = None,
    limit: int = 30,
    limit_traces: int = 3,
    show_progress: bool = False,
) -> int:
    """Credit every event of ``traces`` and print it (``stopserve credit``): tables, or one JSON
    object with ``as_json``; ``csv`` writes one row per event, ``plot`` a timeline of the first
    trace. ``by`` and ``types`` are comma lists; ``model`` None: the shipped default."""
    import orjson

    from stopserve.settings import default_model_dir

    model = model if model is not None else default_model_dir()
    if model is None:
        raise ModelError("no model given (--model) and no shipped default model found")
    policy = Policy.load(model)
    names = [b.strip().replace("-", "_") for b in by.split(",") if b.strip()] if by else None
    kinds = [t.strip() for t in types.split(",") if t.strip()] if types else None
    wanted = set(trace_ids)
    reports: list[TraceCredit] = []
    for trace in progress(read_traces(traces), desc="credit", unit=" traces", enabled=show_progress):
        if wanted and trace.trace_id not in wanted:
            continue
        reports.append(
            credit_trace(
                policy,
                trace,
                method=method,
                split=split,
                window=window,
                baseline=baseline,
                objective=Objective.of(lam, cost_share),
                types=kinds,
                last_k=last_k,
            )
        )
    if not reports:
        which = f" with trace id {', '.join(sorted(wanted))}" if wanted else ""
        raise TrainingError(f"no trace{which} in {', '.join(map(str, traces))}")
    if names is None:
        names = ["event", "agent"] if len(reports) == 1 else ["agent", "type"]
    aggregates = {b: aggregate(reports, b) for b in names}  # checks the names
    if csv:
        _write_csv(Path(csv), reports)
    if plot:
        plot_timeline(reports[0], plot)
    first = reports[0]
    head = {
        "model": str(model),
        "model_version": policy.model_version,
        "method": method,
        "split": split,
        "window": window,
        "baseline": baseline,
        "cost_unit": first.cost_unit,
        "lambda": first.lam,
        "cost_share": first.cost_share,
        "n_traces": len(reports),
        "n_events": sum(len(r.events) for r in reports),
    }
    if as_json:
        out: dict[str, Any] = {
            **head,
            "aggregates": {b: rows for b, rows in aggregates.items() if b != "event"},
        }
        if "event" in names:
            out["traces"] = [r.to_dict() for r in reports]
        sys.stdout.write(orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY).decode() + "\n")
        return 0
    if first.lam is not None:
        weight = f"lambda {first.lam:g} per {first.cost_unit}"
    elif policy.mean_behavior_cost is None:
        weight = f"cost share {first.cost_share:g} of each run's expected cost (per-run model)"
    else:
        mean = policy.mean_behavior_cost
        weight = f"cost share {first.cost_share:g} of the mean run cost {mean:g} {first.cost_unit}"
    how = method if method == "ablation" else f"td, split {split}, window {window}"
    print(
        f"credit ({how}, baseline {baseline}) of {head['n_events']} events in {len(reports)} "
        f"trace(s); model {policy.model_version or model}; {weight}"
    )
    for b in names:
        print()
        if b == "event":
            for r in reports[:limit_traces]:
                print(f"trace {r.trace_id}")
                print(_timeline_table(r))
            if len(reports) > limit_traces:
                print(f"... {len(reports) - limit_traces} more traces (--json or --csv for all)")
            continue
        print(f"by {b.replace('_', ', ')}")
        print(_aggregate_table(b, aggregates[b], limit))
    if csv:
        print(f"\nwrote {sum(len(r.events) for r in reports)} event rows to {csv}", file=sys.stderr)
    if plot:
        print(f"wrote the timeline of {first.trace_id} to {plot}", file=sys.stderr)
    return 0
