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
