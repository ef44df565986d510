"""Tree-ensemble evaluation: every path gives LightGBM's own raw scores."""

from __future__ import annotations

import lightgbm as lgb
import numpy as np

from stopserve.inference import CompiledForest, Forest


def _boosters() -> tuple[lgb.Booster, lgb.Booster, np.random.Generator]:
    rng = np.random.default_rng(0)
    X = rng.random((600, 6))
    X[rng.random(X.shape) < 0.15] = np.nan
    X[:, 2] = np.where(rng.random(600) < 0.3, 0.0, X[:, 2])
    y = (np.nan_to_num(X[:, 0], nan=0.9) + np.nan_to_num(X[:, 2]) > 0.8).astype(float)
    common = {"verbose": -1, "num_threads": 1, "num_leaves": 15, "max_depth": 5}
    b1 = lgb.train({**common, "objective": "cross_entropy"}, lgb.Dataset(X, y), 25)
    b2 = lgb.train({**common, "objective": "regression"}, lgb.Dataset(X, X[:, 1] * 3), 25)
    return b1, b2, rng


def _rows(rng: np.random.Generator) -> np.ndarray:
    Xt = rng.random((200, 6))
    Xt[rng.random(Xt.shape) < 0.25] = np.nan
    Xt[:, 2] = np.where(rng.random(200) < 0.3, 0.0, Xt[:, 2])
    return Xt


def test_compiled_forest_matches_lightgbm_including_nan() -> None:
    b1, b2, rng = _boosters()
    forest = CompiledForest({"a": b1.dump_model(), "b": b2.dump_model()}, 6)
    Xt = _rows(rng)
    ref = np.c_[b1.predict(Xt, raw_score=True), b2.predict(Xt, raw_score=True)]
    np.testing.assert_allclose(forest.raw_batch(Xt, chunk=64), ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.array([forest.raw_one(x) for x in Xt]), ref, rtol=0, atol=1e-12)


def test_forest_single_rows_and_batches_match_lightgbm() -> None:
    b1, b2, rng = _boosters()
    forest = Forest({"a": b1, "b": b2}, 6)
    Xt = _rows(rng)
    ref = np.c_[b1.predict(Xt, raw_score=True), b2.predict(Xt, raw_score=True)]
    np.testing.assert_allclose(forest.raw_batch(Xt), ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.array([list(forest.raw_one(x)) for x in Xt]), ref, rtol=0, atol=1e-9)
