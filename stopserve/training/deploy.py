"""Drive a live service with logged or simulated runs, event by event, as an orchestrator would.

Each run is a trace that holds more than any policy will use of it: a simulator run to its
cap with every prefix graded (``stopserve simulate --run-to-cap``), or a real run as it was
logged. The driver sends its events to ``POST /v1/decide:batch`` one decision point at a
time (the events since the last call, up to and including the next decision point), many
runs side by side; a run the service stops is cut there and its outcome is what the run
had at that point; a run it never stops goes on to its logged end. The outcome is
posted, so the service logs each run as a trace, exactly as a deployment would.

Because the trace holds every prefix, the value of any stop is known exactly
(:func:`prefix_values`): ``q − λ·c`` right after that event, ``q`` the latest grade (0
before any), or the run's logged end for a run that is never stopped. That is the ruler of
the deployment simulator (``bench/bench_learning.py``): the served value, the behavior's
(the run's own stop, ``metrics.behavior_stop_index``) and the optimum's
(``metrics.optimal_value``) on the same runs.

>>> served = drive("http://127.0.0.1:8080", traces, lam=0.1)        # doctest: +SKIP
>>> sum(s.value for s in served) / len(served)                      # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import httpx

from stopserve.errors import StopServeError
from stopserve.objective import event_cost
from stopserve.trace import DECISION_POINT_TYPES

__all__ = ["Served", "drive", "end_value", "prefix_values", "run_cost", "stop_value"]

#: Runs decided side by side in one batch request.
BATCH: Final = 200
#: Events one batch request carries at most (the service's default limit).
MAX_REQUEST_EVENTS: Final = 2000
_LABEL_CHANNEL: Final = "quality"
_RUN_ID_CHARS: Final = re.compile(r"[^A-Za-z0-9._:@+-]")


@dataclass(frozen=True, slots=True)
class Served:
    """One run as the service served it."""

    trace_id: str
    run_id: str
    #: the event after which the service stopped it; None: it went on to its logged end
    stop_event: int | None
    value: float
    explored: bool
    decisions: int
    turn: int


def _is_point(ev: Mapping[str, Any]) -> bool:
    return ev["type"] in DECISION_POINT_TYPES or (ev["type"] == "stop" and bool(ev.get("proposed")))


def _cost(ev: Mapping[str, Any], unit: str) -> float:
    # elapsed time is read from t, not summed (seconds: 0 here)
    return event_cost(unit, tokens=float(ev.get("tokens") or 0), usd=float(ev.get("usd") or 0.0), seconds=0.0)


def prefix_values(
    trace: Mapping[str, Any], lam: float, *, cost_unit: str = "ktokens", labels_from_rewards: bool = False
) -> list[float]:
    """The value of stopping right after each event: ``q − λ·c`` (the labels' conventions).

    ``q`` is the latest ``grade`` so far (with ``labels_from_rewards``, else the latest
    reward on channel ``quality``), 0 before any; ``c`` the cost so far in ``cost_unit``.
    """
    q = 0.0
    grade: float | None = None
    reward: float | None = None
    c = 0.0
    out: list[float] = []
    for ev in trace["events"]:
        c = float(ev["t"]) if cost_unit == "seconds" else c + _cost(ev, cost_unit)
        if ev.get("grade") is not None:
            grade = float(ev["grade"])
        if (
            ev["type"] == "reward"
            and ev.get("value") is not None
            and (ev.get("channel") or _LABEL_CHANNEL) == _LABEL_CHANNEL
        ):
            reward = float(ev["value"])
        q = grade if grade is not None else (reward if labels_from_rewards and reward is not None else 0.0)
        out.append(q - lam * c)
    return out


def end_value(
    trace: Mapping[str, Any], lam: float, *, cost_unit: str = "ktokens", labels_from_rewards: bool = False
) -> float:
    """The value of the run's logged end: final quality (grade, reward, ``rewards.team``) less its cost."""
    events = trace["events"]
    grade = next((float(e["grade"]) for e in reversed(events) if e.get("grade") is not None), None)
    reward = next(
        (
            float(e["value"])
            for e in reversed(events)
            if e["type"] == "reward"
            and e.get("value") is not None
            and (e.get("channel") or _LABEL_CHANNEL) == _LABEL_CHANNEL
        ),
        None,
    )
    team = trace.get("rewards", {}).get("team")
    q = (
        grade
        if grade is not None
        else reward
        if labels_from_rewards and reward is not None
        else float(team or 0.0)
    )
    return q - lam * run_cost(trace, cost_unit)


def stop_value(
    trace: Mapping[str, Any],
    stop_event: int | None,
    lam: float,
    *,
    cost_unit: str = "ktokens",
    labels_from_rewards: bool = False,
) -> float:
    """The exact value of stopping after event ``stop_event`` (None: the logged end)."""
    if stop_event is None:
        return end_value(trace, lam, cost_unit=cost_unit, labels_from_rewards=labels_from_rewards)
    return prefix_values(trace, lam, cost_unit=cost_unit, labels_from_rewards=labels_from_rewards)[stop_event]


def run_cost(trace: Mapping[str, Any], cost_unit: str = "ktokens") -> float:
    """The whole run's cost in ``cost_unit``."""
    events = trace["events"]
    return float(events[-1]["t"]) if cost_unit == "seconds" else sum(_cost(e, cost_unit) for e in events)


def _quality(trace: Mapping[str, Any], upto: int, labels_from_rewards: bool) -> float:
    """The quality a run cut after event ``upto`` hands back (its final reward)."""
    grade: float | None = None
    reward: float | None = None
    for ev in trace["events"][: upto + 1]:
        if ev.get("grade") is not None:
            grade = float(ev["grade"])
        if ev["type"] == "reward" and ev.get("value") is not None:
            reward = float(ev["value"])
    if grade is not None:
        return grade
    return reward if labels_from_rewards and reward is not None else 0.0


@dataclass
class _Live:
    trace: Mapping[str, Any]
    run_id: str
    cursor: int = 0
    decisions: int = 0
    explored: bool = False
    turn: int = 0


def _run_id(wanted: str, used: set[str]) -> str:
    """``wanted`` as a run id the service takes (letters, digits, ``. _ : @ + -``, at most 256), unique."""
    rid = _RUN_ID_CHARS.sub("_", wanted)
    if rid != wanted or len(rid) > 256:
        rid = f"{rid[:200]}-{hashlib.sha1(wanted.encode()).hexdigest()[:12]}"
    base, k = rid, 1
    while rid in used:
        rid, k = f"{base}.{k}", k + 1
    used.add(rid)
    return rid


def _next_call(run: _Live) -> tuple[list[dict[str, Any]], bool] | None:
    """The events up to the next decision point, and whether it is a proposed stop; None: none left."""
    events = run.trace["events"]
    for k in range(run.cursor, len(events)):
        if _is_point(events[k]):
            sent = [dict(e) for e in events[run.cursor : k + 1]]
            run.cursor = k + 1
            return sent, events[k]["type"] == "stop"
    return None


def drive(
    url: str,
    traces: Iterable[Mapping[str, Any]],
    *,
    lam: float | None = None,
    cost_share: float | None = None,
    value_lambda: float | None = None,
    cost_unit: str = "ktokens",
    labels_from_rewards: bool = False,
    run_prefix: str = "",
    system: str | None = None,
    batch: int = BATCH,
    max_events: int = MAX_REQUEST_EVENTS,
    client: httpx.Client | None = None,
    timeout: float = 60.0,
) -> list[Served]:
    """Serve every trace through the service at ``url``; each run's stop and its exact value.

    ``lam`` or ``cost_share`` is sent with each run (what the orchestrator tells the
    service); ``value_lambda`` (default ``lam``) is what a stop is valued at. Run ids are
    ``run_prefix + trace_id`` (other characters than a run id takes become ``_``, with a
    short hash of the whole id); ``system`` replaces the traces' own. A request carries at most
    ``batch`` runs and ``max_events`` events (the service's ``STOPSERVE_MAX_EVENTS_PER_REQUEST``).
    """
    weight = value_lambda if value_lambda is not None else lam
    if weight is None or not math.isfinite(weight):
        raise StopServeError("drive: give value_lambda (what a stop is worth) with a cost share")
    own = client is None
    http = client if client is not None else httpx.Client(base_url=url, timeout=timeout)
    queue = list(traces)
    queue.reverse()
    used: set[str] = set()
    live: list[_Live] = []
    served: list[Served] = []
    try:
        while queue or live:
            while queue and len(live) < batch:
                tr = queue.pop()
                live.append(_Live(tr, _run_id(run_prefix + str(tr["trace_id"]), used)))
            items: list[dict[str, Any]] = []
            asked: list[_Live] = []
            ended: list[_Live] = []
            n_events = 0
            for run in live:
                start = run.cursor
                nxt = _next_call(run)
                if nxt is None:
                    ended.append(run)
                    continue
                events, proposed = nxt
                if items and n_events + len(events) > max_events:
                    run.cursor = start  # a request carries at most max_events: this run waits for the next
                    continue
                n_events += len(events)
                item: dict[str, Any] = {"run_id": run.run_id, "events": events, "proposed_stop": proposed}
                if run.decisions == 0:
                    tr = run.trace
                    item.update(
                        task_id=tr.get("task_id"),
                        topology=tr.get("topology"),
                        system=system or tr.get("system"),
                        budget=tr.get("budget"),
                    )
                    if lam is not None:
                        item["lambda"] = lam
                    elif cost_share is not None:
                        item["cost_share"] = cost_share
                items.append({k: v for k, v in item.items() if v is not None})
                asked.append(run)
            stopped: list[_Live] = []
            if items:
                answer = http.post(f"{url}/v1/decide:batch", json={"runs": items})
                if answer.status_code != 200:
                    raise StopServeError(f"decide:batch answered {answer.status_code}: {answer.text[:2000]}")
                for run, result in zip(asked, answer.json()["results"], strict=True):
                    if result["error"] is not None:
                        raise StopServeError(f"run {run.run_id}: {result['error']['message']}")
                    d = result["decision"]
                    run.decisions += 1
                    run.explored = run.explored or bool(d.get("explored"))
                    run.turn = int(d["turn"])
                    if d["action"] == "stop":
                        stopped.append(run)
            for run in stopped:
                at = run.cursor - 1
                q = _quality(run.trace, at, labels_from_rewards)
                _post(http, url, run.run_id, {"rewards": {"team": q}})
                value = stop_value(
                    run.trace, at, weight, cost_unit=cost_unit, labels_from_rewards=labels_from_rewards
                )
                served.append(
                    Served(
                        str(run.trace["trace_id"]),
                        run.run_id,
                        at,
                        value,
                        run.explored,
                        run.decisions,
                        run.turn,
                    )
                )
            for run in ended:
                tr = run.trace
                rest = [dict(e) for e in tr["events"][run.cursor :]]
                body: dict[str, Any] = {"rewards": dict(tr.get("rewards") or {"team": 0.0}), "events": rest}
                if tr.get("stop") is not None:
                    body["stop"] = tr["stop"]
                _post(http, url, run.run_id, body)
                value = end_value(tr, weight, cost_unit=cost_unit, labels_from_rewards=labels_from_rewards)
                served.append(
                    Served(
                        str(tr["trace_id"]), run.run_id, None, value, run.explored, run.decisions, run.turn
                    )
                )
            done = {id(r) for r in (*stopped, *ended)}
            live = [r for r in live if id(r) not in done]
    finally:
        if own:
            http.close()
    return served


def _post(http: httpx.Client, url: str, run_id: str, body: Mapping[str, Any]) -> None:
    answer = http.post(f"{url}/v1/runs/{run_id}/outcome", json=body)
    if answer.status_code >= 400:
        raise StopServeError(f"run {run_id}: outcome refused ({answer.status_code}): {answer.text[:300]}")


def served_table(served: Sequence[Served]) -> dict[str, float]:
    """Mean value, share stopped, share explored of served runs."""
    n = max(len(served), 1)
    return {
        "runs": float(len(served)),
        "value": sum(s.value for s in served) / n,
        "stopped": sum(s.stop_event is not None for s in served) / n,
        "explored": sum(s.explored for s in served) / n,
    }
