"""Shared fixtures. Real data lives in ../shared/data, read in place; tests that need it
skip with a clear message when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
SWE_DIR = SHARED_DATA / "swe-verified-gemini3-train"
SURVEY_DIR = SHARED_DATA / "survey-trace-schema"


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
