"""Issue 13, item 2: every id and free string is capped, a decision line is bounded, old logs go."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_service_app import make_client, turn_events

from stopserve.service.log import JsonlLog


def event(**extra: Any) -> dict[str, Any]:
    return {"id": "e1", "t": 1.0, "type": "return", "agent": "coder", **extra}


LONG = "x" * 257


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"events": [event(id=LONG)]}, "body.events[0].id"),
        ({"events": [event(agent=LONG)]}, "body.events[0].agent"),
        ({"events": [event(tool=LONG)]}, "body.events[0].tool"),
        ({"events": [event(role=LONG)]}, "body.events[0].role"),
        ({"events": [event(to=LONG)]}, "body.events[0].to"),
        ({"events": [event(**{"from": LONG})]}, "body.events[0].from"),
        ({"events": [event(channel=LONG)]}, "body.events[0].channel"),
        ({"events": [event(content_ref="x" * 4097)]}, "body.events[0].content_ref"),
        ({"events": [], "task_id": LONG}, "body.task_id"),
        ({"events": [], "system": LONG}, "body.system"),
    ],
)
def test_ids_and_strings_over_their_cap_are_refused(tmp_path: Path, body: dict[str, Any], field: str) -> None:
    with make_client(tmp_path) as c:
        r = c.post("/v1/runs/r/decide", json=body)
        assert r.status_code == 422, r.text
        assert [i["field"] for i in r.json()["error"]["issues"]] == [field]
        r = c.post("/v1/decide", json={"events": [event()], "run_id": LONG})
        assert r.status_code == 422 and r.json()["error"]["issues"][0]["field"] == "body.run_id"


def test_strings_at_their_cap_are_taken(tmp_path: Path) -> None:
    at = "y" * 256
    with make_client(tmp_path) as c:
        body = {"events": [event(id=at, agent=at, content_ref="z" * 4096)], "task_id": at, "system": at}
        assert c.post("/v1/runs/r/decide", json=body).status_code == 200


def test_a_decision_line_is_bounded_whatever_the_ids(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "decisions.jsonl"
    with make_client(tmp_path) as c:
        # the attack: one huge event id, then empty decides, each logging that id again
        c.post("/v1/runs/huge/decide", json={"events": [event(id="i" * 100_000)]})
        for _ in range(20):
            c.post("/v1/runs/huge/decide", json={})
        run_id = "r" * 256
        first = {"events": [event(id="i" * 256, agent="a" * 256)], "task_id": "t" * 256, "system": "s" * 256}
        assert c.post(f"/v1/runs/{run_id}/decide", json=first).status_code == 200
        for _ in range(20):
            assert c.post(f"/v1/runs/{run_id}/decide", json={}).status_code == 200
    sizes = [len(line) for line in log.read_bytes().splitlines()]
    assert len(sizes) >= 21 and max(sizes) <= 2048, max(sizes)
    assert log.stat().st_size <= 42 * 2048


def test_rotated_logs_are_kept_within_the_retention_limit(tmp_path: Path) -> None:
    log = JsonlLog(tmp_path / "d.jsonl", max_bytes=4096, retain_bytes=16384)
    for i in range(2000):
        log.append({"n": i, "pad": "x" * 40})
    log.close()
    files = list(tmp_path.glob("d*.jsonl"))
    assert sum(f.stat().st_size for f in files) <= 16384
    newest = max(int(line.split(b",")[0][5:]) for line in (tmp_path / "d.jsonl").read_bytes().splitlines())
    assert newest == 1999  # the newest lines are the ones kept


def test_retention_is_a_setting(tmp_path: Path) -> None:
    with make_client(tmp_path, log_max_bytes=4096, log_retain_bytes=3 * 4096) as c:
        for i in range(150):
            c.post(f"/v1/runs/r{i}/decide", json={"events": turn_events(0)})
    files = list((tmp_path / "logs").glob("decisions*.jsonl"))
    assert len(files) >= 2 and sum(f.stat().st_size for f in files) <= 3 * 4096
