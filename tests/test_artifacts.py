from __future__ import annotations

import json
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest

from stopserve.artifacts import (
    CARD_FILE,
    MANIFEST_FILE,
    MODEL_FORMAT,
    load_model_dir,
    save_model_dir,
)
from stopserve.errors import ModelError, ModelIntegrityError, ModelNotFoundError
from stopserve.features import FEATURE_NAMES


def _booster_text(seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    X = rng.random((200, len(FEATURE_NAMES)))
    y = (X[:, 0] > 0.5).astype(float)
    ds = lgb.Dataset(X, y, feature_name=list(FEATURE_NAMES))
    params = {"objective": "cross_entropy", "verbose": -1, "num_threads": 1, "num_leaves": 4}
    return str(lgb.train(params, ds, num_boost_round=3).model_to_string())


def _manifest(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "kind": "model",
        "method": "behavior",
        "model_version": "test-1",
        "feature_names": list(FEATURE_NAMES),
        "cost_unit": "usd",
        "objective": {"lambda": 0.2},
        "cv": {"policies": {"learned": {"value": 0.5, "success": 0.7, "cost": 1.2}}, "folds": 3},
        "training_data": {"n_traces": 10, "sha256": "abc"},
    }
    base.update(kw)
    return base


def test_round_trip_checks_and_records_everything(tmp_path: Path) -> None:
    out = save_model_dir(tmp_path / "m", _manifest(), {"q": _booster_text()})
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([MANIFEST_FILE, CARD_FILE, "q.txt"])  # text and JSON only, no pickle
    art = load_model_dir(out)
    manifest = art.manifest
    written = json.loads((out / MANIFEST_FILE).read_text())
    assert written["format"] == MODEL_FORMAT == "stopserve.model/2" == manifest.format
    assert manifest.feature_names == list(FEATURE_NAMES)
    assert set(manifest.files) == {"q.txt", CARD_FILE}
    assert manifest.models["q"].file == "q.txt" and written["models"]["q"] == {
        "file": "q.txt",
        "transform": "identity",
    }
    assert manifest.libraries is not None and "lightgbm" in manifest.libraries and manifest.created
    assert written["objective"] == {"lambda": 0.2} and written["cost_unit"] == "usd"
    assert art.models["q"].startswith("tree")
    card = (out / CARD_FILE).read_text()
    assert "0.5" in card and "test-1" in card and "lambda 0.2 per usd" in card


def test_a_changed_model_file_is_refused(tmp_path: Path) -> None:
    out = save_model_dir(tmp_path / "m", _manifest(), {"q": _booster_text()})
    path = out / "q.txt"
    path.write_text(path.read_text().replace("tree", "tref", 1))
    with pytest.raises(ModelIntegrityError, match=r"q\.txt: sha256 mismatch"):
        load_model_dir(out)


def test_other_feature_names_are_refused(tmp_path: Path) -> None:
    names = [*FEATURE_NAMES[:-1], "renamed"]
    out = save_model_dir(tmp_path / "m", _manifest(feature_names=names), {"q": _booster_text()})
    with pytest.raises(ModelIntegrityError, match="renamed"):
        load_model_dir(out)
    # a feature left out in the middle, or one this featurizer does not know: refused
    gap = [n for n in FEATURE_NAMES if n != "turn"]
    out2 = save_model_dir(tmp_path / "m2", _manifest(feature_names=gap), {"q": "x"})
    with pytest.raises(ModelIntegrityError, match="features"):
        load_model_dir(out2)
    more = [*FEATURE_NAMES, "from_the_future"]
    out3 = save_model_dir(tmp_path / "m3", _manifest(feature_names=more), {"q": "x"})
    with pytest.raises(ModelIntegrityError, match="from_the_future"):
        load_model_dir(out3)


def test_a_model_of_an_older_featurizer_reads_the_start_of_the_vector(tmp_path: Path) -> None:
    """Features are only appended: a model trained before the last ones came decides as it did."""
    from stopserve.features import FEATURE_GROUPS, RunState
    from stopserve.policy import Policy
    from stopserve.trace import Event

    old = [n for n in FEATURE_NAMES if n not in FEATURE_GROUPS["content"]]
    assert old == list(FEATURE_NAMES[: len(old)])  # the newest group is at the end
    rng = np.random.default_rng(3)
    X = rng.random((300, len(old))) * 10
    y = X[:, old.index("turn")] * 0.1
    params = {
        "objective": "regression",
        "verbose": -1,
        "num_threads": 1,
        "num_leaves": 4,
        "min_data_in_leaf": 5,
    }
    booster = lgb.train(params, lgb.Dataset(X, y, feature_name=old), num_boost_round=5)
    text = str(booster.model_to_string())
    out = save_model_dir(tmp_path / "old", _manifest(feature_names=old), {"g": text, "k": text})
    assert load_model_dir(out).manifest.feature_names == old
    policy = Policy.load(out, engine="lightgbm")
    state = RunState()
    for i in range(6):
        state.fold(Event(id=f"e{i}", t=float(i), type="return", agent="a", content_ref=f"r{i}"))
    full = state.features()
    assert len(full) == len(FEATURE_NAMES) > len(old)
    want = float(booster.predict(full[None, : len(old)], raw_score=True)[0])
    raw = policy.raw_rows(full[None, :])[0]
    assert list(raw) == pytest.approx([want, want])
    one, batch = policy.decide(state), policy.decide(state, raw=raw)
    assert one.v_stop is not None and (one.action, one.v_stop) == (batch.action, batch.v_stop)


def test_missing_things_are_named(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="not found"):
        load_model_dir(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match=r"manifest\.json"):
        load_model_dir(tmp_path / "empty")
    out = save_model_dir(tmp_path / "m", _manifest(), {"q": _booster_text()})
    (out / "q.txt").unlink()
    with pytest.raises(ModelNotFoundError, match=r"q\.txt"):
        load_model_dir(out)


def test_bad_manifest_is_refused(tmp_path: Path) -> None:
    out = save_model_dir(tmp_path / "m", _manifest(), {"q": _booster_text()})
    (out / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(ModelIntegrityError, match="not valid JSON"):
        load_model_dir(out)
    (out / MANIFEST_FILE).write_text(json.dumps({"format": "other/9"}))
    with pytest.raises(ModelIntegrityError, match="format"):
        load_model_dir(out)
    (out / MANIFEST_FILE).write_text(
        json.dumps({"format": MODEL_FORMAT, "kind": "none", "files": {"../x": "0"}})
    )
    with pytest.raises(ModelIntegrityError, match="bad file name"):
        load_model_dir(out)
    (out / MANIFEST_FILE).write_text(
        json.dumps({"format": MODEL_FORMAT, "kind": "none", "margin": {}, "files": {}})
    )
    with pytest.raises(
        ModelIntegrityError, match=r"manifest\.json: margin: unknown field \(did you mean 'margins'\?\)"
    ):
        load_model_dir(out)


def test_heuristic_directory_needs_no_model(tmp_path: Path) -> None:
    manifest = _manifest(kind="heuristic", method="heuristic", safety={"max_turns": 7})
    out = save_model_dir(tmp_path / "h", manifest)
    art = load_model_dir(out)
    assert art.kind == "heuristic" and art.models == {}
    assert "tuned heuristic, not a learned model" in (out / CARD_FILE).read_text()


def test_overwrites_a_model_dir_but_not_other_folders(tmp_path: Path) -> None:
    out = save_model_dir(tmp_path / "m", _manifest(), {"q": _booster_text(0)})
    save_model_dir(out, _manifest(model_version="test-2"), {"q": _booster_text(1)})
    assert load_model_dir(out).manifest.model_version == "test-2"
    other = tmp_path / "data"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    with pytest.raises(ModelError, match="refusing to overwrite"):
        save_model_dir(other, _manifest(), {"q": _booster_text()})
    assert (other / "precious.txt").read_text() == "keep me"
    with pytest.raises(ModelError, match="at least one model"):
        save_model_dir(tmp_path / "x", _manifest(), {})


def test_nan_metrics_become_null(tmp_path: Path) -> None:
    out = save_model_dir(tmp_path / "m", _manifest(cv={"q_auc": float("nan")}), {"q": _booster_text()})
    cv = load_model_dir(out).manifest.cv
    assert cv is not None and cv["q_auc"] is None
