"""Which modules of a package import which (at the top or inside a function): for the tests that
keep the arrows running one way."""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType


def import_graph(package: ModuleType) -> dict[str, set[str]]:
    """Module name -> the modules of ``package`` it imports (names relative to the package)."""
    root = Path(package.__file__ or "").parent
    prefix = package.__name__ + "."
    graph: dict[str, set[str]] = {}
    for path in root.glob("*.py"):
        if path.stem == "__init__":
            continue
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(prefix):
                found.add(node.module.removeprefix(prefix).split(".")[0])
            elif isinstance(node, ast.Import):
                found |= {
                    a.name.removeprefix(prefix).split(".")[0] for a in node.names if a.name.startswith(prefix)
                }
        graph[path.stem] = found - {path.stem}
    return graph


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """An import circle of ``graph`` (its modules in order, the first again at the end), or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for other in sorted(graph.get(module, ())):
            found = visit(other, [*path, module])
            if found:
                return found
        done.add(module)
        return None

    for module in sorted(graph):
        found = visit(module, [])
        if found:
            return found
    return None
