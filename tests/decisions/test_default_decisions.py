"""The shipped default model decides as it did when the fixture was recorded.

``default_decisions.json.gz`` holds its decisions on the scenario suite and on a sample of
the real corpora, recorded by ``record_decisions.py`` (first with the code at commit 08c8a42,
before the Manifest/Objective rework; see its docstring to regenerate it). Every decision
is replayed with the code at hand and compared field by field. The corpus part needs
``../shared/data`` and skips without it.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))
import record_decisions as record
from servers import LiveServer

from stopserve.policy import Policy


@cache
def fixture() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(gzip.decompress(record.FIXTURE.read_bytes()))
    return data


@cache
def shipped() -> Policy:
    return Policy.load(record.ROOT / "models" / "default")


def test_the_fixture_is_of_the_shipped_model() -> None:
    recorded = fixture()["model_files"]
    now = record.model_files(record.ROOT / "models" / "default")
    assert now == recorded, (
        "the shipped model's boosters changed since the decisions were recorded: a deliberately "
        "retrained model regenerates them (python tests/decisions/record_decisions.py) and the "
        "fixture's diff is reviewed"
    )
    assert shipped().model_version == fixture()["model_version"]
    assert fixture()["objectives"] == record.OBJECTIVES


def _first_difference(want: list[Any], got: list[Any]) -> str:
    for i, (a, b) in enumerate(zip(want, got, strict=False)):
        if a != b:
            return f"decision {i}: recorded {a}, now {b}"
    return f"{len(want)} decisions recorded, {len(got)} now"


@pytest.mark.parametrize(
    "name", sorted(json.loads(gzip.decompress(record.FIXTURE.read_bytes()))["scenarios"])
)
def test_scenario_decisions_are_unchanged(name: str) -> None:
    got = record.scenario_decisions(shipped(), only=name)[name]
    for objective, want in fixture()["scenarios"][name].items():
        assert got[objective] == want, (
            f"{name}, objective {objective}: {_first_difference(want, got[objective])}"
        )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """``stopserve serve`` with no configuration: the shipped default model."""
    with LiveServer(log_dir=tmp_path_factory.mktemp("decisions-log")) as srv:
        yield srv


def test_the_wire_answers_are_unchanged(server: LiveServer) -> None:
    # every field of every answer to every scenario, through HTTP, as recorded
    got = record.wire_decisions(server.url)
    for name, by_objective in fixture()["wire"].items():
        for objective, want in by_objective.items():
            diff = _first_difference(want, got[name][objective])
            assert got[name][objective] == want, f"{name}, objective {objective}: {diff}"


@pytest.mark.parametrize("corpus", list(record.CORPORA))
def test_corpus_decisions_are_unchanged(corpus: str) -> None:
    if not record.SHARED.is_dir():
        pytest.skip(f"{record.SHARED} not found: the real corpora are not on this machine")
    recorded: dict[str, dict[str, list[Any]]] = fixture()["corpora"][corpus]
    policy = shipped()
    n = 0
    for trace in record.corpus_traces(corpus, list(recorded)):
        got = record.replay(policy, trace)
        for objective, want in recorded[trace.trace_id].items():
            diff = _first_difference(want, got[objective])
            assert got[objective] == want, f"{corpus} trace {trace.trace_id!r}, objective {objective}: {diff}"
            n += len(want)
    assert n >= record.POINTS, f"only {n} decisions compared"
