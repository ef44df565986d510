"""Render docs/grafana/stopserve.json's panels from a REAL Prometheus scraping a REAL stopserve.

Grafana itself cannot be installed here (no Docker, and no registry this machine reaches
packages a Grafana server: Debian has only Grafana's Go libraries, PyPI and npm only clients
and UI components), so this is the honest stand-in: Debian's ``prometheus`` scrapes a
``stopserve serve`` on a loopback port every second while real decide and outcome calls go
in; each panel's PromQL is evaluated by that Prometheus (``/api/v1/query_range``) as Grafana
would send it (``$__rate_interval`` replaced by 15 s), and the results are drawn with Plotly in
the dashboard's own grid. Headless Chromium takes the screenshot::

    python scripts/grafana_preview.py --seconds 90 --out preview.html --png docs/grafana-dashboard.png

Needs ``prometheus`` (apt-get install prometheus), ``chromium``, the [report] extra.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from servers import LiveServer, free_port  # noqa: E402

DASHBOARD = ROOT / "docs" / "grafana" / "stopserve.json"
RATE_INTERVAL = "15s"


def start_prometheus(target: str, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Debian's prometheus, scraping ``target`` (host:port) every second; its base URL."""
    port = free_port()
    config = work / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: stopserve\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=(work / "prometheus.out").open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"prometheus did not start: {(work / 'prometheus.out').read_text()[-2000:]}")


def traffic(url: str, seconds: float, seed: int = 0) -> int:
    """Real decide and outcome calls for ``seconds``: loops, budgets, runs that end, a few bad requests."""
    rng = random.Random(seed)
    end = time.monotonic() + seconds
    n = 0
    with httpx.Client(base_url=url, timeout=30) as c:
        while time.monotonic() < end:
            n += 1
            rid = f"run-{n}"
            kind = rng.random()
            steps = rng.randint(3, 14)
            safety = {"max_turns": rng.randint(3, 8)} if kind < 0.2 else None
            for i in range(steps):
                loop = kind > 0.8 and i >= 1
                ref = "sha256:00000000deadbeef" if loop else f"sha256:{rng.getrandbits(64):016x}"
                events = [
                    {
                        "id": f"{rid}-u{i}",
                        "t": 2.0 * i,
                        "type": "tool_use",
                        "agent": "coder",
                        "tool": "bash",
                        "content_ref": ref,
                        "tokens": rng.randint(200, 2000),
                    },
                    {
                        "id": f"{rid}-r{i}",
                        "t": 2.0 * i + 1,
                        "type": "return",
                        "agent": "bash",
                        "tool": "bash",
                        "content_ref": "sha256:00000000feedface"
                        if loop
                        else f"sha256:{rng.getrandbits(64):016x}",
                        "error": loop,
                        "tokens": 100,
                    },
                ]
                body: dict[str, Any] = {"events": events}
                if safety:
                    body["safety"] = safety
                answer = c.post(f"/v1/runs/{rid}/decide", json=body).json()
                if answer.get("action") == "stop":
                    break
                time.sleep(0.01)
            if rng.random() < 0.9:
                c.post(f"/v1/runs/{rid}/outcome", json={"rewards": {"team": float(rng.random() < 0.7)}})
            if rng.random() < 0.1:
                c.post(f"/v1/runs/{rid}/decide", json={"events": [{"id": "x", "t": -1}]})  # a 422
    return n


def query(prom: str, expr: str, start: float, end: float) -> dict[str, Any]:
    """One panel target over [start, end], as Grafana asks for it."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    r = httpx.get(
        prom + "/api/v1/query_range",
        params={"query": expr, "start": start, "end": end, "step": 2},
        timeout=30,
    )
    data: dict[str, Any] = r.json()
    return data


def render(dashboard: dict[str, Any], results: dict[int, list[dict[str, Any]]]) -> str:
    """The panels in the dashboard's grid, each drawn with Plotly from its query results."""
    import plotly.graph_objects as go
    import plotly.io as pio

    from stopserve.report.views import plotly_js

    cells = []
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        series = results.get(panel["id"], [])
        style = f"grid-column: {g['x'] + 1} / span {g['w']}; grid-row: {g['y'] + 1} / span {g['h']};"
        unit = panel["fieldConfig"]["defaults"].get("unit", "short")
        if panel["type"] == "stat":
            values = [(s["name"], s["values"][-1][1] if s["values"] else "–") for s in series]
            body = (
                "".join(
                    f'<div class="stat"><b>{_fmt(v, unit)}</b><span>{name}</span></div>' for name, v in values
                )
                or '<div class="nodata">No data</div>'
            )
        elif not any(s["values"] for s in series):
            body = '<div class="nodata">No data</div>'
        else:
            fig = go.Figure(
                [
                    go.Scatter(
                        x=[time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) for t, _ in s["values"]],
                        y=[float(v) for _, v in s["values"]],
                        name=s["name"],
                        mode="lines",
                    )
                    for s in series
                ]
            )
            fig.update_layout(
                template="plotly_dark",
                height=g["h"] * 30 - 40,
                margin={"t": 8, "r": 8, "b": 24, "l": 48},
                legend={"orientation": "h", "y": -0.25, "font": {"size": 10}},
                paper_bgcolor="#181b1f",
                plot_bgcolor="#181b1f",
                yaxis={"tickformat": ".0%" if unit == "percentunit" else None},
                xaxis={"nticks": 6, "tickformat": "%H:%M:%S"},
            )
            body = pio.to_html(fig, include_plotlyjs=False, full_html=False, config={"displayModeBar": False})
        cells.append(f'<div class="panel" style="{style}"><h3>{panel["title"]}</h3>{body}</div>')
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        "<title>stopserve dashboard (rendered from Prometheus)</title><style>body{background:#111217;color:#ccccdc;font:13px system-ui;margin:12px}"
        ".grid{display:grid;grid-template-columns:repeat(24,1fr);grid-auto-rows:30px;gap:6px}"
        ".panel{background:#181b1f;border:1px solid #2c3235;border-radius:3px;padding:4px 8px;"
        "overflow:hidden}"
        "h3{margin:2px 0 4px;font-size:13px;font-weight:500}.stat{display:inline-block;margin:6px 14px}"
        ".stat b{display:block;font-size:26px;color:#73bf69}.stat span{font-size:11px}"
        ".nodata{color:#6e7280;padding:30px;text-align:center}</style>"
        f"<script>{plotly_js()}</script></head><body><h2>{dashboard['title']} "
        "<small>(docs/grafana/stopserve.json, each panel's PromQL evaluated by Prometheus "
        f"{RATE_INTERVAL} rate interval; drawn with Plotly, not Grafana)</small></h2>"
        f"<div class='grid'>{''.join(cells)}</div></body></html>"
    )


def _fmt(v: Any, unit: str) -> str:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return str(v)
    return f"{x:.0%}" if unit == "percentunit" else f"{x:.4g}"


def evaluate(
    prom: str, dashboard: dict[str, Any], start: float, end: float
) -> dict[int, list[dict[str, Any]]]:
    """Every panel's targets evaluated; raises naming the panel when Prometheus refuses an expression."""
    results: dict[int, list[dict[str, Any]]] = {}
    for panel in dashboard["panels"]:
        out = []
        for target in panel["targets"]:
            data = query(prom, target["expr"], start, end)
            if data.get("status") != "success":
                raise ValueError(f"{panel['title']}: {target['expr']}: {data.get('error')}")
            for s in data["data"]["result"]:
                name = target.get("legendFormat", "")
                for k, v in s["metric"].items():
                    name = name.replace("{{" + k + "}}", v)
                out.append({"name": name or target["refId"], "values": s["values"]})
        results[panel["id"]] = out
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=90.0, help="seconds of traffic")
    p.add_argument("--out", type=Path, default=Path("grafana-preview.html"))
    p.add_argument("--png", type=Path, help="also take a screenshot with headless chromium")
    args = p.parse_args()
    dashboard = json.loads(DASHBOARD.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # a shadow challenger (a copy of the shipped model), one reload, runs left idle past a short
        # TTL: so the challenger, reload and eviction panels have data too
        env = {"STOPSERVE_ADMIN_TOKEN": "preview", "STOPSERVE_RUN_TTL_S": "5"}
        with LiveServer(log_dir=work / "logs", env=env) as server:
            prom_proc, prom = start_prometheus(server.url.removeprefix("http://"), work)
            try:
                start = time.time()
                from stopserve.settings import default_model_dir

                auth = {"Authorization": "Bearer preview"}
                model = str(default_model_dir())
                httpx.post(
                    f"{server.url}/v1/admin/challengers",
                    json={"model_dir": model, "name": "copy"},
                    headers=auth,
                    timeout=120,
                ).raise_for_status()
                runs = traffic(server.url, args.seconds / 2)
                httpx.post(f"{server.url}/v1/admin/reload", headers=auth, timeout=120).raise_for_status()
                runs += traffic(server.url, args.seconds / 2, seed=1)
                time.sleep(3)
                results = evaluate(prom, dashboard, start, time.time())
            finally:
                prom_proc.terminate()
                prom_proc.wait(timeout=30)
    args.out.write_text(render(dashboard, results))
    empty = [panel["title"] for panel in dashboard["panels"] if not results[panel["id"]]]
    print(f"{runs} runs sent; {len(dashboard['panels'])} panels evaluated; no data: {empty or 'none'}")
    if args.png:
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run(
                [
                    "chromium",
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-quic",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    f"--user-data-dir={profile}",
                    "--window-size=1600,1500",
                    "--virtual-time-budget=5000",
                    f"--screenshot={args.png.resolve()}",
                    args.out.resolve().as_uri(),
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
        print(f"screenshot: {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
