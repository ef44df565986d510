"""The views: a :class:`~stopserve.report.summary.Summary` drawn as one HTML page.

Charts are Plotly figures (``plotly.graph_objects``, drawn by plotly.js in the browser), the
page a Jinja2 template (``templates/report.html.j2``, autoescaped: run ids, reasons and the
snippets users log are text, never markup). Both come with the ``[report]`` extra. The
report inlines plotly.js (its basic partial bundle, 1.2 MB, MIT licence, vendored in
``vendor/``: the figures are scatter and bar traces only), so the file opens with no
network; the live page links it from the service instead (``plotly_src``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any, Final

from stopserve.extras import require
from stopserve.report.summary import END_KINDS, DecisionPoint, Summary

__all__ = ["COLORS", "plotly_js", "render"]

COLORS: Final[Mapping[str, str]] = {
    "budget": "#d62728",
    "rule": "#ff7f0e",
    "model": "#1f77b4",
    "agent": "#2ca02c",
    "open": "#8c8c8c",
}
_CONFIG: Final = {"displayModeBar": False, "responsive": True}  # drag zooms, a double click resets
_WIDTHS: Final = {
    60.0: "1-minute",
    300.0: "5-minute",
    900.0: "15-minute",
    3600.0: "hourly",
    21600.0: "6-hour",
    86400.0: "daily",
    604800.0: "weekly",
    2592000.0: "30-day",
}


def _require() -> None:
    require("report", "plotly", "jinja2", what="the HTML report and the live page")


@functools.cache
def plotly_js() -> str:
    """plotly.js 4.1.1's basic bundle (scatter, bar, pie; MIT licence), vendored: vendor/README.md."""
    _require()
    from importlib.resources import files

    return files("stopserve.report").joinpath("vendor", "plotly-basic.min.js").read_text(encoding="utf-8")


@functools.cache
def _environment() -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("stopserve.report", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _when(ts: float | None) -> str:
    return "" if ts is None else _iso(ts)


def _num(x: float | None, digits: int | None = None) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    if digits is not None:
        return f"{x:.{digits}f}"
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}" if a else "0"


def _pct(n: int, d: int) -> str:
    return f"{100.0 * n / d:.1f}%" if d else "–"


def _dash(x: Any) -> str:
    return "–" if x is None else str(x)


def _div(fig: Any, div_id: str) -> str:
    import plotly.io as pio

    html: str = pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=div_id, config=_CONFIG)
    return html


def _layout(height: int = 320, **more: Any) -> dict[str, Any]:
    return {
        "height": height,
        "margin": {"t": 30, "r": 20, "b": 40, "l": 60},
        "legend": {"orientation": "h", "x": 1, "xanchor": "right", "y": 1.0, "yanchor": "bottom"},
        # no template: plotly's default ones put ~10 KB of styling into every figure, which plotly.js
        # then processes per chart; the few styles the page uses instead
        "template": "none",
        "plot_bgcolor": "white",
        "xaxis": {"gridcolor": "#e5e9f0", "automargin": True, **more.pop("xaxis", {})},
        "yaxis": {"gridcolor": "#e5e9f0", "automargin": True, **more.pop("yaxis", {})},
        "font": {"family": "system-ui, sans-serif", "size": 12, "color": "#1d2430"},
        **more,
    }


def _figures(s: Summary) -> dict[str, str]:
    import plotly.graph_objects as go

    figs: dict[str, str] = {}
    if s.bins:
        x = [_iso(b.start) for b in s.bins]
        runs = go.Figure(
            [
                go.Bar(x=x, y=[b.ends.get(k, 0) for b in s.bins], name=k, marker_color=COLORS[k])
                for k in END_KINDS
                if any(k in b.ends for b in s.bins)
            ]
        )
        runs.update_layout(**_layout(barmode="stack", yaxis_title="runs started", bargap=0.1))
        figs["runs"] = _div(runs, "runs-chart")
    if s.stops_by_reason:
        stops = go.Figure()
        for kind in ("budget", "rule", "model"):
            rows = [(r, n) for r, k, n in s.stops_by_reason if k == kind]
            if rows:
                stops.add_trace(
                    go.Bar(
                        y=[r for r, _ in rows],
                        x=[n for _, n in rows],
                        name=kind,
                        orientation="h",
                        marker_color=COLORS[kind],
                    )
                )
        stops.update_layout(**_layout(barmode="stack", xaxis_title="runs stopped"))
        figs["stops"] = _div(stops, "stops-chart")
    if s.cost.cumulative:
        when = [_iso(t) for t, _, _ in s.cost.cumulative]
        cost = go.Figure(
            [
                go.Scatter(
                    x=when,
                    y=[c for _, c, _ in s.cost.cumulative],
                    name=f"spent ({s.cost.unit})",
                    mode="lines",
                    line={"color": "#5b6576"},
                ),
                go.Scatter(
                    x=when,
                    y=[v for _, _, v in s.cost.cumulative],
                    name=f"saved, estimated ({s.cost.unit})",
                    mode="lines",
                    line={"color": COLORS["agent"]},
                    fill="tozeroy",
                ),
            ]
        )
        cost.update_layout(**_layout(yaxis_title=f"cumulative {s.cost.unit}"))
        figs["cost"] = _div(cost, "cost-chart")
    if s.outcomes:
        outcomes = go.Figure(
            go.Bar(
                x=[o.end for o in s.outcomes],
                y=[o.successes / o.runs if o.runs else 0 for o in s.outcomes],
                marker_color=[COLORS[o.end] for o in s.outcomes],
                text=[f"{o.successes}/{o.runs}" for o in s.outcomes],
                textposition="auto",
            )
        )
        outcomes.update_layout(**_layout(yaxis_title="success rate", yaxis_range=[0, 1]))
        figs["outcomes"] = _div(outcomes, "outcomes-chart")
    if s.timelines:
        # drawn by the page's script for the run chosen (an empty figure first would be drawn twice)
        figs["timeline"] = '<div id="timeline-chart" class="plotly-graph-div" style="height:340px"></div>'

    judged = [
        p
        for p in s.models.promotions
        if p.ts is not None and (p.champion is not None or p.candidate is not None)
    ]
    if judged:
        learning = go.Figure()
        for name, color in (("champion", "#5b6576"), ("candidate", COLORS["model"])):
            pts = [
                (p, getattr(p, name), getattr(p, name + "_ci"))
                for p in judged
                if getattr(p, name) is not None
            ]
            learning.add_trace(
                go.Scatter(
                    x=[_iso(p.ts or 0.0) for p, _, _ in pts],
                    y=[v for _, v, _ in pts],
                    name=name,
                    mode="lines+markers",
                    line={"color": color},
                    error_y={
                        "type": "data",
                        "symmetric": False,
                        "array": [(ci[1] - v) if ci else 0 for _, v, ci in pts],
                        "arrayminus": [(v - ci[0]) if ci else 0 for _, v, ci in pts],
                    },
                )
            )
        promoted = [p for p in judged if p.kind == "promotion" and p.candidate is not None]
        if promoted:
            learning.add_trace(
                go.Scatter(
                    x=[_iso(p.ts or 0.0) for p in promoted],
                    y=[p.candidate for p in promoted],
                    name="promoted",
                    mode="markers",
                    marker={"symbol": "star", "size": 14, "color": COLORS["agent"]},
                )
            )
        learning.update_layout(**_layout(yaxis_title="value per run (DR, off-policy)"))
        figs["learning"] = _div(learning, "learning-chart")
    return figs


def render(s: Summary, *, live: bool = False, plotly_src: str | None = None, refresh_s: int = 30) -> str:
    """The page: self-contained (plotly.js inlined) unless ``plotly_src`` says where to load it from."""
    _require()
    from markupsafe import Markup, escape

    labelled = sum(o.runs for o in s.outcomes)
    successes = sum(o.successes for o in s.outcomes)

    def runlink(run_id: str) -> Markup:
        if run_id in s.timelines:
            return Markup('<a href="#run={0}">{1}</a>').format(_hash_id(run_id), run_id)
        return escape(run_id)

    template = _environment().get_template("report.html.j2")
    return str(
        template.render(
            s=s,
            live=live,
            refresh_s=refresh_s,
            plotly_src=plotly_src,
            plotly_js=plotly_js() if plotly_src is None else "",
            figs=_figures(s),
            timelines={rid: [_point(p) for p in pts] for rid, pts in s.timelines.items()},
            unit=s.cost.unit,
            width=_WIDTHS.get(s.bin_seconds, f"{s.bin_seconds:g}-second"),
            success_rate=_pct(successes, labelled),
            n_labelled=labelled,
            when=_when,
            num=_num,
            pct=_pct,
            dash=_dash,
            runlink=runlink,
        )
    )


_POINT_FIELDS: Final = tuple(f.name for f in fields(DecisionPoint))


def _point(p: DecisionPoint) -> dict[str, Any]:
    """A decision point as the page's JSON (not ``asdict``: its deep copy costs more than the page)."""
    return {name: getattr(p, name) for name in _POINT_FIELDS}


def _hash_id(run_id: str) -> str:
    from urllib.parse import quote

    return quote(run_id, safe="")
