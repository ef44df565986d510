"""Replays of served policies: every figure about a policy comes from its own ``decide``.

A replay walks each logged trace with the live featurizer (:func:`fold_events`), asks
each policy's :meth:`~stopserve.policy.Policy.decide` at every decision point, exactly as
the service would (proposed stops, safety nets and ``min_turns`` included), and
truncates the run at the policy's first stop. The value there is ``q_t − λ·c_t`` from
the decision points' labels; a run the policy never stops gets its logged end.

>>> stops = replay_decide(traces, dp, lambda i: [policy], objective=Objective(lam=0.3))  # doctest: +SKIP
>>> replay_rows(dp, stops[0], lam=0.3).mean_value                    # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import numpy as np

from stopserve.errors import TrainingError
from stopserve.features import RunState
from stopserve.objective import Objective
from stopserve.policy import Policy
from stopserve.progress import progress as _progress
from stopserve.trace import Trace
from stopserve.training.heuristics import Replay
from stopserve.training.labels import DecisionPoints, FloatArray, IntArray, fold_events

__all__ = ["REPLAY_ENGINE", "replay_decide", "replay_rows", "replay_stops"]

#: How offline replays (``stopserve train``'s folds, ``stopserve evaluate``, the gap report)
#: evaluate boosters: LightGBM's predict. They decide each run only until its first stop, a few
#: thousand to tens of thousands of rows once, and compiling a model's boosters costs seconds
#: (32 s for the folds of a 51,755-point training) against the fraction of that it saves. The
#: scores are the same to the last bit (tests/test_inference.py); the service compiles.
REPLAY_ENGINE: Final = "lightgbm"
#: Rows per batch predict in a replay (a copy of this many feature rows at a time).
BATCH_ROWS: Final = 1 << 16


def replay_decide(
    traces: Iterable[Trace],
    dp: DecisionPoints,
    policies_for: Callable[[int], Sequence[Any]],
    *,
    objective: Objective | None = None,
    progress: bool = False,
) -> IntArray:
    """The row of each policy's first stop in each trace, shape (policies, traces); -1: none.

    ``policies_for(i)`` gives the policies replayed on trace ``i`` (the same number for
    every trace: e.g. the fold's learned policy and the fold's tuned heuristics), the same
    objects on every call. ``dp`` must hold the decision points of the same traces in the
    same order; the learned policies' boosters are batch-predicted on ``dp.X``.
    """
    return replay_stops(traces, dp.offsets, policies_for, objective=objective, progress=progress, X=dp.X)


def _batch_scores(
    X: FloatArray,  # noqa: N803
    offsets: IntArray,
    policies_for: Callable[[int], Sequence[Any]],
) -> dict[int, tuple[Any, FloatArray]]:
    """Each learned policy's raw scores for the rows of the traces it is replayed on.

    Keyed by ``id`` of the replayed object (a :class:`~stopserve.policy.Policy`, or a
    wrapper that keeps one in ``.policy``), which is kept alive beside its scores; rows
    of other traces are NaN. One batch predict per policy instead of a single-row
    predict per decision point: the same trees summed the same way, so the same scores
    (tests/training/test_replay.py).
    """
    n_traces = int(offsets.shape[0] - 1)
    replayed: dict[int, tuple[Any, Policy, list[int]]] = {}
    for i in range(n_traces):
        for p in policies_for(i):
            policy = getattr(p, "policy", p)
            if isinstance(policy, Policy) and policy.inference is not None:
                replayed.setdefault(id(p), (p, policy, []))[2].append(i)
    counts = np.diff(offsets)
    out: dict[int, tuple[Any, FloatArray]] = {}
    done: dict[tuple[int, bytes], FloatArray] = {}
    for key, (p, policy, traces) in replayed.items():
        mask = np.zeros(n_traces, dtype=bool)
        mask[traces] = True
        # wrappers of one policy on the same traces (a λ sweep) share one prediction
        memo = (id(policy), np.packbits(mask).tobytes())
        if memo not in done:
            rows = np.flatnonzero(np.repeat(mask, counts))
            table = np.full((X.shape[0], policy.raw_rows(X[:0]).shape[1]), np.nan)
            for at in range(0, rows.shape[0], BATCH_ROWS):  # bounded copies of X
                chunk = rows[at : at + BATCH_ROWS]
                table[chunk] = policy.raw_rows(X[chunk])
            done[memo] = table
        out[key] = (p, done[memo])
    return out


def replay_stops(
    traces: Iterable[Trace],
    offsets: IntArray,
    policies_for: Callable[[int], Sequence[Any]],
    *,
    objective: Objective | None = None,
    progress: bool = False,
    X: FloatArray | None = None,  # noqa: N803
) -> IntArray:
    """:func:`replay_decide` given only the traces' row ``offsets`` (``DecisionPoints.offsets``).

    A part of the traces replays on its own: with its own offsets (from 0) it gives its
    traces' stop rows counted from its first row (``stopserve.training.distributed``).
    With ``X``, the decision points' feature rows (``DecisionPoints.X``), the learned
    policies' boosters are batch-predicted once and ``decide`` gets each row's scores;
    a row whose live features differ from ``X`` bit for bit is scored by ``decide``
    itself, so the answers are those of the service either way.
    """
    n_traces = int(offsets.shape[0] - 1)
    scores = {} if X is None else _batch_scores(X, offsets, policies_for)
    out: IntArray | None = None
    iterator = _progress(traces, total=n_traces, desc="replay", unit=" traces", enabled=progress)
    n = 0
    for i, trace in enumerate(iterator):
        if i >= n_traces:
            raise TrainingError(f"replay: more traces than decision points were built for ({n_traces})")
        policies = policies_for(i)
        if out is None:
            out = np.full((len(policies), n_traces), -1, dtype=np.int64)
        running = list(range(len(policies)))
        state = RunState(topology=trace.topology, budget=trace.budget)
        row = int(offsets[i])
        for ev, is_row in fold_events(trace, state):
            if not is_row:
                continue
            if running:
                proposed = ev.type == "stop" and bool(ev.proposed)
                same: bool | None = None  # the live features are X[row], bit for bit
                still = []
                for j in running:
                    scored = scores.get(id(policies[j]))
                    if scored is not None and same is None:
                        same = state.features().tobytes() == X[row].tobytes()  # type: ignore[index]
                    d = policies[j].decide(
                        state,
                        objective=objective,
                        proposed_stop=proposed,
                        raw=scored[1][row] if scored is not None and same else None,
                    )
                    if d.action == "stop":
                        out[j, i] = row
                    else:
                        still.append(j)
                running = still
            row += 1
        if row != offsets[i + 1]:
            raise TrainingError(
                f"replay: trace {trace.trace_id!r} has {row - int(offsets[i])} decision points, "
                f"{int(offsets[i + 1] - offsets[i])} were built: not the same traces"
            )
        n += 1
    if out is None or n != n_traces:
        raise TrainingError(f"replay: {n} traces given, decision points hold {n_traces}")
    return out


def replay_rows(dp: DecisionPoints, stop_rows: IntArray, lam: float) -> Replay:
    """Per-trace outcome of stopping at ``stop_rows`` (one per trace, -1: the logged end)."""
    rows = np.asarray(stop_rows, dtype=np.int64)
    if rows.shape != (dp.n_traces,):
        raise TrainingError(f"stop rows have shape {rows.shape}, expected ({dp.n_traces},)")
    stopped = rows >= 0
    at = np.where(stopped, rows, 0)
    q = np.where(stopped, dp.q[at], dp.trace_q_final)
    c = np.where(stopped, dp.c[at], dp.trace_c_final)
    return Replay(value=q - lam * c, q=q, c=c, stop_row=rows, stopped=stopped)
