"""Run the ``stopserve`` command as if some packages were not installed.

``python tests/hide_modules.py redis,msgpack serve ...``: importing a hidden top-level
package (or anything under it) raises ``ModuleNotFoundError`` exactly as a missing one does.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


class _Hide(importlib.abc.MetaPathFinder):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


if __name__ == "__main__":
    sys.meta_path.insert(0, _Hide(set(sys.argv[1].split(","))))
    from stopserve.cli import main

    raise SystemExit(main(sys.argv[2:]))
