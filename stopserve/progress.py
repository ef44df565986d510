"""Progress bars: one way for every command that can run longer than a few seconds.

A bar goes to stderr, only when stderr is a terminal (so ``--json`` output and logs stay
clean), and only with tqdm installed (the ``[train]`` extra; a service install shows
none). Its label says what is counted (``import mint: 1200 traces``). Each command turns
its bars off with ``--no-progress``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, TypeVar

__all__ = ["progress", "progress_bar"]

_T = TypeVar("_T")
# disable=None: only on a terminal; delay: a short job finishes before its bar appears
_OPTIONS: dict[str, Any] = {"disable": None, "delay": 0.5}


def progress(
    items: Iterable[_T], *, desc: str, unit: str, total: int | None = None, enabled: bool = True
) -> Iterable[_T]:
    """``items``, counted by a bar labelled ``desc`` in ``unit`` (e.g. ``" traces"``)."""
    bar = _tqdm(enabled)
    if bar is None:
        return items
    shown: Iterable[_T] = bar(items, desc=desc, unit=unit, total=total, file=sys.stderr, **_OPTIONS)
    return shown


def progress_bar(total: int, *, desc: str, unit: str, enabled: bool = True) -> Any:
    """A bar to ``update(n)`` and ``close()`` by hand, or None when no bar is shown."""
    bar = _tqdm(enabled)
    if bar is None:
        return None
    return bar(total=total, desc=desc, unit=unit, file=sys.stderr, **_OPTIONS)


def _tqdm(enabled: bool) -> Any:
    if not enabled or not sys.stderr.isatty():
        return None  # no bar, and tqdm not even imported (stopserve validate stays light)
    try:
        from tqdm import tqdm
    except ImportError:  # a service install: no bars
        return None
    return tqdm
