"""Truncation replay of stop policies on held-out traces, and ``stopserve evaluate``.

Every policy is replayed through its own ``Policy.decide`` on each decision point's live
:class:`~stopserve.features.RunState` (:mod:`stopserve.training.replay`), as the service
would run it: proposed stops, safety nets and ``min_turns`` included. A policy stops a
run at its first stop decision; its value there is ``q_t − λ·c_t``; a run it never stops
gets the logged end (nothing can be replayed past what was logged). Policies compared
(``../shared/spec/evaluation-protocol.md``):

- ``behavior``: the run as logged, to its end;
- each tuned heuristic (:mod:`stopserve.training.heuristics`), tuned on ``tune_on``
  traces and never on the evaluated ones; without them, cross-fitted by group (each
  trace's heuristic is tuned on the other folds) -- the report says which;
- ``learned``: the model directory's policy (a learned model, or the heuristic it
  shipped instead: the report says which);
- ``oracle``: hindsight, the best ``R_stop(t)`` of each trace (its logged end included);
- ``optimal``: the simulator's Bayes-optimal value, when every trace carries
  ``metrics.optimal_value`` at this λ.

λ is absolute (``lam``, per cost unit) or a cost share s: λ = s / the mean cost of a
behavior run, per data set, from the ``tune_on`` traces (the training side) when given,
else from the evaluated ones. The policy is told what a user would tell it (``lambda``
or ``cost_share``); the value is measured at the set's λ.

Evaluation is *exact* when every trace ran to its cap with every prefix graded
(``metrics.run_to_cap == 1``); otherwise a policy that would have continued past the
logged end is credited with the logged end, a lower bound for it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from stopserve.features import RunState
from stopserve.objective import DEFAULT_OBJECTIVE, Objective
from stopserve.policy import Policy
from stopserve.trace import Trace
from stopserve.training.backend import Backend, LocalBackend, TraceSource
from stopserve.training.heuristics import (
    HEURISTICS,
    FamilyRanking,
    HeuristicRule,
    Replay,
    TunedHeuristic,
    cross_fit_heuristics,
    oracle_mask,
    rank_families,
    tune_heuristics,
)
from stopserve.training.heuristics import replay as replay_mask
from stopserve.training.labels import DecisionPoints, FloatArray
from stopserve.training.replay import replay_rows

__all__ = ["LAMBDA_SWEEP", "evaluate", "pareto_figure", "plot_pareto", "report_table"]

#: Multiples of λ (or of the cost share) the learned policy is swept over for the Pareto chart.
LAMBDA_SWEEP: Final[tuple[float, ...]] = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 10.0, 30.0)
#: Points of each heuristic's parameter sweep (each replayed through ``decide``).
SWEEP_POINTS: Final = 10
N_BOOT: Final = 1000


class _Fixed:
    """A policy replayed at its own objective, whatever the replay passes."""

    def __init__(self, policy: Policy, objective: Objective) -> None:
        self.policy, self.objective = policy, objective

    def decide(self, state: RunState, **kw: Any) -> Any:
        kw.update(objective=self.objective)
        return self.policy.decide(state, **kw)


def _metrics(
    rep: dict[str, Replay],
    groups: npt.NDArray[np.str_],
    *,
    best_heuristic: str,
    optimal: FloatArray | None,
    n_boot: int,
    seed: int,
) -> dict[str, dict[str, Any]]:
    """Point estimates and group-bootstrap 95% intervals of every policy's figures."""
    _, gid = np.unique(groups, return_inverse=True)
    n_groups = int(gid.max()) + 1
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), size=n_boot).astype(np.float64)
    counts = np.bincount(gid, minlength=n_groups).astype(np.float64)
    # row 0 is the point estimate (every group once), the rest are bootstrap draws
    weights = np.vstack([np.ones(n_groups), weights])
    denom = weights @ counts

    def draw(per_trace: FloatArray) -> FloatArray:
        result: FloatArray = (weights @ np.bincount(gid, weights=per_trace, minlength=n_groups)) / denom
        return result

    series: dict[str, dict[str, FloatArray]] = {
        name: {"value": draw(r.value), "success": draw(r.q), "cost": draw(r.c)} for name, r in rep.items()
    }
    if optimal is not None:
        series["optimal"] = {"value": draw(optimal)}
    b, o, h = series["behavior"], series["oracle"], series[best_heuristic]
    gap = o["value"] - b["value"]
    room = o["value"] - h["value"]
    opt_gap = series["optimal"]["value"] - b["value"] if optimal is not None else None
    out: dict[str, dict[str, Any]] = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for name, s in series.items():
            figs: dict[str, FloatArray | None] = {
                "value": s["value"],
                "success": s.get("success"),
                "cost": s.get("cost"),
                "cost_saved": 1.0 - s["cost"] / b["cost"] if "cost" in s else None,
                "success_lost": b["success"] - s["success"] if "success" in s else None,
                "gap_closed": (s["value"] - b["value"]) / gap,
                "room_closed": (s["value"] - h["value"]) / room,
                "vs_heuristic": s["value"] - h["value"],
            }
            if opt_gap is not None:
                figs["gap_closed_optimal"] = (s["value"] - b["value"]) / opt_gap
            entry: dict[str, Any] = {}
            ci: dict[str, list[float] | None] = {}
            for key, arr in figs.items():
                if arr is None or not math.isfinite(float(arr[0])):
                    entry[key] = None
                    ci[key] = None
                    continue
                entry[key] = float(arr[0])
                draws = arr[1:][np.isfinite(arr[1:])]
                ci[key] = (
                    [float(np.quantile(draws, 0.025)), float(np.quantile(draws, 0.975))]
                    if draws.size
                    else None
                )
            entry["ci95"] = ci
            paired = (s["value"] - h["value"])[1:]
            entry["vs_heuristic_ci90"] = (
                [float(np.quantile(paired, 0.05)), float(np.quantile(paired, 0.95))] if paired.size else None
            )
            out[name] = entry
    return out


def _sweep_rules(dp: DecisionPoints, name: str, cost_unit: str) -> list[tuple[Any, TunedHeuristic]]:
    """A coarse parameter sweep of one single-net heuristic (for the Pareto chart)."""
    param = {"turn_cap": "turn_cap", "cost_cap": "cost_cap", "reward_threshold": "reward_threshold"}[name]
    source = {
        "turn_cap": dp.turn.astype(np.float64),
        "cost_cap": dp.c_raw,
        "reward_threshold": dp.latest_reward,
    }
    values = source[name][np.isfinite(source[name])]
    if values.size == 0:
        return []
    points = np.unique(np.quantile(values, np.linspace(0.0, 1.0, SWEEP_POINTS), method="nearest"))
    out = []
    for v in points:
        x: Any = int(v) if param == "turn_cap" else float(v)
        if param != "reward_threshold" and x <= 0:
            continue
        rule = HeuristicRule(**{param: x})
        out.append((x, TunedHeuristic(name, rule, math.nan, cost_unit, math.nan)))
    return out


def evaluate(
    model_policy: Policy | None,
    traces: Iterable[Trace] | Sequence[str | Path] | TraceSource,
    *,
    objective: Objective | None = None,
    tune_on: Iterable[Trace] | Sequence[str | Path] | TraceSource | None = None,
    cost_unit: str | None = None,
    labels_from_rewards: bool = False,
    group_by: str = "task",
    seed: int = 0,
    folds: int = 5,
    n_boot: int = N_BOOT,
    sweep: bool = False,
    progress: bool = False,
    backend: Backend | None = None,
) -> dict[str, Any]:
    """Replay every policy on the evaluated traces; return the report as JSON-ready data.

    ``model_policy`` is a :class:`stopserve.policy.Policy` (or ``None`` to skip
    ``learned``). ``objective`` says what cost is worth (default: the model's; without a
    model :data:`~stopserve.objective.DEFAULT_OBJECTIVE`). ``sweep`` adds the Pareto sweeps
    (``report["sweeps"]``: the learned policy at multiples of its λ or cost share, each
    single-net heuristic over its parameter), every point replayed through ``decide``.
    ``backend`` (default in this process) builds the decision points and runs the
    replays, e.g. mapped over the partitions of a Dask cluster.
    """
    if objective is None:
        objective = model_policy.resolve(None) if model_policy is not None else DEFAULT_OBJECTIVE
    lam, cost_share = objective.lam, objective.cost_share
    notes: list[str] = []
    run = backend if backend is not None else LocalBackend()
    source = traces if isinstance(traces, TraceSource) else TraceSource(traces)
    tune_source = (
        None if tune_on is None else tune_on if isinstance(tune_on, TraceSource) else TraceSource(tune_on)
    )
    by_share = cost_share is not None
    unit = cost_unit
    if unit is None and model_policy is not None:
        unit = model_policy.cost_unit
    tune_dp: DecisionPoints | None = None
    scales: dict[str, float] | None = None
    if tune_source is not None:
        tune_dp = run.decision_points(
            tune_source,
            cost_unit=unit,
            labels_from_rewards=labels_from_rewards,
            group_by=group_by,
            progress=False,
            nets=None,
            normalize_cost=by_share,
        )
        unit = tune_dp.cost_unit
        scales = tune_dp.mean_costs()
    dp = run.decision_points(
        source,
        cost_unit=unit,
        labels_from_rewards=labels_from_rewards,
        group_by=group_by,
        progress=progress,
        nets=None,
        normalize_cost=by_share,
        cost_scales=scales,
    )
    # value weight: with a cost share, costs are normalised per data set and λ is the share
    value_lam = float(cost_share) if cost_share is not None else float(lam or 0.0)
    if cost_share is not None:
        means = scales if scales is not None else dp.mean_costs()
        notes.append(
            f"cost share {cost_share:g}: lambda per data set = share / mean behavior cost "
            f"({'tune-on' if scales is not None else 'evaluated'} traces): "
            + ", ".join(f"{d} {cost_share / m:.4g} per {dp.cost_unit}" for d, m in means.items() if m > 0)
        )

    # heuristics: tuned on the training side, or cross-fitted by group
    heuristic_params: dict[str, Any]
    if tune_dp is not None:
        tuned = tune_heuristics(tune_dp, value_lam)
        chosen = _train_choice(tune_dp, value_lam, folds, seed)
        tuning = f"tuned on {tune_dp.n_traces} --tune-on traces"
        heuristic_params = {name: h.to_dict() for name, h in tuned.items()}
        heur_for = [[tuned[h].policy() for h in HEURISTICS]]
        fold = np.zeros(dp.n_traces, dtype=np.int64)
    else:
        fold, per_fold = cross_fit_heuristics(dp, value_lam, folds=folds, seed=seed)
        chosen = _train_choice(dp, value_lam, folds, seed)
        k = len(per_fold)
        tuning = f"cross-fitted: tuned on the other {k - 1} of {k} folds grouped by {group_by}"
        notes.append(f"no --tune-on traces: heuristics {tuning}, never on the traces they are scored on")
        heuristic_params = {
            name: {"name": name, "parameter_per_fold": [f[name].parameter for f in per_fold]}
            for name in HEURISTICS
        }
        heur_for = [[f[h].policy() for h in HEURISTICS] for f in per_fold]

    extra: list[Any] = []
    sweep_meta: list[tuple[str, Any]] = []
    if sweep:
        if model_policy is not None:
            for m in LAMBDA_SWEEP:
                if by_share:
                    extra.append(_Fixed(model_policy, Objective(cost_share=float(cost_share or 0.0) * m)))
                else:
                    extra.append(_Fixed(model_policy, Objective(lam=float(lam or 0.0) * m)))
                sweep_meta.append(("learned", m))
        for name in ("turn_cap", "cost_cap", "reward_threshold"):
            for x, th in _sweep_rules(dp, name, dp.cost_unit):
                extra.append(th.policy())
                sweep_meta.append((name, x))
    learned = [] if model_policy is None else [model_policy]
    stops = run.replay(
        source,
        dp,
        lambda i: [*learned, *heur_for[int(fold[i])], *extra],
        progress=progress,
        objective=objective,
    )
    rep: dict[str, Replay] = {"behavior": replay_mask(dp, np.zeros(dp.n_rows, dtype=bool), value_lam)}
    j = 0
    kind = None
    if model_policy is not None:
        rep["learned"] = replay_rows(dp, stops[0], value_lam)
        kind = model_policy.kind
        j = 1
    for h in HEURISTICS:
        rep[h] = replay_rows(dp, stops[j], value_lam)
        j += 1
    rep["oracle"] = replay_mask(dp, oracle_mask(dp, value_lam), value_lam)

    optimal: FloatArray | None = None
    if np.isfinite(dp.optimal_value).all():
        # the optimum is comparable where it was solved at the λ this evaluation values at: the
        # λ given, or with a cost share each data set's share / mean behavior cost (ktokens)
        if by_share:
            means = scales if scales is not None else dp.mean_costs()
            lam_eval = np.asarray([value_lam / means.get(str(d), 1.0) for d in dp.dataset])
        else:
            lam_eval = np.full(dp.n_traces, value_lam)
        lam_ok = np.isfinite(dp.optimal_lambda).all() and bool(
            np.allclose(dp.optimal_lambda, lam_eval, rtol=1e-6, atol=1e-12)
        )
        if lam_ok and dp.cost_unit == "ktokens":
            optimal = dp.optimal_value
        else:
            notes.append(
                "traces carry metrics.optimal_value but at another lambda or cost unit "
                f"(optimal_lambda {np.unique(dp.optimal_lambda)[:3].tolist()}, asked "
                f"{np.unique(lam_eval)[:3].tolist()} per ktoken): 'optimal' not reported (simulate the "
                "evaluated traces with --optimal --lambda at the lambda evaluated: with a cost share, "
                "the share / the mean behavior cost of the --tune-on traces)"
            )
    elif np.isfinite(dp.optimal_value).any():
        notes.append("only some traces carry metrics.optimal_value: 'optimal' not reported")

    n_groups = int(np.unique(dp.group).size)
    if n_groups < 2:
        notes.append("a single group: bootstrap intervals are degenerate (zero width)")
    # the fair comparison is the family the training side chooses (repeated grouped CV); the
    # family that did best on these very traces is chosen in hindsight, and reported as such
    hindsight = max(HEURISTICS, key=lambda n: rep[n].mean_value)
    best_heuristic = chosen.best
    policies = _metrics(
        rep, dp.group, best_heuristic=best_heuristic, optimal=optimal, n_boot=n_boot, seed=seed
    )
    if model_policy is not None:
        policies["learned"]["kind"] = kind
        policies["learned"]["model_version"] = model_policy.model_version
        base = model_policy.manifest.base_rule
        policies["learned"]["rule"] = None if base is None else base.text
    exact = bool(dp.run_to_cap.all())
    if not exact:
        notes.append(
            "not exact: a policy that would continue past a trace's logged end is credited with the end"
        )

    report: dict[str, Any] = {
        "lambda": None if by_share else lam,
        "cost_share": cost_share,
        "value_lambda": value_lam,
        "cost_unit": dp.cost_unit,
        "cost_normalised": by_share,
        "n_traces": dp.n_traces,
        "n_decision_points": dp.n_rows,
        "n_groups": n_groups,
        "group_by": group_by,
        "exact": exact,
        "heuristic_tuning": tuning,
        "policies": policies,
        "best_heuristic": best_heuristic,
        "best_heuristic_choice": (
            f"the family the {'--tune-on traces' if tune_dp is not None else 'evaluated traces'} choose by "
            f"cross-validation ({chosen.scheme})"
        ),
        "best_heuristic_hindsight": hindsight,
        "heuristics": heuristic_params,
        "notes": notes,
    }
    if sweep:
        sweeps: dict[str, list[dict[str, Any]]] = {}
        for (name, x), rows in zip(sweep_meta, stops[j:], strict=True):
            r = replay_rows(dp, rows, value_lam)
            key = "multiple" if name == "learned" else "parameter"
            sweeps.setdefault(name, []).append(
                {key: x, "success": float(r.q.mean()), "cost": float(r.c.mean()), "value": r.mean_value}
            )
        report["sweeps"] = sweeps
    return report


def _train_choice(dp: DecisionPoints, lam: float, folds: int, seed: int) -> FamilyRanking:
    """The family a trainer would choose on ``dp`` (repeated grouped CV; one group: in-sample)."""
    if np.unique(dp.group).size >= 2:
        return rank_families(dp, lam, folds=folds, seed=seed)
    tuned = tune_heuristics(dp, lam)
    values = {h: tuned[h].value for h in HEURISTICS}
    best = max(HEURISTICS, key=lambda h: values[h])
    return FamilyRanking(values=values, per_trace={}, best=best, scheme="in-sample: a single group")


# --------------------------------------------------------------------------- chart


def plot_pareto(report: dict[str, Any], path: str | Path) -> None:
    """Draw success against mean cost: learned λ sweep, heuristic sweeps, behavior, oracle."""
    from stopserve.plotting import save

    save(pareto_figure(report), path)


def pareto_figure(report: dict[str, Any]) -> Any:
    """The chart of :func:`plot_pareto`, as a matplotlib figure."""
    from stopserve.plotting import pyplot

    fig, ax = pyplot().subplots(figsize=(7, 5))
    sweeps = report.get("sweeps", {})
    styles = {"learned": "o-", "turn_cap": "s--", "cost_cap": "^--", "reward_threshold": "v--"}
    for name, pts in sweeps.items():
        ordered = sorted(pts or (), key=lambda p: p["cost"])
        if len({(p["cost"], p["success"]) for p in ordered}) < 2:
            continue  # a sweep that does not move (a policy that ignores its parameter) draws no line
        what = "cost-weight sweep" if name == "learned" else "parameter sweep"
        ax.plot(
            [p["cost"] for p in ordered],
            [p["success"] for p in ordered],
            styles.get(name, ".--"),
            label=f"{name} ({what})",
            markersize=4,
        )
    if "learned" in report["policies"]:
        p = report["policies"]["learned"]
        ax.plot([p["cost"]], [p["success"]], "bo", markersize=10, mfc="none", label="shipped policy")
    for name, marker in (("behavior", "k*"), ("oracle", "r*")):
        p = report["policies"][name]
        ax.plot([p["cost"]], [p["success"]], marker, markersize=14, label=name)
    if report.get("cost_normalised"):
        # costs are divided by each data set's mean behavior cost: the axis has no unit
        ax.set_xlabel(f"mean cost, relative (1 = a data set's mean behavior cost in {report['cost_unit']})")
    else:
        ax.set_xlabel(f"mean cost ({report['cost_unit']})")
    ax.set_ylabel("success (mean q at stop)")
    weight = (
        f"cost share {report['cost_share']:g}"
        if report.get("cost_share") is not None
        else f"lambda {report['lambda']:g}"
    )
    ax.set_title(f"stop policies on {report['n_traces']} traces ({weight})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- the table

_FIGURES: Final = ("value", "success", "cost", "cost_saved", "success_lost", "gap_closed", "room_closed")


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.4f}"


def _width(figure: str) -> int:
    return max(13, len(figure) + 2)


def report_table(report: dict[str, Any]) -> str:
    """The report as ``stopserve evaluate`` prints it: one row per policy, then the notes."""
    figures = _FIGURES + (("gap_closed_optimal",) if "optimal" in report["policies"] else ())
    weight = (
        f"cost share {report['cost_share']:g} (costs per data set's mean)"
        if report.get("cost_share") is not None
        else f"lambda {report['lambda']:g} per {report['cost_unit']}"
    )
    lines = [
        f"{weight}, {report['n_traces']} traces, {report['n_decision_points']} decision points, "
        f"{report['n_groups']} groups ({'exact' if report['exact'] else 'not exact'}); "
        f"heuristics {report['heuristic_tuning']}",
        f"{'policy':<22}" + "".join(f"{f:>{_width(f)}}" for f in figures) + "   value 95% CI",
    ]
    for name, p in report["policies"].items():
        label = f"learned ({p['kind']})" if name == "learned" else name
        ci = p["ci95"]["value"]
        ci_text = f"   [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else ""
        lines.append(f"{label:<22}" + "".join(f"{_fmt(p.get(f)):>{_width(f)}}" for f in figures) + ci_text)
    lines.append(
        f"best heuristic: {report['best_heuristic']} ({report['best_heuristic_choice']}; in hindsight on "
        f"these traces: {report['best_heuristic_hindsight']}); gap_closed: share of behavior -> oracle; "
        "room_closed: share of best heuristic -> oracle"
    )
    lines.extend(f"note: {n}" for n in report["notes"])
    return "\n".join(lines)
