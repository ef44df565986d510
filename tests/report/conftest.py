"""Report test fixtures: log directories a real server wrote."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from _logs import drive, promote
from servers import LiveServer

from stopserve.settings import default_model_dir


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    """A log directory written by a real server (the shipped model), with two retrains' verdicts."""
    log_dir = tmp_path_factory.mktemp("served") / "logs"
    with LiveServer(log_dir=log_dir) as server:
        last = drive(server.url)
    model = default_model_dir()
    assert model is not None, "the shipped default model is missing"
    promote(log_dir / "models", model)
    (log_dir / "server.out").unlink(missing_ok=True)
    return log_dir, last


@pytest.fixture
def logs(served: tuple[Path, dict[str, dict[str, Any]]], tmp_path: Path) -> Path:
    """A copy of the served log directory the test may change."""
    dest = tmp_path / "logs"
    shutil.copytree(served[0], dest)
    return dest
