"""Order-free fits: the same traces in any file order and any line order give the same model."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from fit_data import synth_trace, synth_traces

from stopserve.objective import Objective
from stopserve.trace import Trace, write_traces
from stopserve.training.backend import TraceSource
from stopserve.training.fit import PolicyLearner

FAST: dict[str, Any] = {"folds": 3, "max_rounds": 20, "n_boot": 200, "seed": 3}


@pytest.fixture(scope="module")
def corpus() -> list[Trace]:
    """Runs with a learnable signal, two of them sharing a trace id (duplicates across files exist)."""
    traces = synth_traces(90, seed=2)
    twin = synth_trace(7, random.Random(99))  # trace id run7 again, other content
    return [*traces, twin]


def _write(path: Path, traces: list[Trace], shuffle: int | None = None) -> Path:
    lines = [orjson.dumps(t.dump()) + b"\n" for t in traces]
    if shuffle is not None:
        random.Random(shuffle).shuffle(lines)
    path.write_bytes(b"".join(lines))
    return path


def _fit(inputs: Any, out: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    learner = PolicyLearner(objective=Objective(lam=2.0), method="behavior", **FAST).fit(inputs)
    learner.save(out)
    manifest = json.loads((out / "manifest.json").read_text())
    # when it was made (not what it learned) is all that may differ
    manifest.pop("created")
    name, _, digest = manifest.pop("model_version").rsplit("-", 2)
    manifest["model_version"] = f"{name}-{digest}"
    models = {p.name: p.read_bytes() for p in sorted(out.glob("*.txt"))}
    return manifest, models


def test_file_order_and_line_order_give_the_same_model(corpus: list[Trace], tmp_path: Path) -> None:
    a = _write(tmp_path / "a.jsonl", corpus[:50])
    b = _write(tmp_path / "b.jsonl", corpus[50:])
    a_shuffled = _write(tmp_path / "a_shuffled.jsonl", corpus[:50], shuffle=1)
    b_shuffled = _write(tmp_path / "b_shuffled.jsonl", corpus[50:], shuffle=2)
    manifest, models = _fit([a, b], tmp_path / "ab")
    assert set(models) == {"g.txt", "k.txt", "s.txt"}  # boosters to compare, not only a rule
    assert manifest["training_data"]["n_traces"] == len(corpus)
    for name, inputs in {
        "ba": [b, a],
        "shuffled": [b_shuffled, a_shuffled],
        "in_memory": random.Random(5).sample(corpus, len(corpus)),
    }.items():
        other_manifest, other_models = _fit(inputs, tmp_path / name)
        assert other_models == models, name
        assert other_manifest == manifest, name


def test_trace_source_walks_traces_by_id_then_content(corpus: list[Trace], tmp_path: Path) -> None:
    b = _write(tmp_path / "b.jsonl", corpus[50:], shuffle=4)
    a = _write(tmp_path / "a.jsonl", corpus[:50], shuffle=3)
    walked = [orjson.dumps(t.dump()) for t in TraceSource([b, a])]
    again = [orjson.dumps(t.dump()) for t in TraceSource([a, b])]
    held = [orjson.dumps(t.dump()) for t in TraceSource(corpus[::-1])]
    assert walked == again == held
    ids = [orjson.loads(w)["trace_id"] for w in walked]
    assert ids == sorted(ids) and ids.count("run7") == 2
