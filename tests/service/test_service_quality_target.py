"""No hidden quality target: with no configuration a reward below 1.0 stops nothing; a user who
knows their reward's scale says so (``quality_target`` per request, ``STOPSERVE_QUALITY_TARGET``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from servers import free_port
from test_service_app import make_client, turn_events

from stopserve.client import StopClient
from stopserve.settings import default_model_dir


def step(i: int, reward: float) -> list[dict[str, Any]]:
    return [
        *turn_events(i),
        {"id": f"w{i}", "t": 2.0 * i + 1.5, "type": "reward", "agent": "v", "value": reward},
    ]


def rewards(client: TestClient, run: str, values: list[float], **extra: Any) -> list[dict[str, Any]]:
    out = []
    for i, value in enumerate(values):
        body = {"events": step(i, value), **(extra if i == 0 else {})}
        r = client.post(f"/v1/runs/{run}/decide", json=body)
        assert r.status_code == 200, r.text
        out.append(r.json())
        if out[-1]["action"] == "stop":
            break
    return out


def test_no_reward_below_one_stops_a_run_of_the_shipped_default(tmp_path: Path) -> None:
    with make_client(tmp_path, model_dir=default_model_dir(), no_model=False) as client:
        answers = rewards(client, "rising", [0.2, 0.45, 0.56, 0.7, 0.8, 0.9, 0.95, 1.0])
        assert [a["action"] for a in answers[:-1]] == ["continue"] * 7, answers
        last = answers[-1]
        assert last["action"] == "stop" and last["reason"] == "quality_met" and last["turn"] == 8
        assert last["safety_net"] == "quality_met" and "quality target 1" in last["message"]


def test_a_request_sets_the_runs_quality_target(tmp_path: Path) -> None:
    with make_client(tmp_path) as client:
        answers = rewards(client, "r", [0.5, 0.8, 0.86, 0.9], quality_target=0.85)
        last = answers[-1]
        assert len(answers) == 3 and last["reason"] == "quality_met", answers  # kept after the first call
        assert "quality target 0.85" in last["message"]
        bad = client.post("/v1/runs/x/decide", json={"events": turn_events(0), "quality_target": 1.5})
        assert bad.status_code == 422 and "quality_target" in bad.text


def test_the_setting_sets_the_default_quality_target(tmp_path: Path) -> None:
    with make_client(tmp_path, quality_target=0.7) as client:
        assert client.get("/v1/model").json()["safety"]["quality_met"] == 0.7
        answers = rewards(client, "r", [0.5, 0.72, 0.9])
        assert len(answers) == 2 and answers[-1]["reason"] == "quality_met"


def test_the_client_keeps_the_quality_target_with_the_service_down() -> None:
    with StopClient(f"http://127.0.0.1:{free_port()}", timeout=0.5) as client:
        first = client.decide("r", step(0, 0.5), quality_target=0.6)
        second = client.decide("r", step(1, 0.65))
    assert first.action == "continue" and first.degraded
    assert second.action == "stop" and second.reason == "quality_met" and second.degraded


def test_a_requests_safety_changes_the_services_config_and_keeps_the_rest(tmp_path: Path) -> None:
    # the service requires two steps before any stop; a request that sets a turn limit keeps that
    with make_client(tmp_path, safety={"min_turns": 3}) as client:
        r = client.post("/v1/runs/r/decide", json={"events": step(0, 1.0), "safety": {"max_turns": 10}})
        assert r.json()["action"] == "continue" and r.json()["proposal"] is None
        assert "min_turns (3)" in r.json()["message"]
