"""The stop policy: V_stop from a loaded model, plus the safety nets.

``V_stop(s; λ) = Q(s) − S(s) − λ·K(s)``: Q is the quality the run reaches at its
own end if it continues, S the quality it would hand back if stopped now, K the
cost still to be spent (cost units of the manifest). Models trained by this
version also carry D ≈ E[q_T − q_t | s], the gain of continuing fitted directly
(less noisy than Q − S), and then ``V_stop = D − λ·K``. The policy stops when
``V_stop < −τ(λ)``; λ is a per-request dial and τ(λ) is interpolated from the grid
tuned at training time. A ``--method optimal`` model also carries C, the value
(quality at the later stop minus the cost spent until then) realised by the
fitted backward-induction rule; at its training λ, ``V_stop = C − S``.

:meth:`Policy.decide` applies, in this order: the safety nets (always win), the
``min_turns`` veto, then the model; it costs one evaluation of a flattened tree
ensemble through LightGBM's single-row fast C path (a numpy evaluator of the
flattened trees, :class:`CompiledForest`, stands in if that path is unavailable).

>>> policy = Policy.safety_only()
>>> policy.kind
'none'
"""

from __future__ import annotations

import bisect
import math
import os
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from stopserve.artifacts import ModelArtifact, load_model_dir
from stopserve.errors import ConfigError, ModelIntegrityError
from stopserve.features import FEATURE_NAMES, RunState
from stopserve.safety import SafetyConfig

__all__ = ["CompiledForest", "Policy", "StopDecision"]

FloatArray = npt.NDArray[np.float64]

#: The reason a model stop carries: the expected gain of continuing is below its cost.
MODEL_STOP_REASON: Final = "no_progress"
#: The reason when the orchestrator proposed the stop and the policy accepted it.
PROPOSED_STOP_REASON: Final = "information_complete"


@dataclass(frozen=True, slots=True)
class StopDecision:
    """One continue-or-stop answer.

    ``propensity`` is the probability with which ``action`` was chosen (below 1
    only under ε-exploration), ``safety_net`` names the net that fired (its
    ``limit``/``pattern`` when relevant), ``degraded`` is True when the model
    could not be evaluated and only the safety nets decided.
    """

    action: Literal["continue", "stop"]
    reason: str | None
    v_stop: float | None
    q_continue: float | None
    q_stop: float | None
    cost_to_go: float | None
    turn: int
    safety_net: str | None = None
    limit: str | None = None
    pattern: str | None = None
    finalize: bool = False
    model_version: str | None = None
    propensity: float = 1.0
    degraded: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return asdict(self)


# --------------------------------------------------------------------------- tree evaluator

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


def _tau_value(value: Any) -> float:
    return math.inf if value is None else float(value)


def _interp_tau(lam: float, lams: FloatArray, taus: FloatArray) -> float:
    """Linear between tuned λ values; the nearest one when a neighbour is "never stop"."""
    i = int(np.searchsorted(lams, lam))
    if i <= 0:
        return float(taus[0])
    if i >= lams.size:
        return float(taus[-1])
    lo, hi = float(taus[i - 1]), float(taus[i])
    w = (lam - float(lams[i - 1])) / (float(lams[i]) - float(lams[i - 1]))
    if math.isfinite(lo) and math.isfinite(hi):
        return lo + w * (hi - lo)
    return lo if w < 0.5 else hi


def _interp1(x: float, xs: list[float], ys: list[float]) -> float:
    """``np.interp`` for one value (clamped at the ends), without numpy's call overhead."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 if x1 == x0 else y0 + (x - x0) * (y1 - y0) / (x1 - x0)


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


# --------------------------------------------------------------------------- policy


class Policy:
    """A stop policy: a loaded model (or a heuristic, or nothing) plus safety nets.

    Build it with :meth:`load` or :meth:`safety_only`; the constructor is internal.
    """

    kind: Literal["model", "heuristic", "none"]
    model_version: str | None
    default_lambda: float
    safety: SafetyConfig
    manifest: dict[str, Any]

    def __init__(
        self,
        *,
        kind: Literal["model", "heuristic", "none"],
        safety: SafetyConfig,
        manifest: dict[str, Any] | None = None,
        boosters: Mapping[str, Any] | None = None,
    ) -> None:
        manifest = manifest or {}
        self.kind = kind
        self.safety = safety
        self.manifest = manifest
        self.model_version = manifest.get("model_version")
        self.default_lambda = float(manifest.get("default_lambda") or 0.0)
        self.cost_unit: str = str(manifest.get("cost_unit") or "usd")
        self.method: str = str(manifest.get("method") or "none")
        self._boosters: dict[str, Any] = dict(boosters or {})
        self._names: tuple[str, ...] = tuple(self._boosters)
        self._raw_one: Any = None
        if self._boosters:
            try:
                self._raw_one = _FastRaw(self._boosters, len(FEATURE_NAMES)).raw_one
            except (AttributeError, OSError, ValueError):  # private LightGBM API moved: numpy evaluator
                forest = CompiledForest(
                    {n: b.dump_model() for n, b in self._boosters.items()}, len(FEATURE_NAMES)
                )
                self._raw_one = forest.raw_one
        grid = manifest.get("tau_grid") or {}
        # a tau of None (JSON has no infinity) means "never stop at this lambda"
        lams = [float(v) for v in grid.get("lambda", [])]
        taus = [math.inf if v is None else float(v) for v in grid.get("tau", [])]
        default_tau = _tau_value(manifest.get("tau"))
        if not lams:
            lams, taus = [self.default_lambda], [default_tau]
        self._tau_lams = np.asarray(lams)
        self._tau_vals = np.asarray(taus)
        opt = manifest.get("optimal") or {}
        self._opt_lambda: float | None = (
            float(opt["lambda"]) if isinstance(opt, Mapping) and "lambda" in opt else None
        )
        self._opt_tau = _tau_value(opt.get("tau")) if isinstance(opt, Mapping) else 0.0
        # the optimal rule's tau per topology (value scales differ across topologies)
        by_topo = opt.get("tau_by_topology") if isinstance(opt, Mapping) else None
        self._opt_tau_topo: dict[str, float] = (
            {str(t): _tau_value(v) for t, v in by_topo.items()} if isinstance(by_topo, Mapping) else {}
        )
        self._transforms: dict[str, str] = {}
        self._calib: dict[str, tuple[FloatArray, FloatArray]] = {}
        for name, entry in (manifest.get("models") or {}).items():
            self._transforms[name] = str(entry.get("transform", "identity"))
            cal = entry.get("calibration")
            if isinstance(cal, Mapping) and cal.get("x"):
                self._calib[name] = (
                    np.asarray(cal["x"], dtype=np.float64),
                    np.asarray(cal["y"], dtype=np.float64),
                )
        # plain lists: a scalar np.interp costs more than the whole tree walk
        self._calib_lists = {n: (cx.tolist(), cy.tolist()) for n, (cx, cy) in self._calib.items()}
        self._index = {n: i for i, n in enumerate(self._names)}
        self._tau_cache: tuple[float, float] = (math.nan, default_tau)

    # ----------------------------------------------------------------- construction

    @classmethod
    def load(cls, model_dir: str | os.PathLike[str]) -> Policy:
        """Load and verify a model directory (sha256 of every file, feature names)."""
        return cls.from_artifact(load_model_dir(model_dir))

    @classmethod
    def from_artifact(cls, artifact: ModelArtifact) -> Policy:
        """A policy from an already verified :class:`ModelArtifact`."""
        import lightgbm as lgb

        manifest = artifact.manifest
        safety = _safety_from(manifest.get("safety"), artifact)
        kind = artifact.kind
        if kind != "model":
            return cls(kind="heuristic" if kind == "heuristic" else "none", safety=safety, manifest=manifest)
        boosters: dict[str, Any] = {}
        for name, text in artifact.models.items():
            try:
                booster = lgb.Booster(model_str=text)
            except Exception as exc:  # LightGBM raises its own error class on a bad text model
                raise ModelIntegrityError(
                    f"{artifact.path}/{name}.txt: not a LightGBM model: {exc}"
                ) from None
            if list(booster.feature_name()) != list(FEATURE_NAMES):
                raise ModelIntegrityError(
                    f"{artifact.path}/{name}.txt: its feature names differ from this stopserve's featurizer"
                )
            boosters[name] = booster
        for need in ("q", "s", "k"):
            if need not in boosters:
                raise ModelIntegrityError(f"{artifact.path}: manifest lists no {need!r} model")
        return cls(kind="model", safety=safety, manifest=manifest, boosters=boosters)

    @classmethod
    def safety_only(cls, safety: SafetyConfig | None = None) -> Policy:
        """A policy without a model: only the safety nets (and proposed stops) decide."""
        return cls(kind="none", safety=safety if safety is not None else SafetyConfig())

    # ----------------------------------------------------------------- model evaluation

    def tau(self, lam: float) -> float:
        """The stop threshold τ tuned for ``lam`` (interpolated between tuned λ values)."""
        if lam == self._tau_cache[0]:
            return self._tau_cache[1]
        if self._opt_lambda is not None and math.isclose(lam, self._opt_lambda):
            tau = self._opt_tau
        else:
            tau = _interp_tau(lam, self._tau_lams, self._tau_vals)
        self._tau_cache = (lam, tau)
        return tau

    def _post(self, name: str, raw: FloatArray) -> FloatArray:
        kind = self._transforms.get(name, "identity")
        out = 1.0 / (1.0 + np.exp(-raw)) if kind == "sigmoid" else raw
        if name in self._calib:
            cx, cy = self._calib[name]
            out = np.interp(out, cx, cy)
        if name == "k":
            out = np.maximum(out, 0.0)
        return out

    def _post_one(self, name: str, raw: float) -> float:
        out = _sigmoid(raw) if self._transforms.get(name) == "sigmoid" else raw
        cal = self._calib_lists.get(name)
        if cal is not None:
            out = _interp1(out, cal[0], cal[1])
        if name == "k" and out < 0.0:
            out = 0.0
        return out

    def _use_optimal(self, lam: float) -> bool:
        return self._opt_lambda is not None and "c" in self._index and math.isclose(lam, self._opt_lambda)

    def predict_batch(self, X: FloatArray, lam: float) -> dict[str, npt.NDArray[Any]]:  # noqa: N803
        """Model outputs for many feature rows at once (fast replay).

        Returns arrays ``q_continue``, ``q_stop``, ``cost_to_go``, ``gain`` (E[q_T − q_t]),
        ``v_stop`` and ``stop`` (``v_stop < −τ(lam)``; the min_turns veto and safety nets are not
        applied here). Raises :class:`ModelIntegrityError` on a heuristic policy.
        """
        if not self._boosters:
            raise ModelIntegrityError(f"predict_batch needs a learned model; this policy is {self.kind!r}")
        X = np.asarray(X, dtype=np.float64)  # noqa: N806
        n_features = len(FEATURE_NAMES)
        if X.ndim != 2 or X.shape[1] != n_features:
            raise ModelIntegrityError(f"predict_batch: X must have shape (rows, {n_features}), got {X.shape}")
        raw = np.zeros((X.shape[0], len(self._names)))
        if X.shape[0]:
            for i, name in enumerate(self._names):
                raw[:, i] = self._boosters[name].predict(X, raw_score=True)
        q = self._post("q", raw[:, self._index["q"]])
        s = self._post("s", raw[:, self._index["s"]])
        k = self._post("k", raw[:, self._index["k"]])
        gain = raw[:, self._index["d"]] if "d" in self._index else q - s
        tau: float | FloatArray = self.tau(lam)
        if self._use_optimal(lam):
            v = self._post("c", raw[:, self._index["c"]]) - s
            if self._opt_tau_topo:
                tau = np.full(X.shape[0], self.tau(lam))
                for name, t in self._opt_tau_topo.items():
                    col = f"topology_{name}"
                    if col in FEATURE_NAMES:
                        tau[X[:, FEATURE_NAMES.index(col)] == 1.0] = t
        else:
            v = gain - lam * k
        return {
            "gain": gain,
            "q_continue": q,
            "q_stop": s,
            "cost_to_go": k,
            "v_stop": v,
            "stop": v < -tau,
        }

    # ----------------------------------------------------------------- decide

    def decide(
        self,
        state: RunState,
        *,
        lam: float | None = None,
        safety: SafetyConfig | None = None,
        proposed_stop: bool = False,
        epsilon: float = 0.0,
        rng: random.Random | None = None,
    ) -> StopDecision:
        """Continue or stop after the events folded into ``state``.

        Safety nets first (they always win and are never explored away), then the
        ``min_turns`` veto (no model or proposed stop before it), then the model:
        stop when ``V_stop < −τ(λ)``. A proposed stop is accepted unless the model
        expects continuing to pay (``V_stop > |τ|``). With probability ``epsilon`` a
        model stop becomes a continue; ``propensity`` is the chosen action's probability.
        """
        lam = self.default_lambda if lam is None else lam
        nets = self.safety if safety is None else safety
        turn = state.turn
        version = self.model_version
        fired = nets.check(state)
        if fired is not None:
            return StopDecision(
                action="stop",
                reason=fired.reason,
                v_stop=None,
                q_continue=None,
                q_stop=None,
                cost_to_go=None,
                turn=turn,
                safety_net=fired.name,
                limit=fired.limit,
                pattern=fired.pattern,
                finalize=True,
                model_version=version,
            )
        v: float | None = None
        q: float | None = None
        s: float | None = None
        k: float | None = None
        degraded = False
        topo_tau: float | None = None
        if self._raw_one is not None:
            try:
                raw = self._raw_one(state.features())
                idx = self._index
                q = self._post_one("q", float(raw[idx["q"]]))
                s = self._post_one("s", float(raw[idx["s"]]))
                k = self._post_one("k", float(raw[idx["k"]]))
                if self._use_optimal(lam):
                    v = self._post_one("c", float(raw[idx["c"]])) - s
                    if self._opt_tau_topo and state.topology is not None:
                        topo_tau = self._opt_tau_topo.get(state.topology)
                elif "d" in idx:
                    v = float(raw[idx["d"]]) - lam * k
                else:
                    v = q - s - lam * k
                if not math.isfinite(v):
                    raise FloatingPointError("V_stop is not finite")
            except (ValueError, IndexError, FloatingPointError):
                # fail safe: a broken feature row must not take the run down; nets still apply
                v = q = s = k = None
                degraded = True
        allowed = nets.allows_stop(state)

        def answer(
            action: Literal["continue", "stop"], reason: str | None, propensity: float = 1.0
        ) -> StopDecision:
            return StopDecision(
                action=action,
                reason=reason,
                v_stop=v,
                q_continue=q,
                q_stop=s,
                cost_to_go=k,
                turn=turn,
                finalize=action == "stop",
                model_version=version,
                propensity=propensity,
                degraded=degraded,
            )

        if not allowed:
            return answer("continue", None)
        tau = (self.tau(lam) if topo_tau is None else topo_tau) if v is not None else 0.0
        if proposed_stop:
            if v is not None and v > abs(tau):
                return answer("continue", None)
            return answer("stop", PROPOSED_STOP_REASON)
        if v is not None and v < -tau:
            if epsilon > 0.0:
                draw = (rng or random).random()
                if draw < epsilon:
                    return answer("continue", None, propensity=epsilon)
                return answer("stop", MODEL_STOP_REASON, propensity=1.0 - epsilon)
            return answer("stop", MODEL_STOP_REASON)
        return answer("continue", None)


def _safety_from(data: Any, artifact: ModelArtifact) -> SafetyConfig:
    if data is None:
        return SafetyConfig()
    try:
        return SafetyConfig.from_dict(data, source=f"{artifact.path}/manifest.json: safety")
    except ConfigError as exc:
        raise ModelIntegrityError(str(exc), exc.issues) from None
