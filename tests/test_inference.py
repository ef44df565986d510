"""Tree-ensemble evaluation: the compiled path gives LightGBM's own raw scores, to the last bit;
the disk cache is keyed, atomic and checked; the fallback is LightGBM's public predict."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np
import pytest

from stopserve.artifacts import load_model_dir, save_model_dir
from stopserve.errors import ConfigError, ModelError
from stopserve.features import RunState
from stopserve.inference import ZERO_THRESHOLD, Forest, clear_compiled, probe_rows, resolve_engine
from stopserve.objective import Objective
from stopserve.policy import METHOD_MODELS, Policy
from stopserve.trace import Event, is_decision_point

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "models" / "default"


def _compiler_missing() -> str | None:
    """Why the compiled engine cannot be tested here, or None."""
    import importlib.util
    import shutil

    for pkg in ("treelite", "tl2cgen"):
        if importlib.util.find_spec(pkg) is None:
            return f"{pkg} is not installed: pip install -e '.[fast]'"
    if shutil.which("gcc") is None:
        return "no gcc to build the compiled model"
    return None


needs_compiler = pytest.mark.skipif(_compiler_missing() is not None, reason=str(_compiler_missing()))


def _train(seed: int = 0) -> dict[str, lgb.Booster]:
    """Small real boosters: NaN-routed splits, zero splits, a missing-type-None feature."""
    rng = np.random.default_rng(seed)
    n, f = 800, 8
    X = rng.normal(0, 3, (n, f))
    X[rng.random(X.shape) < 0.15] = np.nan
    X[:, 2] = np.where(rng.random(n) < 0.4, 0.0, X[:, 2])
    X[:, 5] = np.round(np.abs(X[:, 5]))  # counts: many ties on integer thresholds
    X[:, 7] = rng.normal(0, 1, n)  # never missing in training: missing type None
    y_cls = (np.nan_to_num(X[:, 0], nan=0.9) + np.nan_to_num(X[:, 2]) > 0.8).astype(float)
    y_reg = np.nan_to_num(X[:, 1]) * 3 - np.nan_to_num(X[:, 5]) + X[:, 7]
    common = {"verbose": -1, "num_threads": 1, "num_leaves": 15, "max_depth": 5, "min_data_in_leaf": 5}
    return {
        "a": lgb.train({**common, "objective": "cross_entropy"}, lgb.Dataset(X, y_cls), 30),
        "b": lgb.train({**common, "objective": "regression"}, lgb.Dataset(X, y_reg), 40),
    }


def _thresholds(boosters: dict[str, lgb.Booster]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for b in boosters.values():
        stack = [t["tree_structure"] for t in b.dump_model()["tree_info"]]
        while stack:
            node = stack.pop()
            if "split_feature" in node:
                out.setdefault(int(node["split_feature"]), []).append(float(node["threshold"]))
                stack += [node["left_child"], node["right_child"]]
    return out


def _hard_rows(boosters: dict[str, lgb.Booster], n_features: int, n: int = 1500) -> np.ndarray:
    """Random rows with NaNs, zeros, values on split thresholds and values LightGBM reads as 0."""
    rng = np.random.default_rng(7)
    X = rng.normal(0, 3, (n, n_features)) * rng.choice([1e-3, 1.0, 1e3], (n, n_features))
    for f, ts in _thresholds(boosters).items():
        on = rng.random(n) < 0.3
        X[on, f] = rng.choice(ts, on.sum())
    X[rng.random(X.shape) < 0.15] = np.nan
    X[rng.random(X.shape) < 0.1] = 0.0
    X[rng.random(X.shape) < 0.03] = rng.choice([ZERO_THRESHOLD, -ZERO_THRESHOLD, ZERO_THRESHOLD / 3])
    # doubles whose low 32-bit word is all ones: TL2cgen's union would read them as missing
    ones = np.array([0xFFFFFFFF, 0x3FF00000, 0xFFFFFFFF, 0x40200000], dtype=np.uint32).view(np.float64)
    X[rng.random(X.shape) < 0.01] = rng.choice(ones)
    return np.vstack([X, probe_rows(n_features)])


def _reference(boosters: dict[str, lgb.Booster], X: np.ndarray) -> np.ndarray:
    return np.column_stack([b.predict(X, raw_score=True) for b in boosters.values()])


# --------------------------------------------------------------------------- exactness


@needs_compiler
def test_compiled_forest_equals_lightgbm_bit_for_bit_on_small_models(tmp_path: Path) -> None:
    boosters = _train()
    forest = Forest(boosters, 8, engine="tl2cgen", cache_dir=tmp_path)
    assert forest.info.engine == "tl2cgen"
    X = _hard_rows(boosters, 8)
    got = np.array([forest.raw_one(x) for x in X])
    np.testing.assert_array_equal(got, _reference(boosters, X))
    np.testing.assert_array_equal(forest.raw_batch(X), _reference(boosters, X))


@pytest.fixture(scope="module")
def shipped_compiled() -> tuple[Forest, dict[str, lgb.Booster]]:
    """The shipped model's boosters, compiled (or read from the cache) once for the module."""
    if _compiler_missing() is not None:
        pytest.skip(str(_compiler_missing()))
    art = load_model_dir(SHIPPED)
    names = METHOD_MODELS[art.manifest.method]
    boosters = {n: lgb.Booster(model_str=art.models[n]) for n in names}
    texts = {n: art.models[n] for n in names}
    # the default cache dir, as the service uses it: later runs (and the e2e servers) read it
    # the features the model reads: the featurizer's, or the start of them (a model of an older one)
    forest = Forest(boosters, _width(boosters), texts=texts, engine="tl2cgen")
    return forest, boosters


def _width(boosters: dict[str, lgb.Booster]) -> int:
    return next(iter(boosters.values())).num_feature()


def _folded_rows(n_runs: int = 12) -> np.ndarray:
    sys.path.insert(0, str(ROOT / "bench"))
    from _events import event_dicts

    rows = []
    for seed in range(n_runs):
        state = RunState()
        for d in event_dicts(200, seed=seed, prefix=f"s{seed}-"):
            ev = Event.model_validate(d)
            state.fold(ev)
            if is_decision_point(ev):
                rows.append(state.features())
    return np.asarray(rows)


def test_shipped_model_compiled_equals_lightgbm(shipped_compiled: tuple[Forest, dict[str, Any]]) -> None:
    forest, boosters = shipped_compiled
    assert forest.info.engine == "tl2cgen"
    n = _width(boosters)
    X = np.vstack([_hard_rows(boosters, n, n=600), _folded_rows()[:, :n]])
    got = np.array([forest.raw_one(x) for x in X])
    np.testing.assert_array_equal(got, _reference(boosters, X))


# --------------------------------------------------------------------------- decisions


def _decisions(policy: Policy, n_runs: int = 12) -> list[tuple[Any, ...]]:
    sys.path.insert(0, str(ROOT / "bench"))
    from _events import event_dicts

    out = []
    for seed in range(n_runs):
        state = RunState()
        for d in event_dicts(150, seed=100 + seed, prefix=f"d{seed}-"):
            ev = Event.model_validate(d)
            state.fold(ev)
            if is_decision_point(ev):
                for kw in ({}, {"objective": Objective(lam=0.05)}, {"proposed_stop": True}):
                    dec = policy.decide(state, **kw)
                    out.append((dec.action, dec.reason, dec.v_stop, dec.q_stop, dec.cost_to_go, dec.degraded))
    return out


def test_decide_gives_the_same_decisions_with_either_engine(
    shipped_compiled: tuple[Forest, dict[str, Any]],
) -> None:
    # the module fixture compiled the shipped model: this load reuses it
    fast = Policy.load(SHIPPED, engine="tl2cgen")
    slow = Policy.load(SHIPPED, engine="lightgbm")
    assert fast.inference is not None and fast.inference["engine"] == "tl2cgen"
    assert slow.inference is not None and slow.inference["engine"] == "lightgbm"
    a, b = _decisions(fast), _decisions(slow)
    assert a == b
    assert {d[0] for d in a} == {"continue", "stop"}, "the runs should exercise both answers"


@needs_compiler
def test_decide_same_with_either_engine_on_a_small_trained_model(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "service"))
    from _service_models import tiny_model

    mdir = tiny_model(tmp_path / "m", "tiny-1", stop_bias=0.02)
    fast = Policy.load(mdir, engine="tl2cgen", cache_dir=tmp_path / "cache")
    slow = Policy.load(mdir, engine="lightgbm")
    assert _decisions(fast, 6) == _decisions(slow, 6)


# --------------------------------------------------------------------------- the disk cache


def _small_model_dir(tmp_path: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests" / "service"))
    from _service_models import tiny_model

    return tiny_model(tmp_path / "m", "tiny-cache")


def _fresh_load(mdir: Path, cache: Path, **kw: Any) -> dict[str, Any]:
    """Policy.load as a fresh process would do it (nothing compiled kept in memory)."""
    clear_compiled()
    info = Policy.load(mdir, cache_dir=cache, **kw).inference
    assert info is not None
    return info


@needs_compiler
def test_cache_is_written_once_then_read_and_a_corrupt_entry_is_rebuilt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mdir = _small_model_dir(tmp_path)
    cache = tmp_path / "cache"
    capsys.readouterr()
    first = _fresh_load(mdir, cache)
    assert (first["engine"], first["cache"]) == ("tl2cgen", "written")
    assert capsys.readouterr().out == "", "a build prints nothing on stdout (stopserve evaluate --json)"
    objects = sorted((cache / "tl2cgen").glob("*.so"))
    assert len(objects) == 2  # g and k
    assert sorted(p.name for p in (cache / "tl2cgen").iterdir()) == sorted(
        [o.name for o in objects] + [o.with_suffix(".json").name for o in objects]
    ), "no half-written files are left"
    for obj in objects:  # a sidecar records each library's sha256
        meta = json.loads(obj.with_suffix(".json").read_text())
        assert meta["bytes"] == obj.stat().st_size
        for path in (obj, obj.with_suffix(".json")):  # built by root, read by the service's user
            assert path.stat().st_mode & 0o777 == 0o644, path
    assert _fresh_load(mdir, cache)["cache"] == "hit"
    assert Policy.load(mdir, cache_dir=cache).inference["cache"] == "reused"  # type: ignore[index]
    # a damaged file (a new inode: this process has the old one mapped, and a shared library
    # rewritten in place under a running process crashes it; stopserve only ever renames)
    damaged = objects[0].with_suffix(".tmp")
    damaged.write_bytes(objects[0].read_bytes()[:100])
    os.replace(damaged, objects[0])
    again = _fresh_load(mdir, cache)
    assert (again["engine"], again["cache"]) == ("tl2cgen", "written")
    assert json.loads(objects[0].with_suffix(".json").read_text())["bytes"] == objects[0].stat().st_size
    # the key follows the model text: a changed booster is compiled anew, the other one is a hit
    art = load_model_dir(mdir)
    other = dict(art.models)
    other["k"] = lgb.Booster(model_str=other["k"]).model_to_string(num_iteration=2)
    save_model_dir(tmp_path / "m2", art.manifest.updated(files={}), other)
    assert _fresh_load(tmp_path / "m2", cache)["cache"] == "written"
    assert len(list((cache / "tl2cgen").glob("*.so"))) == 3


@needs_compiler
def test_unusable_cache_dir_compiles_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mdir = _small_model_dir(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    # a temporary folder of this test's own: other stopserve processes build in the shared one
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))
    info = _fresh_load(mdir, blocker)
    assert (info["engine"], info["cache"]) == ("tl2cgen", "memory")
    assert "not cached" in info["detail"] and str(blocker) in info["detail"]
    assert not list(own_tmp.iterdir()), "the build folder is gone"
    if os.geteuid() != 0:  # root writes anywhere: a read-only folder needs a user
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        assert _fresh_load(mdir, ro)["cache"] == "memory"


# --------------------------------------------------------------------------- the fallback


@needs_compiler
def test_a_library_of_another_shape_is_refused(tmp_path: Path) -> None:
    # three classes write three doubles: the one-double buffer must never see such a library
    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 4))
    y = rng.integers(0, 3, 300)
    params = {"objective": "multiclass", "num_class": 3, "verbose": -1, "num_leaves": 4}
    multi = lgb.train(params, lgb.Dataset(X, y), 3)
    with pytest.raises(ModelError, match="an unexpected generated library"):
        Forest({"m": multi}, 4, engine="tl2cgen", cache_dir=tmp_path)


def test_lightgbm_engine_compiles_nothing(tmp_path: Path) -> None:
    boosters = _train()
    forest = Forest(boosters, 8, engine="lightgbm", cache_dir=tmp_path / "c")
    assert forest.info.engine == "lightgbm"
    assert not (tmp_path / "c").exists()
    X = _hard_rows(boosters, 8, n=300)
    np.testing.assert_array_equal(np.array([forest.raw_one(x) for x in X]), _reference(boosters, X))


def test_without_tl2cgen_or_gcc_auto_falls_back_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    mdir = _small_model_dir(tmp_path)
    monkeypatch.setitem(sys.modules, "tl2cgen", None)  # import tl2cgen now raises ImportError
    caplog.set_level(logging.WARNING, logger="stopserve.inference")
    clear_compiled()
    policy = Policy.load(mdir, cache_dir=tmp_path / "c")
    info = policy.inference
    assert info is not None, "the policy says how its decisions are computed (GET /v1/model serves it)"
    assert info["engine"] == "lightgbm" and info["requested"] == "auto"
    assert "tl2cgen is not installed" in info["detail"] and "'.[fast]'" in info["detail"]
    assert any("tl2cgen is not installed" in r.getMessage() for r in caplog.records), "the fallback is logged"
    with pytest.raises(ModelError, match="engine 'tl2cgen' was asked for, but tl2cgen is not installed"):
        Policy.load(mdir, engine="tl2cgen", cache_dir=tmp_path / "c")
    assert policy.decide(RunState()).action in ("continue", "stop")
    # the Docker image's case: the libraries are there, no compiler
    monkeypatch.delitem(sys.modules, "tl2cgen")
    monkeypatch.setenv("PATH", str(tmp_path))
    no_gcc = _fresh_load(mdir, tmp_path / "c")
    assert no_gcc["engine"] == "lightgbm" and "no C compiler (gcc)" in no_gcc["detail"]


def test_engine_names_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STOPSERVE_INFERENCE", raising=False)
    assert resolve_engine(None) == "auto"
    monkeypatch.setenv("STOPSERVE_INFERENCE", "lightgbm")
    assert resolve_engine(None) == "lightgbm"
    monkeypatch.setenv("STOPSERVE_INFERENCE", "fast")
    with pytest.raises(ConfigError, match="STOPSERVE_INFERENCE: expected one of auto, tl2cgen, lightgbm"):
        resolve_engine(None)
    with pytest.raises(ConfigError, match="engine: expected one of"):
        Forest(_train(), 8, engine="treelite")


def test_no_private_api_of_a_dependency() -> None:
    """Issue 16: stopserve uses no private name of LightGBM, Treelite, TL2cgen, FastAPI or Starlette."""
    offenders = []
    for path in (ROOT / "stopserve").rglob("*.py"):
        text = path.read_text()
        for needle in (
            "_LIB",
            "_safe_call",
            "._handle",
            "lightgbm.basic",
            "_c_entry_func",
            "_execution_engine",
            "dependant",  # FastAPI's route internals (body_params, request_param_name, field.validate)
            "request_param_name",
            "field.validate",
            "fastapi._",
            "starlette._",
        ):
            if needle in text:
                offenders.append(f"{path.relative_to(ROOT)}: {needle}")
    assert offenders == []


# --------------------------------------------------------------------------- what a first serve prints


@needs_compiler
def test_the_first_serve_compiles_without_a_word_of_treelite(tmp_path: Path) -> None:
    """A fresh cache: the shipped model is compiled at start-up; TL2cgen's C++ note about the
    Treelite version (printed once per booster before) is not shown, and nothing is wrong."""
    from servers import LiveServer

    env = {"STOPSERVE_CACHE_DIR": str(tmp_path / "cache")}
    with LiveServer(log_dir=tmp_path / "logs", env=env) as srv:
        import httpx

        info = httpx.get(srv.url + "/v1/model", timeout=10).json()["manifest"]["inference"]
        out = srv.read_output()
    assert info["engine"] == "tl2cgen" and info["cache"] in ("written", "reused")  # built in this process
    assert "Treelite" not in out and "WARNING" not in out, out


def test_native_stderr_passes_on_what_is_not_the_version_note(capfd: pytest.CaptureFixture[str]) -> None:
    from stopserve.inference import _native_stderr

    with _native_stderr():
        os.write(2, b"[10:44:54] serializer.cc:202: The model you are loading originated from a newer ")
        os.write(2, b"Treelite version; some functionalities may be unavailable.\n")
        os.write(2, b"Currently running Treelite version 4.1.2\n")
        os.write(2, b"gcc: warning: something a user should see\n")
    err = capfd.readouterr().err
    assert err == "gcc: warning: something a user should see\n"
