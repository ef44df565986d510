"""The default model's corpus (stopserve.training.corpus) carries what the importers put on
events: sketches and progress, through import_set's cache and label_systems.

On the 36 real MINT runs shipped in examples/mint-sample, laid out as ../shared/data's
``mint-train`` in a scratch folder (no shared data needed)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import orjson

from stopserve.training.corpus import default_corpus, import_set

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "mint-sample"


def _shared(tmp_path: Path) -> Path:
    shared = tmp_path / "shared"
    shutil.copytree(SAMPLE, shared / "mint-train")
    return shared


def _events(path: Path) -> list[dict[str, object]]:
    lines = path.read_bytes().splitlines()
    return [e for line in lines if line.strip() for e in orjson.loads(line)["events"]]


def test_default_corpus_carries_sketches_and_progress(tmp_path: Path) -> None:
    files = default_corpus(_shared(tmp_path), tmp_path / "corpus", sim_n=3)
    mint = [f for f in files if f.name.startswith("mint")]
    assert mint
    events = [e for f in mint for e in _events(f)]
    with_text = [e for e in events if e.get("content_ref") and e["type"] != "stop"]
    assert with_text and all(isinstance(e.get("sketch"), str) for e in with_text)
    errors = [e for e in events if e["type"] == "return" and e.get("error")]
    assert errors and all(isinstance(e.get("progress"), dict) and e["progress"]["error"] for e in errors)


def test_import_set_imports_again_when_the_importer_is_newer(tmp_path: Path) -> None:
    shared = _shared(tmp_path)
    out = tmp_path / "imported"
    dst = import_set("mint", shared, out)
    fresh = dst.read_bytes()
    assert b'"progress"' in fresh and b'"sketch"' in fresh
    # a file written by an older importer: newer than the data, older than the importer's code
    dst.write_bytes(b"stale\n")
    os.utime(shared / "mint-train", (1, 1))
    os.utime(dst, (2, 2))
    assert import_set("mint", shared, out).read_bytes() == fresh
    # newer than both: the cache is used
    dst.write_bytes(b"cached\n")
    assert import_set("mint", shared, out).read_bytes() == b"cached\n"
