"""Tiny real models for the service tests (built in tmp_path; no test model is committed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from stopserve.features import FEATURE_NAMES


def tiny_model(
    out: Path, version: str, *, stop_bias: float = 0.0, margin_continue: float | None = None
) -> Path:
    """A real, tiny LightGBM model directory (g, k; 3 trees each) written by the artifact writer.

    ``stop_bias`` > 0 makes the value of continuing negative (the model wants to stop); < 0 positive.
    ``margin_continue``: None never overrules a rule or a proposed stop; a number lets it go on past one.
    """
    import lightgbm as lgb

    from stopserve.artifacts import save_model_dir

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, len(FEATURE_NAMES)))
    targets = {"g": -stop_bias + 0.01 * x[:, 0], "k": np.abs(0.1 * x[:, 2])}
    texts = {}
    for name, y in targets.items():
        ds = lgb.Dataset(x, label=y, feature_name=list(FEATURE_NAMES), free_raw_data=False)
        booster = lgb.train(
            {"objective": "regression", "num_leaves": 4, "verbose": -1, "min_data_in_leaf": 5}, ds, 3
        )
        texts[name] = booster.model_to_string()
    manifest = {
        "kind": "model",
        "model_version": version,
        "feature_names": list(FEATURE_NAMES),
        "method": "behavior",
        "objective": {"lambda": 0.0},
        "cost_unit": "ktokens",
        "margins": {"stop": 0.0, "continue": margin_continue},
        "gates": {"model_min_turns": 0},
        "overrules": ["proposed", "rule"],
    }
    return save_model_dir(out, manifest, texts)
