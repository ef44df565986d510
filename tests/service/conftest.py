"""Service test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest
from _service_models import tiny_model


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A tiny model that wants to stop (V_stop < 0), version 'tiny-stop'."""
    return tiny_model(tmp_path / "model-stop", "tiny-stop", stop_bias=0.4)
