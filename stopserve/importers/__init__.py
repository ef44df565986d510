"""Importers: one module per foreign trace format, each exposing
``read(sources, **options) -> Iterator[Trace]``.

``IMPORTERS`` maps the CLI format names to those functions. Every importer yields
valid format-v1 traces one at a time; what it cannot convert raises
:class:`stopserve.errors.ImporterError` (naming file, line and field), or, when an
``on_error`` callback is passed, goes to it and is skipped.

>>> sorted(IMPORTERS)
['claude-code', 'codex', 'intercode', 'mini-swe-agent', 'mint', 'openai-chat', 'otel', 'survey']
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from stopserve.trace import Trace

__all__ = ["IMPORTERS", "MODULES"]

#: CLI format name -> module under ``stopserve.importers``
MODULES: Final[dict[str, str]] = {
    "survey": "survey",
    "mini-swe-agent": "mini_swe_agent",
    "openai-chat": "openai_chat",
    "otel": "otel",
    "mint": "mint",
    "intercode": "intercode",
    "claude-code": "claude_code",
    "codex": "codex",
}


def _lazy(module: str) -> Callable[..., Iterator[Trace]]:
    # import the module only when its format is used
    def read(*args: Any, **options: Any) -> Iterator[Trace]:
        mod = importlib.import_module(f"stopserve.importers.{module}")
        reader: Callable[..., Iterator[Trace]] = mod.read
        return reader(*args, **options)

    read.__name__ = f"read_{module}"
    read.__doc__ = f"``stopserve.importers.{module}.read``, imported on first use."
    return read


IMPORTERS: Final[dict[str, Callable[..., Iterator[Trace]]]] = {
    name: _lazy(mod) for name, mod in MODULES.items()
}
