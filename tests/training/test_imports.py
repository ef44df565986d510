"""The training modules import one another one way: the learner, evaluation and the Dask
backend share ``backend.py``, and nothing the Dask backend builds on imports it."""

from __future__ import annotations

from import_graph import circle, import_graph

import stopserve.training


def test_the_training_modules_import_one_way() -> None:
    graph = import_graph(stopserve.training)
    found = circle(graph)
    assert found is None, "import circle: " + " -> ".join(found or [])
    assert "distributed" not in graph["labels"] | graph["backend"] | graph["replay"]
    assert "fit" not in graph["distributed"] and "fit" not in graph["backend"]
