"""The optional dependencies (extras), and the one way to ask for one.

:func:`require` imports what a feature needs or raises :class:`MissingExtraError`: one
line naming the feature, the missing module and the extra to install. The CLI prints it
without a traceback and exits 2.

>>> install_hint("redis")
"pip install -e '.[redis]' from your stopserve clone"
"""

from __future__ import annotations

import importlib
from typing import Final

from stopserve.errors import ConfigError

__all__ = ["EXTRAS", "MissingExtraError", "install_hint", "require"]

#: extra -> what it adds (pyproject.toml's ``[project.optional-dependencies]``; a test keeps them equal)
EXTRAS: Final[dict[str, str]] = {
    "train": "progress bars of train, features and evaluate (tqdm)",
    "plot": "evaluate --plot and credit --plot (matplotlib)",
    "redis": "the shared run store, STOPSERVE_STORE=redis://... (redis, msgpack)",
    "dask": "--dask and features --parquet (dask, distributed, lightgbm.dask, pyarrow)",
    "fast": "compiled inference (treelite, tl2cgen; gcc where the library is built)",
    "integrations": "AutoGen, LangGraph and OpenAI Agents SDK integrations",
    "report": "stopserve report --html, hook report --html and the live page GET /ui (plotly, jinja2)",
}


class MissingExtraError(ConfigError):
    """A feature needs an optional dependency that is not installed (a ``ConfigError``)."""

    def __init__(self, what: str, extra: str, module: str) -> None:
        super().__init__(
            f"{what} needs the [{extra}] extra ({module} is not installed): {install_hint(extra)}"
        )
        self.extra = extra
        self.module = module


def install_hint(extra: str) -> str:
    """The command that installs ``extra`` (stopserve is installed from a clone or a built wheel)."""
    return f"pip install -e '.[{extra}]' from your stopserve clone"


def require(extra: str, *modules: str, what: str) -> None:
    """Import ``modules`` (what ``what`` needs) or raise :class:`MissingExtraError` naming ``extra``."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise MissingExtraError(what, extra, exc.name or name) from None
