"""Tree-ensemble evaluation for the policy: raw scores of several LightGBM models at once.

:class:`Forest` holds the boosters a policy reads and answers one feature row
(:meth:`Forest.raw_one`, the decide hot path) or many (:meth:`Forest.raw_batch`, the
trainer's replays). Single rows go through LightGBM's single-row fast C path
(:class:`_FastRaw`); :class:`CompiledForest`, a numpy evaluator of the flattened
trees, stands in when that path is unavailable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from stopserve.errors import ModelIntegrityError

__all__ = ["CompiledForest", "Forest"]

FloatArray = npt.NDArray[np.float64]


_ZERO_MISSING: Final = "Zero"


class CompiledForest:
    """Several LightGBM models flattened into one array program.

    Every tree of every model is evaluated at once, one numpy step per tree
    level, so a single-row prediction costs ``max_depth`` vectorised steps
    instead of a Booster call per model. Matches ``Booster.predict(raw_score=True)``
    including NaN routing (tested). Models trained with ``zero_as_missing`` are
    refused (not produced by stopserve's trainer).
    """

    def __init__(self, models: Mapping[str, Mapping[str, Any]], n_features: int) -> None:
        self.names: tuple[str, ...] = tuple(models)
        feat: list[int] = []
        thr: list[float] = []
        nan_left: list[bool] = []
        kids: list[int] = []  # kids[2n] = right child, kids[2n+1] = left child
        leaf: list[float] = []
        roots: list[int] = []
        owner: list[int] = []
        depth = 0
        for m_idx, name in enumerate(self.names):
            dump = models[name]
            if int(dump.get("num_tree_per_iteration", 1)) != 1:
                raise ModelIntegrityError(f"model {name!r}: multi-class models are not supported")
            for tree in dump.get("tree_info", []):
                stack: list[tuple[Mapping[str, Any], int, int]] = []
                root = len(feat)
                roots.append(root)
                owner.append(m_idx)
                feat.append(0)
                thr.append(0.0)
                nan_left.append(False)
                kids += [root, root]
                leaf.append(0.0)
                stack.append((tree["tree_structure"], root, 0))
                while stack:
                    node, idx, d = stack.pop()
                    depth = max(depth, d)
                    if "leaf_value" in node:
                        leaf[idx] = float(node["leaf_value"])
                        continue  # a leaf points to itself: extra levels are no-ops
                    if node.get("decision_type", "<=") != "<=":
                        raise ModelIntegrityError(f"model {name!r}: categorical splits are not supported")
                    if node.get("missing_type") == _ZERO_MISSING:
                        raise ModelIntegrityError(f"model {name!r}: zero_as_missing splits are not supported")
                    f = int(node["split_feature"])
                    if not 0 <= f < n_features:
                        raise ModelIntegrityError(
                            f"model {name!r}: split on feature {f}, but there are {n_features} features"
                        )
                    t = float(node["threshold"])
                    feat[idx] = f
                    thr[idx] = t
                    # NaN goes the default way when the split learned one, else it is read as 0
                    nan_left[idx] = (
                        bool(node.get("default_left", True))
                        if node.get("missing_type") == "NaN"
                        else t >= 0.0
                    )
                    children = []
                    for side in ("right_child", "left_child"):
                        cidx = len(feat)
                        feat.append(0)
                        thr.append(0.0)
                        nan_left.append(False)
                        kids += [cidx, cidx]
                        leaf.append(0.0)
                        children.append(cidx)
                        stack.append((node[side], cidx, d + 1))
                    kids[2 * idx] = children[0]
                    kids[2 * idx + 1] = children[1]
        self.n_features = n_features
        self.depth = depth
        self._feat = np.asarray(feat, dtype=np.intp)
        self._thr = np.asarray(thr, dtype=np.float64)
        self._nan_left = np.asarray(nan_left, dtype=bool)
        self._kids = np.asarray(kids, dtype=np.intp)
        self._leaf = np.asarray(leaf, dtype=np.float64)
        self._roots = np.asarray(roots, dtype=np.intp)
        self._owner = np.asarray(owner, dtype=np.intp)
        self._n_models = len(self.names)

    def raw_one(self, x: FloatArray) -> FloatArray:
        """Raw scores (one per model, in ``names`` order) for one feature row."""
        node = self._roots
        feat, thr, kids = self._feat, self._thr, self._kids
        xn = np.isnan(x)
        if xn.any():
            nan_left = self._nan_left
            for _ in range(self.depth):
                f = feat[node]
                go = (x[f] <= thr[node]) | (xn[f] & nan_left[node])
                node = kids[2 * node + go]
        else:
            for _ in range(self.depth):
                node = kids[2 * node + (x[feat[node]] <= thr[node])]
        return np.bincount(self._owner, weights=self._leaf[node], minlength=self._n_models).astype(np.float64)

    def raw_batch(self, X: FloatArray, chunk: int = 2048) -> FloatArray:  # noqa: N803
        """Raw scores, shape (rows, models), for a feature matrix (in row chunks: bounded memory)."""
        X = np.asarray(X, dtype=np.float64)  # noqa: N806
        n = X.shape[0]
        out = np.zeros((n, self._n_models))
        if n == 0 or self._roots.size == 0:
            return out
        if n > chunk:
            for start in range(0, n, chunk):
                out[start : start + chunk] = self.raw_batch(X[start : start + chunk], chunk)
            return out
        xn = np.isnan(X)
        rows = np.arange(n)[:, None]
        node = np.broadcast_to(self._roots, (n, self._roots.size)).copy()
        for _ in range(self.depth):
            f = self._feat[node]
            go = (X[rows, f] <= self._thr[node]) | (xn[rows, f] & self._nan_left[node])
            node = self._kids[2 * node + go]
        vals = self._leaf[node]
        for m in range(self._n_models):
            out[:, m] = vals[:, self._owner == m].sum(axis=1)
        return out


class _FastRaw:
    """LightGBM's own single-row fast path (``LGBM_BoosterPredictForMatSingleRowFast``).

    One C call per model with a prepared config: a few microseconds per model,
    against ~50 µs for ``Booster.predict`` on a 1-row array. The buffers are
    shared, so calls are serialised by a lock (decide is called from threads).
    """

    def __init__(self, boosters: Mapping[str, Any], n_features: int) -> None:
        import ctypes
        import threading

        from lightgbm.basic import _LIB, _c_str, _safe_call  # type: ignore[attr-defined]

        self._ctypes = ctypes
        self._lib = _LIB
        self._boosters = dict(boosters)  # keep the handles alive
        self._x = np.zeros(n_features, dtype=np.float64)
        self._out = np.zeros(1, dtype=np.float64)
        self._x_ptr = self._x.ctypes.data_as(ctypes.c_void_p)
        self._out_ptr = self._out.ctypes.data_as(ctypes.POINTER(ctypes.c_double))
        self._len = ctypes.c_int64(0)
        self._len_ref = ctypes.byref(self._len)
        self._lock = threading.Lock()
        self._fn = _LIB.LGBM_BoosterPredictForMatSingleRowFast
        self._configs: list[Any] = []
        for booster in self._boosters.values():
            handle = ctypes.c_void_p()
            _safe_call(
                _LIB.LGBM_BoosterPredictForMatSingleRowFastInit(
                    booster._handle,
                    ctypes.c_int(1),  # C_API_PREDICT_RAW_SCORE
                    ctypes.c_int(0),
                    ctypes.c_int(-1),
                    ctypes.c_int(1),  # C_API_DTYPE_FLOAT64
                    ctypes.c_int32(n_features),
                    _c_str("num_threads=1"),
                    ctypes.byref(handle),
                )
            )
            self._configs.append(handle)

    def raw_one(self, x: FloatArray) -> list[float]:
        """Raw scores, one per model, for one feature row."""
        out: list[float] = []
        with self._lock:
            self._x[:] = x
            for cfg in self._configs:
                if self._fn(cfg, self._x_ptr, self._len_ref, self._out_ptr) != 0:
                    raise ValueError("LightGBM single-row prediction failed")
                out.append(float(self._out[0]))
        return out

    def __del__(self) -> None:
        free = getattr(getattr(self, "_lib", None), "LGBM_FastConfigFree", None)
        for cfg in getattr(self, "_configs", []):
            if free is not None:
                free(cfg)


class Forest:
    """Named LightGBM boosters evaluated together (raw scores, in ``names`` order)."""

    def __init__(self, boosters: Mapping[str, Any], n_features: int) -> None:
        self.names: tuple[str, ...] = tuple(boosters)
        self._boosters = dict(boosters)
        self.n_features = n_features
        self._raw_one: Any
        try:
            self._raw_one = _FastRaw(self._boosters, n_features).raw_one
        except (AttributeError, OSError, ValueError):  # private LightGBM API moved: numpy evaluator
            forest = CompiledForest({n: b.dump_model() for n, b in self._boosters.items()}, n_features)
            self._raw_one = forest.raw_one

    def raw_one(self, x: FloatArray) -> Any:
        """Raw scores for one feature row (a sequence of floats, one per booster)."""
        return self._raw_one(x)

    def raw_batch(self, X: FloatArray) -> FloatArray:  # noqa: N803
        """Raw scores, shape (rows, boosters), for a feature matrix."""
        X = np.asarray(X, dtype=np.float64)  # noqa: N806
        out = np.zeros((X.shape[0], len(self.names)))
        if X.shape[0]:
            for i, name in enumerate(self.names):
                out[:, i] = self._boosters[name].predict(X, raw_score=True)
        return out
