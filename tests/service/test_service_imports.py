"""The service's modules import one another one way: no circle, and the run store's
protocol (``store.py``) knows neither backend."""

from __future__ import annotations

import ast
from pathlib import Path

import stopserve.service

SERVICE = Path(stopserve.service.__file__).parent


def imports(path: Path) -> set[str]:
    """Every ``stopserve.service`` module ``path`` imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("stopserve.service."):
            found.add(node.module.removeprefix("stopserve.service."))
        elif isinstance(node, ast.Import):
            found |= {
                a.name.removeprefix("stopserve.service.")
                for a in node.names
                if a.name.startswith("stopserve.service.")
            }
    return found


def test_the_service_modules_import_one_way() -> None:
    graph = {p.stem: imports(p) for p in SERVICE.glob("*.py") if p.stem != "__init__"}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        assert module not in path, "import circle: " + " -> ".join([*path[path.index(module) :], module])
        if module in done:
            return
        for other in sorted(graph.get(module, ())):
            visit(other, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert graph["store"] == set()  # the protocol and the records: no backend
    assert {"store"} >= graph["memory_store"] and "store" in graph["redis_store"]
