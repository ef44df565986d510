"""The texts of real runs, step by step, read from ../shared/data (for the sketch tests and bench).

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
