"""The service's modules import one another one way: no circle, and the run store's
protocol (``store.py``) knows neither backend."""

from __future__ import annotations

from import_graph import circle, import_graph

import stopserve.service


def test_the_service_modules_import_one_way() -> None:
    graph = import_graph(stopserve.service)
    found = circle(graph)
    assert found is None, "import circle: " + " -> ".join(found or [])
    assert graph["store"] == set()  # the protocol and the records: no backend
    assert {"store"} >= graph["memory_store"] and "store" in graph["redis_store"]


#: The service's HTTP layer: the app, its routers, dependencies, body reading, error handlers.
HTTP = {"app", "body", "deps", "errors", "middleware", "routes"}


def test_the_core_of_the_service_knows_nothing_of_http() -> None:
    """The engine and its parts import neither FastAPI nor Starlette nor the HTTP layer, at any depth."""
    import ast
    from pathlib import Path

    root = Path(stopserve.service.__file__ or "").parent
    graph = import_graph(stopserve.service)
    core = set(graph) - HTTP
    assert {"engine", "serving", "decide", "decider", "runs", "outcome", "recorder"} <= core
    for name in sorted(core):
        assert not graph[name] & HTTP, (name, graph[name] & HTTP)
        tree = ast.parse((root / f"{name}.py").read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        web = {m for m in imported if m.split(".")[0] in ("fastapi", "starlette")}
        assert not web, (name, web)
