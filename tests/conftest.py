"""Shared fixtures. Real data lives in ../shared/data, read in place; tests that need it
skip with a clear message when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
SWE_DIR = SHARED_DATA / "swe-verified-gemini3-train"
SURVEY_DIR = SHARED_DATA / "survey-trace-schema"
MINT_DIR = SHARED_DATA / "mint-train"
INTERCODE_DIR = SHARED_DATA / "intercode-train"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"shared data not found at {path} (tests on real runs need ../shared/data)")
    return path


@pytest.fixture(scope="session")
def swe_dir() -> Path:
    """The 306 real mini-swe-agent runs (folder with trajs/, reports/, results_summary.json)."""
    return _need(SWE_DIR)


@pytest.fixture(scope="session")
def survey_dir() -> Path:
    """The survey artifact's schema and example trace."""
    return _need(SURVEY_DIR)


@pytest.fixture(scope="session")
def mint_dir() -> Path:
    """The real MINT runs: <model>/F=.../[PHF=.../]max5_p2+tool+cd/<type>/<family>/results.jsonl.gz."""
    return _need(MINT_DIR)


@pytest.fixture(scope="session")
def intercode_dir() -> Path:
    """The real InterCode logs: <env>/<model>/<file>.json.gz."""
    return _need(INTERCODE_DIR)
