"""What cost is worth, at the service's edge: ``lambda`` or ``cost_share`` parsed into one Objective."""

from __future__ import annotations

import json
from pathlib import Path

from test_service_app import lines, make_client, turn_events


def test_lambda_and_cost_share_together_are_a_422_naming_lambda_and_nothing_is_folded(tmp_path: Path) -> None:
    with make_client(tmp_path) as client:
        r = client.post(
            "/v1/runs/both/decide", json={"events": turn_events(0), "lambda": 0.1, "cost_share": 0.3}
        )
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert error["type"] == "config_error" and "not both" in error["message"]
        assert [i["field"] for i in error["issues"]] == ["lambda"]
        # all or nothing: the run took none of the call's events
        ok = client.post("/v1/runs/both/decide", json={"events": turn_events(0), "cost_share": 0.3})
        assert ok.status_code == 200 and ok.json()["events_accepted"] == 2, ok.text
        stateless = client.post(
            "/v1/decide", json={"events": turn_events(0), "lambda": 0.1, "cost_share": 0.3}
        )
        assert stateless.status_code == 422 and stateless.json()["error"]["type"] == "config_error"


def test_the_log_line_names_the_objective_in_force(tmp_path: Path) -> None:
    with make_client(tmp_path) as client:
        client.post("/v1/runs/a/decide", json={"events": turn_events(0), "cost_share": 0.5})
        client.post("/v1/runs/a/decide", json={"events": turn_events(1)})  # sticks to the run
        client.post("/v1/runs/a/decide", json={"events": turn_events(2), "lambda": 0.2})  # replaces it
    decisions = [d for d in lines(tmp_path / "logs" / "decisions.jsonl") if d.get("kind") == "decision"]
    got = [(d["lambda"], d["cost_share"]) for d in decisions]
    assert got == [(None, 0.5), (None, 0.5), (0.2, None)], json.dumps(got)
