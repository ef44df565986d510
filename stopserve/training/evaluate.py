"""Truncation replay of stop policies on held-out traces, and ``stopserve evaluate``.

A policy stops a run at its first stop decision; its value there is
``q_t - lam * c_t``; a run it never stops gets the logged end (nothing can be
replayed past what was logged). Policies compared:

- ``behavior``: the run as logged, to its end;
- each tuned heuristic (:mod:`stopserve.training.heuristics`), tuned on ``tune_on``
  traces and never on the evaluated ones; without them, cross-fitted by group
  (each trace's heuristic is tuned on the other folds) -- the report says which;
- ``learned``: the model directory's policy, replayed through
  ``Policy.decide`` on every decision point's live :class:`RunState`;
- ``oracle``: hindsight, the best ``R_stop(t)`` of each trace (its logged end included);
- ``optimal``: the simulator's Bayes-optimal value, when every trace carries
  ``metrics.optimal_value`` at this lambda.

Evaluation is *exact* when every trace ran to its cap with every prefix graded
(``metrics.run_to_cap == 1``); otherwise a policy that would have continued
past the logged end is credited with the logged end, a lower bound for it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from stopserve.errors import TrainingError
from stopserve.features import RunState
from stopserve.trace import Trace, read_traces
from stopserve.training.heuristics import (
    HEURISTICS,
    Replay,
    cross_fit_heuristics,
    replay,
    sweep,
    tune_heuristics,
)
from stopserve.training.labels import DecisionPoints, FloatArray, StopRule, build_decision_points

__all__ = ["LAMBDA_SWEEP", "evaluate", "evaluate_command", "plot_pareto"]

#: Multiples of lambda the learned policy is swept over for the Pareto chart.
LAMBDA_SWEEP: Final[tuple[float, ...]] = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 10.0, 30.0)

#: Fallback lambda when neither the command nor the model gives one.
DEFAULT_LAMBDA: Final = 0.1

N_BOOT: Final = 1000


def _decide_rule(policy: Any, lam: float) -> StopRule:
    def rule(state: RunState, proposed: bool) -> bool:
        return bool(policy.decide(state, lam=lam, proposed_stop=proposed).action == "stop")

    return rule


def _oracle_mask(dp: DecisionPoints, lam: float) -> npt.NDArray[np.bool_]:
    r = dp.r_stop(lam)
    best_row = np.maximum.reduceat(r, dp.offsets[:-1])
    best = np.maximum(best_row, dp.trace_q_final - lam * dp.trace_c_final)
    # earliest row reaching the hindsight best; none when only the logged end does
    return np.asarray(r >= best[dp.trace_idx] - 1e-12, dtype=bool)


def _metrics(
    rep: dict[str, Replay],
    groups: npt.NDArray[np.str_],
    *,
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
    b, o = series["behavior"], series["oracle"]
    gap = o["value"] - b["value"]
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
            out[name] = entry
    return out


def evaluate(
    model_policy: Any,
    traces_or_dp: Iterable[Trace] | DecisionPoints,
    *,
    lam: float,
    tune_on: Iterable[Trace] | DecisionPoints | None = None,
    cost_unit: str | None = None,
    labels_from_rewards: bool = False,
    group_by: str = "task",
    seed: int = 0,
    folds: int = 5,
    n_boot: int = N_BOOT,
    sweep_lambdas: Sequence[float] = (),
    progress: bool = False,
) -> dict[str, Any]:
    """Replay every policy on the evaluated traces; return the report as JSON-ready data.

    ``model_policy`` is a :class:`stopserve.policy.Policy` (or ``None`` to skip
    ``learned``). With traces, it is replayed through ``decide`` on each
    decision point's live state; with ready :class:`DecisionPoints`, column 0 of
    their ``rule_stops`` must hold its stop flags at ``lam``. ``sweep_lambdas``
    adds learned replays at other lambdas (``report["sweeps"]``, for the chart).
    """
    if not (lam >= 0 and math.isfinite(lam)):
        raise TrainingError(f"lambda must be a finite number >= 0, got {lam}")
    notes: list[str] = []
    if isinstance(traces_or_dp, DecisionPoints):
        dp = traces_or_dp
        if model_policy is not None and dp.rule_stops.shape[1:] < (1 + len(sweep_lambdas),):
            raise TrainingError(
                "evaluating a policy on ready decision points needs its stop flags in rule_stops; "
                "pass the traces instead"
            )
    else:
        rules: list[StopRule] = []
        if model_policy is not None:
            rules = [_decide_rule(model_policy, x) for x in (lam, *sweep_lambdas)]
        dp = build_decision_points(
            traces_or_dp,
            cost_unit=cost_unit,
            labels_from_rewards=labels_from_rewards,
            group_by=group_by,
            progress=progress,
            stop_rules=rules,
        )
    rep: dict[str, Replay] = {"behavior": replay(dp, np.zeros(dp.n_rows, dtype=bool), lam)}

    heuristic_params: dict[str, Any]
    if tune_on is not None:
        tune_dp = (
            tune_on
            if isinstance(tune_on, DecisionPoints)
            else build_decision_points(
                tune_on, cost_unit=dp.cost_unit, labels_from_rewards=labels_from_rewards, group_by=group_by
            )
        )
        if tune_dp.cost_unit != dp.cost_unit:
            raise TrainingError(
                f"--tune-on traces are in cost unit {tune_dp.cost_unit!r}, evaluated ones in {dp.cost_unit!r}"
            )
        tuned = tune_heuristics(tune_dp, lam)
        tuning = f"tuned on {tune_dp.n_traces} --tune-on traces"
        heuristic_params = {name: h.to_dict() for name, h in tuned.items()}
        for name, h in tuned.items():
            rep[name] = replay(dp, h.stop_mask(dp), lam)
    else:
        masks, per_fold = cross_fit_heuristics(dp, lam, folds=folds, seed=seed)
        k = len(next(iter(per_fold.values())))
        tuning = f"cross-fitted: tuned on the other {k - 1} of {k} folds grouped by {group_by}"
        notes.append(f"no --tune-on traces: heuristics {tuning}, never on the traces they are scored on")
        heuristic_params = {name: {"name": name, "parameter_per_fold": p} for name, p in per_fold.items()}
        for name in HEURISTICS:
            rep[name] = replay(dp, masks[name], lam)

    kind = None
    if model_policy is not None:
        rep["learned"] = replay(dp, dp.rule_stops[:, 0], lam)
        raw_kind = str(getattr(model_policy, "kind", "model"))
        kind = "model" if raw_kind == "model" else "heuristic"
    rep["oracle"] = replay(dp, _oracle_mask(dp, lam), lam)

    optimal: FloatArray | None = None
    if np.isfinite(dp.optimal_value).all():
        lam_ok = np.isfinite(dp.optimal_lambda).all() and bool(np.allclose(dp.optimal_lambda, lam))
        if lam_ok and dp.cost_unit == "ktokens":
            optimal = dp.optimal_value
        else:
            notes.append(
                "traces carry metrics.optimal_value but at another lambda or cost unit "
                f"(optimal_lambda {np.unique(dp.optimal_lambda)[:3].tolist()}, unit ktokens): "
                "'optimal' not reported (evaluate simulator traces with --cost-unit ktokens at their lambda)"
            )
    elif np.isfinite(dp.optimal_value).any():
        notes.append("only some traces carry metrics.optimal_value: 'optimal' not reported")

    n_groups = int(np.unique(dp.group).size)
    if n_groups < 2:
        notes.append("a single group: bootstrap intervals are degenerate (zero width)")
    policies = _metrics(rep, dp.group, optimal=optimal, n_boot=n_boot, seed=seed)
    if kind is not None:
        policies["learned"]["kind"] = kind
        policies["learned"]["policy_kind"] = str(getattr(model_policy, "kind", "model"))
        policies["learned"]["model_version"] = getattr(model_policy, "model_version", None)
    best_heuristic = max(HEURISTICS, key=lambda n: policies[n]["value"])
    exact = bool(dp.run_to_cap.all())
    if not exact:
        notes.append(
            "not exact: a policy that would continue past a trace's logged end is credited with the end"
        )

    report: dict[str, Any] = {
        "lambda": lam,
        "cost_unit": dp.cost_unit,
        "n_traces": dp.n_traces,
        "n_decision_points": dp.n_rows,
        "n_groups": n_groups,
        "group_by": group_by,
        "exact": exact,
        "heuristic_tuning": tuning,
        "policies": policies,
        "best_heuristic": best_heuristic,
        "heuristics": heuristic_params,
        "notes": notes,
    }
    if model_policy is not None and sweep_lambdas:
        points = []
        for j, x in enumerate(sweep_lambdas, start=1):
            r = replay(dp, dp.rule_stops[:, j], lam)
            points.append({"lambda": x, "success": float(r.q.mean()), "cost": float(r.c.mean())})
        sweeps: dict[str, list[dict[str, Any]]] = {"learned": points}
        for name in ("turn_cap", "cost_cap", "reward_threshold"):
            sweeps[name] = [
                {"parameter": v, "success": float(r.q.mean()), "cost": float(r.c.mean())}
                for v, r in sweep(dp, name, lam)
            ]
        report["sweeps"] = sweeps
    return report


# --------------------------------------------------------------------------- chart


def plot_pareto(report: dict[str, Any], path: str | Path) -> None:
    """Draw success against mean cost: learned lambda sweep, heuristic sweeps, behavior, oracle."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise TrainingError("--plot needs matplotlib: pip install 'stopserve[plot]'") from exc
    fig, ax = plt.subplots(figsize=(7, 5))
    sweeps = report.get("sweeps", {})
    styles = {"learned": "o-", "turn_cap": "s--", "cost_cap": "^--", "reward_threshold": "v--"}
    for name, pts in sweeps.items():
        if not pts:
            continue
        ordered = sorted(pts, key=lambda p: p["cost"])
        ax.plot(
            [p["cost"] for p in ordered],
            [p["success"] for p in ordered],
            styles.get(name, ".--"),
            label=f"{name} ({'lambda sweep' if name == 'learned' else 'parameter sweep'})",
            markersize=4,
        )
    if "learned" in report["policies"]:
        p = report["policies"]["learned"]
        ax.plot(
            [p["cost"]],
            [p["success"]],
            "bo",
            markersize=10,
            mfc="none",
            label=f"learned at lambda {report['lambda']:g}",
        )
    for name, marker in (("behavior", "k*"), ("oracle", "r*")):
        p = report["policies"][name]
        ax.plot([p["cost"]], [p["success"]], marker, markersize=14, label=name)
    ax.set_xlabel(f"mean cost ({report['cost_unit']})")
    ax.set_ylabel("success (mean q at stop)")
    ax.set_title(f"stop policies on {report['n_traces']} traces (lambda {report['lambda']:g})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise TrainingError(f"{path}: cannot write the chart: {exc.strerror or exc}") from exc
    finally:
        plt.close(fig)


# --------------------------------------------------------------------------- CLI

_FIGURES: Final = ("value", "success", "cost", "cost_saved", "success_lost", "gap_closed")


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.4f}"


def _width(figure: str) -> int:
    return max(14, len(figure) + 2)


def _table(report: dict[str, Any]) -> str:
    figures = _FIGURES + (("gap_closed_optimal",) if "optimal" in report["policies"] else ())
    lines = [
        f"lambda {report['lambda']:g} per {report['cost_unit']}, {report['n_traces']} traces, "
        f"{report['n_decision_points']} decision points, {report['n_groups']} groups "
        f"({'exact' if report['exact'] else 'not exact'}); heuristics {report['heuristic_tuning']}",
        f"{'policy':<20}" + "".join(f"{f:>{_width(f)}}" for f in figures) + "   value 95% CI",
    ]
    for name, p in report["policies"].items():
        label = f"learned ({p['kind']})" if name == "learned" else name
        ci = p["ci95"]["value"]
        ci_text = f"   [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else ""
        lines.append(f"{label:<20}" + "".join(f"{_fmt(p.get(f)):>{_width(f)}}" for f in figures) + ci_text)
    lines.append(f"best heuristic: {report['best_heuristic']}")
    lines.extend(f"note: {n}" for n in report["notes"])
    return "\n".join(lines)


def evaluate_command(args: argparse.Namespace) -> int:
    """``stopserve evaluate --model DIR TRACES... [--tune-on ...] [--lambda X] [--json] [--plot F]``."""
    from stopserve.policy import Policy

    policy = Policy.load(args.model)
    manifest: dict[str, Any] = dict(getattr(policy, "manifest", {}) or {})
    lam = args.lam if args.lam is not None else getattr(policy, "default_lambda", None)
    if lam is None:
        lam = DEFAULT_LAMBDA
    model_unit = manifest.get("cost_unit")
    if args.cost_unit and model_unit and args.cost_unit != model_unit:
        # the model's lambda and cost-to-go are in its own unit: mixing units misprices every stop
        raise TrainingError(
            f"--cost-unit {args.cost_unit} differs from the model's cost unit {model_unit!r} "
            f"({args.model}/manifest.json); evaluate in {model_unit!r}"
        )
    cost_unit = args.cost_unit or model_unit
    labels_from_rewards = bool(args.labels_from_rewards or manifest.get("labels_from_rewards", False))
    sweep_lambdas = [lam * m for m in LAMBDA_SWEEP if lam * m != lam] if args.plot else []
    if args.plot and lam == 0:
        sweep_lambdas = [0.01, 0.1, 1.0, 10.0]
    report = evaluate(
        policy,
        read_traces(args.traces),
        lam=float(lam),
        tune_on=read_traces(args.tune_on) if args.tune_on else None,
        cost_unit=cost_unit,
        labels_from_rewards=labels_from_rewards,
        group_by=args.group_by,
        seed=args.seed,
        sweep_lambdas=sweep_lambdas,
        progress=not args.json and sys.stderr.isatty(),
    )
    if args.plot:
        plot_pareto(report, args.plot)
        report.pop("sweeps", None)
    if args.json:
        print(json.dumps(report, allow_nan=False))
    else:
        print(_table(report))
        if args.plot:
            print(f"chart written to {args.plot}")
    return 0
