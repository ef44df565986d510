"""The charts' one way to matplotlib (the ``[plot]`` extra): a headless pyplot, and saving a figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stopserve.errors import TrainingError
from stopserve.extras import require

__all__ = ["pyplot", "save"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` drawing to files (no display needed), or a one-line missing-extra error."""
    require("plot", "matplotlib", what="--plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: str | Path) -> None:
    """Write ``fig`` as a PNG and close it; an unwritable path is a :class:`TrainingError`."""
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise TrainingError(f"{path}: cannot write the chart: {exc.strerror or exc}") from exc
    finally:
        pyplot().close(fig)
