"""The report and the live page in a real browser: what a person sees.

The report is the file ``stopserve report --html`` writes from logs a real server wrote;
the live page is ``GET /ui`` of a real ``stopserve serve`` on a loopback port, fed by real
decide and outcome calls while the page is open. Screenshots go to the test's tmp dir.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from _logs import LOOP_REF, SNIPPET, drive
from browser import chromium
from servers import LiveServer

TOKEN = "report-test-token"


def _report(logs: Path, out: Path) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "stopserve", "report", str(logs), "--html", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out


def test_the_report_file_shows_runs_stops_loops_and_a_chosen_runs_timeline(
    served: tuple[Path, dict[str, dict[str, Any]]], tmp_path: Path
) -> None:
    log_dir, _ = served
    html = _report(log_dir, tmp_path / "report.html")
    with chromium(tmp_path / "profile") as page:
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto(html.as_uri())
        assert page.title() == "stopserve report"
        assert page.inner_text("#n-runs") == "6"
        assert page.inner_text("#n-stopped") == "2"
        assert page.inner_text("#n-loops") == "1"
        # the charts were drawn by plotly.js, inlined: no request left the file
        page.wait_for_selector("#runs-chart .main-svg")
        page.wait_for_selector("#stops-chart .main-svg")
        assert all(u.startswith(("file:", "data:", "about:")) for u in requests), requests
        loops = page.inner_text("#loops-table")
        assert LOOP_REF in loops and SNIPPET in loops and "repeated_action_error" in loops
        stops = page.inner_text("#stops-table")
        assert "loop_detected" in stops and "budget_exhausted" in stops
        assert "How the saving is estimated" in page.inner_text("#cost-how")
        assert page.inner_text("#champion") == "cand-2"
        assert "refusal" in page.inner_text("#promotions-table")
        page.wait_for_selector("#learning-chart .main-svg")
        # choose a run: its timeline is every decision, the last one the budget's stop
        page.select_option("#run-select", "budget-1")
        rows = page.locator("#timeline-table tbody tr")
        logged = (log_dir / "decisions.jsonl").read_text().count('"run_id":"budget-1"')
        assert rows.count() == logged > 1
        last_row = rows.nth(rows.count() - 1).inner_text()
        assert "stop" in last_row and "budget_exhausted" in last_row and "max_turns" in last_row
        assert page.inner_text("#timeline-summary").startswith("budget-1: ")
        page.wait_for_selector("#timeline-chart .main-svg")
        # a run's link in the runs table opens its timeline
        page.click("#runs-table a[href='#run=loop-1']")
        page.wait_for_function("document.getElementById('run-select').value === 'loop-1'")
        assert "loop_detected" in page.locator("#timeline-table tbody tr").last.inner_text()
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_the_live_page_follows_the_service_as_it_decides(tmp_path: Path) -> None:
    env = {"STOPSERVE_ADMIN_TOKEN": TOKEN}
    with LiveServer(log_dir=tmp_path / "logs", no_model=True, env=env) as server:
        drive(server.url)
        with chromium(tmp_path / "profile") as page:
            page.goto(f"{server.url}/ui?token={TOKEN}")
            assert page.url == f"{server.url}/ui"  # the token left the address bar (a cookie holds it)
            assert page.title() == "stopserve live"
            assert page.inner_text("#n-runs") == "6"
            assert page.inner_text("#n-loops") == "1"
            page.wait_for_selector("#runs-chart .main-svg")
            # more runs are decided while the page is open; the next look shows them
            drive(server.url, prefix="b-")
            page.reload()
            assert page.inner_text("#n-runs") == "12"
            assert page.inner_text("#n-loops") == "2"
            page.select_option("#run-select", "b-loop-1")
            assert "loop_detected" in page.locator("#timeline-table tbody tr").last.inner_text()
            page.screenshot(path=str(tmp_path / "live.png"), full_page=True)
        assert (tmp_path / "live.png").stat().st_size > 10_000


def test_the_live_page_is_behind_the_admin_token(tmp_path: Path) -> None:
    with LiveServer(log_dir=tmp_path / "off", no_model=True) as server:
        r = httpx.get(f"{server.url}/ui")
        assert r.status_code == 401
        assert r.json()["error"]["message"].startswith("the live page is disabled: set STOPSERVE_ADMIN_TOKEN")
    with LiveServer(log_dir=tmp_path / "on", no_model=True, env={"STOPSERVE_ADMIN_TOKEN": TOKEN}) as server:
        assert httpx.get(f"{server.url}/ui").status_code == 401
        assert httpx.get(f"{server.url}/ui", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert httpx.get(f"{server.url}/ui?token=nope").status_code == 401
        ok = httpx.get(f"{server.url}/ui", headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200 and "<title>stopserve live</title>" in ok.text
        login = httpx.get(f"{server.url}/ui?token={TOKEN}")
        assert login.status_code == 303 and login.headers["location"] == "/ui"
        cookie = login.headers["set-cookie"]
        assert TOKEN not in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
        with httpx.Client(base_url=server.url, cookies=login.cookies) as c:
            assert c.get("/ui").status_code == 200
            js = c.get("/ui/plotly.min.js")
            assert js.status_code == 200 and "plotly.js" in js.text[:200]
            again = c.get("/ui/plotly.min.js", headers={"if-none-match": js.headers["etag"]})
            assert again.status_code == 304
