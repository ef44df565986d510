"""docs/grafana/stopserve.json: every panel's PromQL names metrics and labels the service exports."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from servers import LiveServer

from stopserve.service.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "stopserve.json"
_NAME = re.compile(r"\bstopserve_[a-z_]+\b")
_BY = re.compile(r"\bby\s*\(([^)]*)\)")
_SELECTOR = re.compile(r"(stopserve_[a-z_]+)\{([^}]*)\}")


def _exported() -> dict[str, set[str]]:
    """Sample name -> its labels, as /metrics exposes them (counters _total, histograms _bucket ...)."""
    out: dict[str, set[str]] = {}
    for family in Metrics().registry.collect():
        labels: set[str] = set()
        kind = family.type
        names = {"counter": ["_total"], "gauge": [""], "histogram": ["_bucket", "_sum", "_count"]}[kind]
        for suffix in names:
            out[family.name + suffix] = labels
    return out


def _labels() -> dict[str, set[str]]:
    """Metric -> its label names, read from /metrics once every labelled series has a child."""
    m = Metrics()
    m.count_decision("stop", "loop_detected", "loop_detector")
    m.count_rejected(422)
    m.set_model("v1", "model")
    m.evictions.labels(cause="lru").inc()
    m.reloads.labels(result="ok").inc()
    m.challenger_decisions.labels(challenger="c", agree="true").inc()
    m.challenger_runs.labels(challenger="c", stop="earlier").inc()
    m.challenger_turns_earlier.labels(challenger="c").observe(1)
    m.retrains.labels(result="ok").inc()
    found: dict[str, set[str]] = {}
    for family in m.registry.collect():
        for sample in family.samples:
            found.setdefault(family.name, set()).update(k for k in sample.labels if k != "le")
    return found


def _panels() -> list[dict[str, Any]]:
    data = json.loads(DASHBOARD.read_text())
    return list(data["panels"])


def test_every_expression_names_a_metric_the_service_exports() -> None:
    exported = _exported()
    used: set[str] = set()
    for panel in _panels():
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = set(_NAME.findall(target["expr"]))
            assert names, (panel["title"], target["expr"])
            unknown = names - set(exported)
            assert not unknown, f"{panel['title']}: {sorted(unknown)} not exported"
            used |= names
    families = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in used}
    every = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in exported}
    assert every <= families, f"metrics no panel shows: {sorted(every - families)}"


def test_every_label_an_expression_uses_is_one_the_metric_has() -> None:
    labels = _labels()
    for panel in _panels():
        for target in panel["targets"]:
            expr = target["expr"]
            metrics = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in _NAME.findall(expr)}
            have = set().union(*(labels.get(m, set()) for m in metrics)) | {"le"}
            for group in _BY.findall(expr):
                for label in filter(None, (x.strip() for x in group.split(","))):
                    assert label in have, (
                        f"{panel['title']}: by ({label}) is not a label of {sorted(metrics)}"
                    )
            for metric, selector in _SELECTOR.findall(expr):
                base = re.sub(r"_(total|bucket|sum|count)$", "", metric)
                for label in re.findall(r"(\w+)\s*!?=~?", selector):
                    assert label in labels.get(base, set()), f"{panel['title']}: {metric}{{{label}}}"


def test_the_panels_tile_the_grid_without_overlap() -> None:
    cells: set[tuple[int, int]] = set()
    ids = set()
    for panel in _panels():
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps another panel"
                cells.add((x, y))
        assert panel["id"] not in ids
        ids.add(panel["id"])
        assert panel["datasource"]["uid"] == "${datasource}"


def test_the_vendored_plotly_bundle_is_the_version_the_plotly_package_builds_for() -> None:
    from plotly.offline import get_plotlyjs

    from stopserve.report.views import plotly_js

    version = re.compile(r"plotly\.js (?:\(basic - minified\) )?(v\d+\.\d+\.\d+)")
    ours, theirs = version.search(plotly_js()[:300]), version.search(get_plotlyjs()[:300])
    assert ours and theirs and ours.group(1) == theirs.group(1), "update stopserve/report/vendor (README.md)"


@pytest.mark.slow
def test_every_panel_evaluates_on_a_real_prometheus_scraping_a_real_service(tmp_path: Path) -> None:
    """Debian's prometheus scrapes a live stopserve under real calls; every panel's PromQL is accepted."""
    if shutil.which("prometheus") is None:
        pytest.skip("no prometheus binary: apt-get install prometheus")
    spec = importlib.util.spec_from_file_location("grafana_preview", ROOT / "scripts" / "grafana_preview.py")
    assert spec is not None and spec.loader is not None
    preview = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(preview)
    dashboard = json.loads(DASHBOARD.read_text())
    with LiveServer(log_dir=tmp_path / "logs") as server:
        proc, prom = preview.start_prometheus(server.url.removeprefix("http://"), tmp_path)
        try:
            start = time.time()
            preview.traffic(server.url, 20.0)
            time.sleep(3)
            results = preview.evaluate(prom, dashboard, start, time.time())  # raises on a refused expression
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    by_title = {p["title"]: results[p["id"]] for p in dashboard["panels"]}
    for title in ("Decisions per second, by action", "Decide latency (log write included)", "Live runs"):
        assert any(s["values"] for s in by_title[title]), f"{title}: no data from a live service"
    assert "<div class='grid'>" in preview.render(dashboard, results)
