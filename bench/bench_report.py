"""The report and the live page: a page of 10,000 runs in a real browser, and a look at a 1 GB log.

``python bench/bench_report.py [--size tiny|quick|full] [--out F.json]``

1. **Page load.** A log directory of N runs (full: 10,000; decisions and traces written by
   the service's own log writer, ``DecisionLog``) is summarised and drawn
   (``stopserve report --html``); headless Chromium (Debian's, through Playwright) loads the
   file until every chart is drawn. Baseline in the same run: a page holding only plotly.js
   and one empty chart (what any Plotly page costs). Target: the 10,000-run page loads in
   under 2 s.
2. **Live page over a big log.** ``decisions.jsonl`` of S bytes (full: 1 GiB). The live page's
   follower (``LiveLogs``) takes its first look (the newest 32 MiB), then 1,000 decisions are
   appended and it looks again; baseline: reading the whole log (``stopserve report``'s
   path) in the same run.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "report"))

from _common import Section, Target, parser

RUNS = {"tiny": 500, "quick": 3000, "full": 10_000}
BIG = {"tiny": 16 << 20, "quick": 256 << 20, "full": 1 << 30}
T0 = 1_796_000_000.0


def write_runs(log_dir: Path, n: int, seed: int = 0) -> None:
    """``n`` runs as the service logs them (its own writer): decisions, then each run's trace."""
    from stopserve.service.log import DecisionLog

    rng = random.Random(seed)
    log = DecisionLog(log_dir)
    try:
        for r in range(n):
            rid = f"run-{r:05d}"
            start = T0 + r * 30.0
            steps = rng.randint(3, 25)
            kind = rng.random()
            events = []
            for k in range(steps):
                loop = kind > 0.85 and k > 2
                stop = k == steps - 1 and kind > 0.6
                reason = None
                net = None
                if stop:
                    reason, net = (
                        ("loop_detected", "loop_detector")
                        if loop
                        else ("budget_exhausted", "max_turns")
                        if kind > 0.75
                        else ("no_progress", None)
                    )
                log.decision(
                    {
                        "kind": "decision",
                        "ts": start + 2 * k,
                        "run_id": rid,
                        "seq": k,
                        "event_id": f"{rid}-{k}",
                        "n_events": k + 1,
                        "action": "stop" if stop else "continue",
                        "reason": reason,
                        "v_stop": rng.uniform(-0.3, 0.3),
                        "q_continue": None,
                        "q_stop": None,
                        "cost_to_go": rng.uniform(1, 30),
                        "turn": k + 1,
                        "safety_net": net,
                        "limit": None,
                        "pattern": "repeated_action_observation" if stop and loop else None,
                        "finalize": stop,
                        "model_version": "bench-model",
                        "propensity": 1.0,
                        "explored": False,
                        "degraded": False,
                        "rule": None,
                        "message": None,
                        "proposal": None,
                        "lambda": None,
                        "cost_share": None,
                        "proposed_stop": False,
                    }
                )
                ref = "sha256:000000000000beef" if loop else f"sha256:{rng.getrandbits(64):016x}"
                events.append(
                    {
                        "id": f"{rid}-{k}",
                        "t": 2.0 * k,
                        "type": "tool_use",
                        "agent": "coder",
                        "tool": "bash",
                        "content_ref": ref,
                        "tokens": rng.randint(200, 3000),
                        "decision": {"action": "continue"},
                    }
                )
            if rng.random() < 0.9:
                log.trace(
                    {
                        "format": "stopserve.trace/1",
                        "trace_id": rid,
                        "task_id": rid,
                        "events": events,
                        "rewards": {"team": float(rng.random() < 0.7)},
                        "metrics": {"service_started": start},
                    }
                )
    finally:
        log.close()


def page_load(html: Path, profile: Path) -> float:
    """Seconds from navigation until every chart on the page is drawn (headless Chromium)."""
    from browser import chromium

    with chromium(profile) as page:
        t = time.perf_counter()
        page.goto(html.as_uri(), wait_until="load")
        page.wait_for_function(
            "[...document.querySelectorAll('.plotly-graph-div')].every(d => d.querySelector('.main-svg'))",
            timeout=60_000,
        )
        return time.perf_counter() - t


def big_log(log_dir: Path, size: int) -> int:
    """A decisions.jsonl of about ``size`` bytes (distinct runs of 20 decisions); its line count."""
    import orjson

    log_dir.mkdir(parents=True, exist_ok=True)
    lines = 0
    with (log_dir / "decisions.jsonl").open("wb") as out:
        written = 0
        r = 0
        while written < size:
            block = []
            for _ in range(500):
                for k in range(20):
                    block.append(
                        orjson.dumps(
                            {
                                "kind": "decision",
                                "ts": T0 + r * 40 + 2 * k,
                                "run_id": f"big-{r:07d}",
                                "seq": k,
                                "action": "stop" if k == 19 else "continue",
                                "reason": "no_progress" if k == 19 else None,
                                "v_stop": -0.1,
                                "cost_to_go": 3.0,
                                "turn": k + 1,
                                "safety_net": None,
                                "model_version": "bench-model",
                                "propensity": 1.0,
                            }
                        )
                        + b"\n"
                    )
                r += 1
            data = b"".join(block)
            out.write(data)
            written += len(data)
            lines += len(block)
    return lines


def main() -> None:
    args = parser(__doc__.split("\n")[0]).parse_args()
    sec = Section("Report: a 10,000-run page in a browser, and the live page over a 1 GB log", sys.argv)
    from stopserve.report.commands import summarize_dirs
    from stopserve.report.live import LiveLogs
    from stopserve.report.views import plotly_js, render

    n = RUNS[args.size]
    data: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        logs = tmp / "logs"
        write_runs(logs, n)
        t = time.perf_counter()
        summary = summarize_dirs([logs])
        html = render(summary)
        build_s = time.perf_counter() - t
        page = tmp / "report.html"
        page.write_text(html)
        from plotly.offline import get_plotlyjs

        bare, full_bare = tmp / "bare.html", tmp / "bare-full.html"
        for where, js in ((bare, plotly_js()), (full_bare, get_plotlyjs())):
            where.write_text(
                f"<html><head><script>{js}</script></head><body><div id='c' class='plotly-graph-div'>"
                "</div><script>Plotly.newPlot('c', [{y: [1, 2]}])</script></body></html>"
            )
        loads: list[float] = []
        bares: list[float] = []
        fulls: list[float] = []
        for i in range(3):  # alternated: the machine is shared
            bares.append(page_load(bare, tmp / f"p-bare-{i}"))
            loads.append(page_load(page, tmp / f"p-page-{i}"))
            fulls.append(page_load(full_bare, tmp / f"p-full-{i}"))
        load_s, bare_s, full_s0 = sorted(loads)[1], sorted(bares)[1], sorted(fulls)[1]
        data["page"] = {
            "runs": summary.n_runs,
            "decisions": summary.n_decisions,
            "html_bytes": len(html.encode()),
            "build_s": build_s,
            "load_s": loads,
            "bare_plotly_basic_load_s": bares,
            "bare_plotly_full_load_s": fulls,
        }
        sec.add(
            f"{summary.n_runs} runs, {summary.n_decisions} decisions; page {len(html.encode()) / 1e6:.1f} MB "
            f"(plotly.js's basic bundle 1.2 MB of it), summarised and drawn in {build_s:.2f} s. Load until "
            "every chart is drawn, headless Chromium, median of 3 alternated with a bare page of each "
            "plotly.js bundle and one chart:",
            "",
        )
        sec.table(
            ["page", "load s", "/ bare page, basic bundle"],
            [
                ["the report", load_s, load_s / bare_s],
                ["bare page, plotly.js basic bundle (1.2 MB, the one inlined)", bare_s, 1.0],
                ["bare page, plotly.js full bundle (4.8 MB)", full_s0, full_s0 / bare_s],
            ],
        )
        sec.targets.append(Target(f"a page of {n} runs loads", f"{load_s:.2f} s", "< 2 s", load_s < 2.0))

        big = tmp / "big"
        lines = big_log(big, BIG[args.size])
        size = (big / "decisions.jsonl").stat().st_size
        t = time.perf_counter()
        full = summarize_dirs([big])
        full_s = time.perf_counter() - t
        live = LiveLogs(big, ttl_s=0.0)
        t = time.perf_counter()
        first = live.summary()
        first_s, first_read = time.perf_counter() - t, live.last_read
        live.page(plotly_src="/ui/plotly.min.js")
        with (big / "decisions.jsonl").open("ab") as fh:
            for k in range(1000):
                fh.write(
                    b'{"kind":"decision","ts":%d,"run_id":"late-%d","seq":0,"action":"continue","turn":1}\n'
                    % (int(T0) + k, k)
                )
        t = time.perf_counter()
        html = live.page(plotly_src="/ui/plotly.min.js")
        next_s, next_read = time.perf_counter() - t, live.last_read
        data["live"] = {
            "log_bytes": size,
            "lines": lines,
            "full_read_s": full_s,
            "full_runs": full.n_runs,
            "first_look_s": first_s,
            "first_look_bytes": first_read,
            "first_look_runs": first.n_runs,
            "next_look_s": next_s,
            "next_look_bytes": next_read,
        }
        sec.add(
            "",
            f"Live page over a decisions.jsonl of {size / (1 << 20):.0f} MiB ({lines} lines); "
            "baseline: reading it whole (`stopserve report`) in the same run:",
            "",
        )
        sec.table(
            ["look", "bytes read", "seconds", "/ whole read"],
            [
                ["whole log (`stopserve report`)", size, full_s, 1.0],
                ["live page, first look (newest 32 MiB)", first_read, first_s, first_s / full_s],
                ["live page, after 1,000 new decisions (page drawn)", next_read, next_s, next_s / full_s],
            ],
        )
        sec.targets.append(
            Target(
                "a look after 1,000 new decisions reads only them",
                f"{next_read} bytes",
                "< 200 KB",
                next_read < 200_000,
            )
        )
    sec.data = data
    sec.emit(args.out)


if __name__ == "__main__":
    main()
