"""Issue 13, item 5: numbers out of range are a 422 naming the field; a batch answers per item."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_service_app import lines, make_client, turn_events

from stopserve.service.app import create_app
from stopserve.settings import Settings

HUGE = b"1" + b"0" * 30
VAST = b"1" + b"0" * 400
EVENT = b'{"id":"a","t":1,"type":"return","agent":"x"}'


def post(c: TestClient, path: str, body: bytes) -> tuple[int, dict]:  # type: ignore[type-arg]
    r = c.post(path, content=body, headers={"content-type": "application/json"})
    return r.status_code, r.json()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"events":[' + EVENT + b'],"safety":{"max_turns":' + HUGE + b"}}", "safety.max_turns"),
        (b'{"events":[' + EVENT + b'],"safety":{"min_turns":' + HUGE + b"}}", "safety.min_turns"),
        (
            b'{"events":[' + EVENT + b'],"safety":{"loop":{"monologue":' + HUGE + b"}}}",
            "safety.loop.monologue",
        ),
        (
            b'{"events":[' + EVENT + b'],"safety":{"any":[{"max_tokens":' + HUGE + b"}]}}",
            "safety.any[0].max_tokens",
        ),
        (
            b'{"events":[{"id":"a","t":1,"type":"return","agent":"x","tokens":' + VAST + b"}]}",
            "body.events[0].tokens",
        ),
        (b'{"events":[{"id":"a","t":1,"type":"return","agent":"x","usd":1e308}]}', "body.events[0].usd"),
        (b'{"events":[{"id":"a","t":1e300,"type":"return","agent":"x"}]}', "body.events[0].t"),
        (b'{"events":[{"id":"a","t":1,"type":"reward","value":1e300,"agent":"x"}]}', "body.events[0].value"),
        (b'{"events":[' + EVENT + b'],"budget":{"max_turns":' + HUGE + b"}}", "body.budget.max_turns"),
        (b'{"events":[' + EVENT + b'],"budget":{"max_usd":1e300}}', "body.budget.max_usd"),
        (b'{"events":[' + EVENT + b'],"lambda":1e300}', "body.lambda"),
    ],
)
def test_numbers_out_of_range_are_422_naming_the_field(
    tmp_path: Path, model_dir: Path, body: bytes, field: str
) -> None:
    app = create_app(Settings(model_dir=model_dir, log_dir=tmp_path / "logs"))
    with TestClient(app, raise_server_exceptions=False) as c:
        status, data = post(c, "/v1/runs/r/decide", body)
        assert status == 422, data
        assert field in [i["field"] for i in data["error"]["issues"]], data
        # nothing was folded: the run (if created) still answers, at turn 1
        status, data = post(c, "/v1/runs/r/decide", b'{"events":[' + EVENT + b"]}")
        assert status == 200 and data["turn"] == 1, data
        assert c.get("/v1/runs/r").status_code == 200


def test_outcome_numbers_are_checked_too(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        c.post("/v1/runs/o/decide", json={"events": turn_events(0)})
        status, data = post(c, "/v1/runs/o/outcome", b'{"rewards":{"team":1e400}}')
        assert status == 422 and data["error"]["issues"][0]["field"].startswith("body.rewards")
        status, data = post(
            c, "/v1/runs/o/outcome", b'{"rewards":{"team":1},"metrics":{"' + b"k" * 300 + b'":1}}'
        )
        assert status == 422


def test_one_bad_run_in_a_batch_gets_its_own_error(tmp_path: Path) -> None:
    app = create_app(Settings(no_model=True, log_dir=tmp_path / "logs"))
    with TestClient(app, raise_server_exceptions=False) as c:
        body = (
            b'{"runs":[{"run_id":"ok1","events":[' + EVENT + b"]},"
            b'{"run_id":"bad","events":[' + EVENT + b'],"safety":{"max_turns":' + HUGE + b"}},"
            b'{"run_id":"ok2","events":[' + EVENT + b"]}]}"
        )
        status, data = post(c, "/v1/decide:batch", body)
        assert status == 200, data
        res = data["results"]
        assert [x["run_id"] for x in res] == ["ok1", "bad", "ok2"]
        assert res[0]["decision"]["turn"] == 1 and res[2]["decision"]["turn"] == 1
        assert res[1]["decision"] is None and res[1]["error"]["status"] == 422
        assert res[1]["error"]["issues"][0]["field"] == "runs[1].safety.max_turns"
    assert sorted(x["run_id"] for x in lines(tmp_path / "logs" / "decisions.jsonl")) == ["ok1", "ok2"]
