"""Per-topology share of the behavior→optimum gap a policy closes, and its failure modes.

Issue 7's end-to-end figure, measured exactly on ``--run-to-cap --optimal``
simulator traces: every prefix is graded, so the logging behavior's stop
(``metrics.behavior_stop_index``), the policy's first stop and the optimum
(``metrics.optimal_value``) are all valued by truncation of the same run::

    python -m stopserve.cli.gap_report MODEL_DIR TEST.jsonl --lambda 0.1 [--json]

The value of a stop right after event k is ``q - lam * ktokens``: q the grade of
the latest ``aggregate`` at or before k (0 before any), ktokens the tokens up to
and including k. Failure modes are :func:`stopserve.training.simulate.failure_modes`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from stopserve.errors import TrainingError
from stopserve.features import RunState
from stopserve.objective import Objective
from stopserve.policy import Policy
from stopserve.trace import Trace, is_decision_point
from stopserve.training.simulate import failure_modes

__all__ = ["FAILURE_MODES", "gap_report"]

FAILURE_MODES = ("premature", "delayed", "loop")


def _replay(policy: Policy, trace: Trace, lam: float) -> tuple[int, list[float]]:
    """The policy's stop index (else the behavior's logged end) and the value after every event."""
    state = RunState(topology=trace.topology, budget=trace.budget)
    values: list[float] = []
    q = 0.0
    tokens = 0
    stop: int | None = None
    last = len(trace.events) - 1
    for k, ev in enumerate(trace.events):
        state.fold(ev)
        tokens += ev.tokens or 0
        if ev.type == "aggregate" and ev.grade is not None:
            q = ev.grade
        values.append(q - lam * tokens / 1000.0)
        if stop is None and k < last and is_decision_point(ev):
            proposed = ev.type == "stop" and bool(ev.proposed)
            if policy.decide(state, objective=Objective(lam=lam), proposed_stop=proposed).action == "stop":
                stop = k
    # never stopped: the run's cap (its last event before the final stop)
    return (last - 1 if stop is None else stop), values


def gap_report(policy: Policy, traces: Iterable[Trace], lam: float) -> dict[str, dict[str, float]]:
    """Per topology (and ``pooled``): mean values, gap closed and failure-mode rates."""
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for trace in traces:
        m = trace.metrics or {}
        if m.get("run_to_cap") != 1.0 or "optimal_value" not in m or "behavior_stop_index" not in m:
            raise TrainingError(
                f"trace {trace.trace_id!r}: needs simulate --run-to-cap --optimal "
                "(metrics run_to_cap, optimal_value, behavior_stop_index)"
            )
        if abs(float(m.get("optimal_lambda", lam)) - lam) > 1e-12:
            raise TrainingError(
                f"trace {trace.trace_id!r}: optimum at lambda {m.get('optimal_lambda')}, asked {lam}"
            )
        stop, values = _replay(policy, trace, lam)
        behavior = int(m["behavior_stop_index"])
        raw = trace.model_dump(mode="json")
        for key in (str(trace.topology), "pooled"):
            s = sums[key]
            s["n"] += 1
            s["behavior"] += values[behavior]
            s["learned"] += values[stop]
            s["optimal"] += float(m["optimal_value"])
            s["run_to_cap"] += values[-2] if len(values) > 1 else values[-1]
            for who, k in (("behavior", behavior), ("learned", stop)):
                for mode, hit in failure_modes(raw, k).items():
                    s[f"{who}_{mode}"] += float(hit)
    out: dict[str, dict[str, float]] = {}
    for key in sorted(sums, key=lambda t: (t == "pooled", t)):
        s = sums[key]
        n = s["n"]
        row = {k: v / n for k, v in s.items() if k != "n"}
        row["n"] = n
        gap = row["optimal"] - row["behavior"]
        row["gap_closed"] = (row["learned"] - row["behavior"]) / gap if gap > 0 else float("nan")
        out[key] = row
    return out
