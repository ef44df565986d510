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

FAST: dict[str, Any] = {
    "folds": 3,
    "max_rounds": 20,
    "n_boot": 200,
    "seed": 3,
    "floors": None,
}  # no success floor: a learned model to compare


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
    """The model directory ``inputs`` train: its manifest, and every other file, but when it was made."""
    learner = PolicyLearner(objective=Objective(lam=2.0), method="behavior", **FAST).fit(inputs)
    learner.save(out)
    manifest = json.loads((out / "manifest.json").read_text())
    # when it was made (not what it learned) is all that may differ: the time in the version,
    # the creation time, and the model card that shows both
    created, version = manifest.pop("created"), manifest.pop("model_version")
    name, _, digest = version.rsplit("-", 2)
    manifest["model_version"] = f"{name}-{digest}"
    manifest["files"].pop("MODEL_CARD.md")
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "manifest.json"}
    files["MODEL_CARD.md"] = (
        files["MODEL_CARD.md"].replace(version.encode(), b"V").replace(created.encode(), b"T")
    )
    return manifest, files


def test_file_order_and_line_order_give_the_same_model(corpus: list[Trace], tmp_path: Path) -> None:
    a = _write(tmp_path / "a.jsonl", corpus[:50])
    b = _write(tmp_path / "b.jsonl", corpus[50:])
    a_shuffled = _write(tmp_path / "a_shuffled.jsonl", corpus[:50], shuffle=1)
    b_shuffled = _write(tmp_path / "b_shuffled.jsonl", corpus[50:], shuffle=2)
    manifest, files = _fit([a, b], tmp_path / "ab")
    assert {"g.txt", "k.txt", "s.txt"} <= set(files)  # boosters to compare, not only a rule
    assert manifest["training_data"]["n_traces"] == len(corpus)
    for name, inputs in {
        "ba": [b, a],
        "shuffled": [b_shuffled, a_shuffled],
        "in_memory": random.Random(5).sample(corpus, len(corpus)),
    }.items():
        other_manifest, other_files = _fit(inputs, tmp_path / name)
        assert other_files == files, name  # the LightGBM model strings, bit for bit
        assert other_manifest == manifest, name


def test_trace_source_walks_traces_by_id_then_content(corpus: list[Trace], tmp_path: Path) -> None:
    b = _write(tmp_path / "b.jsonl", corpus[50:], shuffle=4)
    a = _write(tmp_path / "a.jsonl", corpus[:50], shuffle=3)

    def dumps(source: TraceSource) -> list[bytes]:
        return [orjson.dumps(t.dump(), option=orjson.OPT_SORT_KEYS) for t in source]

    walked, again, held = (
        dumps(TraceSource([b, a])),
        dumps(TraceSource([a, b])),
        dumps(TraceSource(corpus[::-1])),
    )
    assert walked == again == held
    ids = [orjson.loads(w)["trace_id"] for w in walked]
    assert ids == sorted(ids) and ids.count("run7") == 2


def test_retrain_splits_runs_started_together_alike_in_any_log_order(tmp_path: Path) -> None:
    """The held-out share is the most recently started; runs that started together are ordered as
    training orders traces (by id, then content), not by their place in the log."""
    from stopserve.training.retrain import _split

    runs = [{"trace_id": f"r{i}", "metrics": {"service_started": float(i // 3)}} for i in range(9)]
    held = []
    for seed in range(4):
        log = tmp_path / f"log{seed}" / "traces.jsonl"
        log.parent.mkdir()
        shuffled = random.Random(seed).sample(runs, len(runs))
        log.write_text("".join(json.dumps(r) + "\n" for r in shuffled))
        split = _split([log], 0.4, log.parent)
        held.append(sorted(json.loads(line)["trace_id"] for line in split.held.read_text().splitlines()))
    assert held == [["r5", "r6", "r7", "r8"]] * 4


def test_traces_are_read_back_from_gzip_and_json_files_a_chunk_at_a_time(
    corpus: list[Trace], tmp_path: Path
) -> None:
    from stopserve.training.backend import read_places

    write_traces(tmp_path / "a.jsonl.gz", corpus[:40])
    (tmp_path / "b.json").write_bytes(orjson.dumps([t.dump() for t in corpus[40:60]]))
    (tmp_path / "c.json").write_bytes(orjson.dumps(corpus[60].dump()))
    _write(tmp_path / "d.jsonl", corpus[61:], shuffle=6)
    source = TraceSource([tmp_path / n for n in ("d.jsonl", "c.json", "b.json", "a.jsonl.gz")])
    want = [orjson.dumps(t.dump(), option=orjson.OPT_SORT_KEYS) for t in TraceSource(corpus)]
    for chunk_bytes in (1, 20_000, 1 << 30):  # a trace a chunk, a few, all at once
        got = [
            orjson.dumps(t.dump(), option=orjson.OPT_SORT_KEYS)
            for t in read_places(source.places(), chunk_bytes=chunk_bytes)
        ]
        assert got == want, chunk_bytes
    assert len(source) == len(corpus)


def test_a_file_changed_between_walks_is_an_error_not_another_fit(
    corpus: list[Trace], tmp_path: Path
) -> None:
    from stopserve.errors import TrainingError

    path = _write(tmp_path / "a.jsonl", corpus[:20])
    source = TraceSource([path])
    assert len(list(source)) == 20
    _write(path, corpus[:20], shuffle=1)  # the same traces, other lines: not where the index says
    with pytest.raises(TrainingError, match="changed while training read it"):
        list(source)
