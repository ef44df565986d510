"""Tiny real value models for the credit tests, trained here on simulated runs (no test model is committed).

``stopserve train`` ships a tuned heuristic when a few hundred runs cannot show a learned
policy beats it, and credit needs the learned value itself: so these are LightGBM models
fitted on the trainer's own targets (``build_decision_points``, ``k_target``) and written
by the artifact writer, with the manifest fields ``stopserve.policy`` reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from stopserve.features import FEATURE_NAMES
from stopserve.trace import Trace
from stopserve.training.simulate import simulate

#: The model directories :func:`value_models` writes: (method, cost scale, lambda).
KINDS: dict[str, tuple[str, str, float | None]] = {
    "behavior": ("behavior", "fixed", None),
    "optimal-per-run": ("optimal", "per_run", None),
    "lambda": ("behavior", "fixed", 0.2),
}


def sim_traces(n: int, seed: int) -> list[Trace]:
    """Simulated runs (every return and aggregate carries its true ``contribution``)."""
    return [Trace.model_validate(t) for t in simulate(n, seed=seed)]


def value_models(root: Path, traces: Sequence[Trace], *, cost_share: float = 0.3) -> dict[str, Path]:
    """A model directory per :data:`KINDS` entry under ``root``, from boosters fitted once on ``traces``."""
    import lightgbm as lgb

    from stopserve.artifacts import save_model_dir
    from stopserve.training.fit import k_target
    from stopserve.training.labels import build_decision_points

    dp = build_decision_points(traces, cost_unit="ktokens")
    mean_cost = float(dp.trace_c_final.mean())
    targets = {
        "g": dp.q_final - dp.q,
        "k": k_target(dp),
        "s": dp.q,
        "c": dp.q_final - cost_share / mean_cost * (dp.c_final - dp.c),
    }
    params = {
        "objective": "regression",
        "num_leaves": 8,
        "min_data_in_leaf": 20,
        "max_bin": 63,
        "verbose": -1,
        "seed": 0,
        "num_threads": 1,  # OpenMP threads on shared cores spin and stall
        "force_col_wise": True,
    }
    texts: dict[str, str] = {}
    for name, y in targets.items():
        ds = lgb.Dataset(dp.X, label=y, feature_name=list(FEATURE_NAMES), params={"max_bin": 63})
        texts[name] = lgb.train(params, ds, 15).model_to_string()
    out: dict[str, Path] = {}
    for kind, (method, scale, lam) in KINDS.items():
        names = ("c", "g", "k", "s") if method == "optimal" else ("g", "k", "s")
        lam_fit = lam if lam is not None else cost_share / mean_cost
        manifest: dict[str, Any] = {
            "kind": "model",
            "model_version": f"credit-test-{kind}",
            "feature_names": list(FEATURE_NAMES),
            "method": method,
            "cost_unit": "ktokens",
            "margins": {"stop": 0.0, "continue": None},
            "gates": {"model_min_turns": 0},
            "models": {name: {"transform": "identity"} for name in names},
        }
        if scale == "per_run":
            manifest |= {"cost_scale": {"kind": "per_run"}, "objective": {"cost_share": cost_share}}
        else:
            # the objective booster c was fitted at: a share of the mean run cost, or the lambda given
            objective = {"cost_share": cost_share} if lam is None else {"lambda": lam_fit}
            manifest |= {
                "cost_scale": {"kind": "fixed", "mean_behavior_cost": mean_cost},
                "objective": objective,
            }
        out[kind] = save_model_dir(root / kind, manifest, {n: texts[n] for n in names})
    return out


def summed(values: Any) -> float:
    """Sum of the non-None entries."""
    return float(np.sum([v for v in values if v is not None]))
