"""The texts of real runs, step by step, read from ../shared/data, and how well sketches of them
agree with the exact Jaccard similarity (for the sketch tests and bench/bench_sketch.py).

Each run is the list of its steps' texts in order: an agent's message or command, then what
came back (SWE agent messages and observations, MINT turns, InterCode actions and
observations). The task prompt is left out. ``limit`` runs at most, spread over the files.
"""

from __future__ import annotations

import gzip
import itertools
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from stopserve.signals import sketch as sk


def swe_runs(folder: Path, limit: int) -> Iterator[list[str]]:
    for path in sorted((folder / "trajs").glob("*.traj.json"))[:limit]:
        messages = orjson.loads(path.read_bytes()).get("messages", [])
        yield [str(m.get("content", "")) for m in messages[2:]]


def _spread(files: list[Path], limit: int, runs: Callable[[Path], Iterable[Any]]) -> Iterator[list[str]]:
    per_file = limit // max(1, len(files)) + 1
    yielded = 0
    for path in files:
        for texts in itertools.islice(runs(path), per_file):
            if texts is None:
                continue
            yield texts
            yielded += 1
            if yielded >= limit:
                return


def _mint_file(path: Path) -> Iterator[list[str]]:
    with gzip.open(path, "rb") as fh:
        for line in fh:
            history = orjson.loads(line).get("state", {}).get("history", [])
            yield [str(h.get("content", "")) for h in history[1:]]


def _intercode_file(path: Path) -> Iterator[list[str] | None]:
    with gzip.open(path, "rb") as fh:
        data = orjson.loads(fh.read())
    for run in data.values():
        turns = run.get("turn_history") if isinstance(run, dict) else None
        if not isinstance(turns, dict):
            yield None
            continue
        pairs = zip(turns.get("actions", []), turns.get("observations", []), strict=False)
        yield [str(x) for x in itertools.chain.from_iterable(pairs)]


def mint_runs(folder: Path, limit: int) -> Iterator[list[str]]:
    return _spread(sorted(folder.rglob("results.jsonl.gz")), limit, _mint_file)


def intercode_runs(folder: Path, limit: int) -> Iterator[list[str]]:
    return _spread(sorted(folder.rglob("*.json.gz")), limit, _intercode_file)


def shingles(text: str) -> set[str]:
    """The exact shingle set a sketch estimates, from the public normalise()."""
    words = sk.normalise(text).split(" ")
    if len(words) <= sk.SHINGLE:
        return {" ".join(words)}
    return {" ".join(words[i : i + sk.SHINGLE]) for i in range(len(words) - sk.SHINGLE + 1)}


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b)


def agreement(runs: Iterable[list[str]], threshold: float = 0.8) -> dict[str, float]:
    """How often the sketch and the exact Jaccard agree on "this step repeats an earlier one".

    For every step after the first of each run: is its highest similarity to an earlier
    step of the run >= ``threshold``, by the exact shingle sets and by the sketches?
    Also the mean absolute error over every pair of steps of a run.
    """
    steps = agree = repeats = pairs = 0
    error = 0.0
    for texts in runs:
        exact = [shingles(t) for t in texts]
        sketches = [sk.parse(sk.sketch(t)) for t in texts]
        for i in range(1, len(texts)):
            ex = [jaccard(exact[i], exact[j]) for j in range(i)]
            es = [sk.similarity(sketches[i], sketches[j]) for j in range(i)]
            steps += 1
            repeats += max(ex) >= threshold
            agree += (max(ex) >= threshold) == (max(es) >= threshold)
            pairs += i
            error += sum(abs(x - y) for x, y in zip(ex, es, strict=True))
    return {"steps": steps, "repeats": repeats, "agreement": agree / steps, "mae": error / pairs}
