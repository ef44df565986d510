"""The service learns its system (issue 25), in process: shadow challengers, exploration, the champion.

The real app (TestClient runs its lifespan); real tiny models written by the artifact writer.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _service_models import tiny_model
from fastapi.testclient import TestClient
from test_service_app import lines, turn_events

from stopserve.model_store import ModelStore
from stopserve.service.app import create_app
from stopserve.service.learning import RETRAIN_NICE, _spawn_idle
from stopserve.settings import Settings
from stopserve.trace import read_traces

TOKEN = "learn-token"
CAPPED = {"max_turns": 5, "loop": False}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("learn-models")
    return {
        "go": tiny_model(base / "go", "tiny-go", stop_bias=-1.0),
        "stop": tiny_model(base / "stop", "tiny-stop", stop_bias=1.0),
        "go2": tiny_model(base / "go2", "tiny-go-2", stop_bias=-2.0, margin_continue=0.0),
    }


def _client(tmp_path: Path, **kw: Any) -> TestClient:
    kw.setdefault("log_dir", tmp_path / "logs")
    return TestClient(create_app(Settings(admin_token=TOKEN, **kw)))


def _script(c: TestClient, runs: int = 6) -> list[dict[str, Any]]:
    """The same calls every time: turns, a retry, a proposed stop; every answer."""
    answers = []
    for r in range(runs):
        for i in range(5):
            body: dict[str, Any] = {"events": turn_events(i), "safety": CAPPED}
            if i == 3:
                body["proposed_stop"] = True
            got = c.post(f"/v1/runs/run-{r}/decide", json=body)
            assert got.status_code == 200, got.text
            answers.append(got.json())
            if i == 2:  # a retry: the same answer, nothing decided twice
                answers.append(c.post(f"/v1/runs/run-{r}/decide", json=body).json())
            if answers[-1]["action"] == "stop":
                break
        c.post(f"/v1/runs/run-{r}/outcome", json={"rewards": {"team": 1.0}})
    return answers


def test_challengers_never_change_an_answer(tmp_path: Path, models: dict[str, Path]) -> None:
    shadow = tmp_path / "challengers"
    shadow.mkdir()
    (shadow / "stop").symlink_to(models["stop"], target_is_directory=True)
    with _client(tmp_path / "alone", model_dir=models["go"]) as c:
        alone = _script(c)
    with _client(tmp_path / "shadowed", model_dir=models["go"], challengers=shadow) as c:
        added = c.post(
            "/v1/admin/challengers",
            json={"model_dir": str(models["go2"]), "name": "go2"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert added.status_code == 200, added.text
        shadowed = _script(c)
        info = {x["name"]: x for x in c.get("/v1/model").json()["challengers"]}
        metrics = c.get("/metrics").text
    assert shadowed == alone  # every answer, field for field
    decisions = [
        d for d in lines(tmp_path / "shadowed" / "logs" / "decisions.jsonl") if not d.get("replayed")
    ]
    assert all(set(d["challengers"]) == {"stop", "go2"} for d in decisions)
    assert all(d["challengers"]["stop"]["action"] == "stop" for d in decisions)
    # the champion (go) takes the proposed stop at turn 4: "stop" had stopped each run at turn 1,
    # "go2" (which may overrule a proposal) goes on
    stop, go2 = info["stop"], info["go2"]
    assert stop["model_version"] == "tiny-stop" and stop["agreement"] == pytest.approx(0.25)
    assert (
        stop["runs"] == 6
        and stop["stopped_earlier"] == 6
        and stop["mean_turns_earlier"] == pytest.approx(3.0)
    )
    assert go2["agreement"] == pytest.approx(0.75) and go2["stopped_later"] == 6
    assert 'stopserve_challenger_runs_total{challenger="go2",stop="later"} 6.0' in metrics
    assert 'stopserve_challenger_decisions_total{agree="false",challenger="stop"}' in metrics
    # nothing a challenger said is in the traces the service logs for training
    traces = list(read_traces([tmp_path / "shadowed" / "logs" / "traces.jsonl"]))
    assert len(traces) == 6 and all(
        e.decision is None or e.decision.model_version == "tiny-go" for t in traces for e in t.events
    )


def test_admin_challengers_need_the_token_and_say_what_is_wrong(
    tmp_path: Path, models: dict[str, Path]
) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with _client(tmp_path, model_dir=models["go"]) as c:
        assert c.post("/v1/admin/challengers", json={"model_dir": str(models["stop"])}).status_code == 401
        missing = c.post("/v1/admin/challengers", json={"model_dir": str(tmp_path / "nope")}, headers=auth)
        assert missing.status_code == 404 and "no such model directory" in missing.json()["error"]["message"]
        bad = c.post("/v1/admin/challengers", json={"name": "x"}, headers=auth)
        assert bad.status_code == 422 and bad.json()["error"]["issues"][0]["field"] == "body.model_dir"
        assert (
            c.post("/v1/admin/challengers", json={"model_dir": str(models["stop"])}, headers=auth).json()[
                "name"
            ]
            == "stop"
        )
        gone = c.delete("/v1/admin/challengers/other", headers=auth)
        assert gone.status_code == 404 and "challengers: stop" in gone.json()["error"]["message"]
        assert c.delete("/v1/admin/challengers/stop").status_code == 401
        assert c.delete("/v1/admin/challengers/stop", headers=auth).status_code == 204
        assert c.get("/v1/model").json()["challengers"] == []


def test_exploration_goes_on_past_stops_and_logs_every_propensity(
    tmp_path: Path, models: dict[str, Path]
) -> None:
    with _client(tmp_path, model_dir=models["stop"], explore=0.5, explore_steps=3, seed=7) as c:
        for r in range(60):
            for i in range(6):
                got = c.post(f"/v1/runs/x{r}/decide", json={"events": turn_events(i)}).json()
                if got["action"] == "stop":
                    break
            c.post(f"/v1/runs/x{r}/outcome", json={"rewards": {"team": 0.0}})
        explored_metric = c.get("/metrics").text
    logged = lines(tmp_path / "logs" / "decisions.jsonl")
    by_run: dict[str, list[dict[str, Any]]] = {}
    for d in logged:
        by_run.setdefault(d["run_id"], []).append(d)
    for calls in by_run.values():
        first = calls[0]
        # the model wants to stop at once: the first stop is explored with 0.5, later ones with 1 - 1/3
        assert first["propensity"] == 0.5 and first["explored"] == (first["action"] == "continue")
        for later in calls[1:]:
            assert later["propensity"] == pytest.approx(2 / 3 if later["action"] == "continue" else 1 / 3)
    lengths = [len(calls) for calls in by_run.values()]
    assert min(lengths) == 1 and max(lengths) > 2  # explored runs went on past several stops
    traces = list(read_traces([tmp_path / "logs" / "traces.jsonl"]))
    decided = [e.decision for t in traces for e in t.events if e.decision is not None]
    assert len(decided) == len(logged)
    assert {round(d.propensity, 6) for d in decided} == {0.5, round(2 / 3, 6), round(1 / 3, 6)}
    assert "stopserve_explored_decisions_total" in explored_metric
    # each run says when it started (wall clock), in the order the runs were started
    started = [t.metrics["service_started"] for t in traces]
    assert started == sorted(started) and abs(started[0] - time.time()) < 600


def test_explore_keeps_its_former_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOPSERVE_EPSILON", "0.2")
    assert Settings().explore == 0.2
    monkeypatch.delenv("STOPSERVE_EPSILON")
    monkeypatch.setenv("STOPSERVE_EXPLORE", "0.3")
    monkeypatch.setenv("STOPSERVE_EXPLORE_DISAGREE", "0.1")
    assert Settings().exploration == ((0.3, 0.3), (pytest.approx(0.8), 0.95))  # never below the rate beside
    monkeypatch.setenv("STOPSERVE_EXPLORE_DISAGREE", "0.6")
    monkeypatch.setenv("STOPSERVE_EXPLORE_FOLLOW", "0.5")
    assert Settings().exploration == ((0.3, 0.6), (pytest.approx(0.8), pytest.approx(0.8)))


def _first_propensities(c: TestClient, log: Path, prefix: str, runs: int = 30) -> set[float]:
    """The propensity of each run's first decision, for runs the champion wants to stop at once."""
    for r in range(runs):
        c.post(f"/v1/runs/{prefix}{r}/decide", json={"events": turn_events(0)})
        c.post(f"/v1/runs/{prefix}{r}/outcome", json={"rewards": {"team": 0.0}})
    first = {}
    for d in lines(log):
        if d["run_id"].startswith(prefix):
            first.setdefault(d["run_id"], d)
    assert len(first) == runs
    return {round(d["propensity"], 6) for d in first.values()}


def test_exploration_concentrates_where_the_refused_candidate_would_go_on(
    tmp_path: Path, models: dict[str, Path]
) -> None:
    store = ModelStore(tmp_path / "logs" / "models")
    store.keep_candidate(models["go"])  # what a refused retrain leaves
    log = tmp_path / "logs" / "decisions.jsonl"
    kw = {"model_dir": models["stop"], "explore_disagree": 0.5, "explore_follow": 0.9, "seed": 3}
    kw["fsync_interval_s"] = 0.05
    with _client(tmp_path, explore=0.0, **kw) as c:  # exploration off: nothing to aim it at
        assert c.get("/v1/model").json()["challengers"] == []
    with _client(tmp_path, explore=0.05, **kw) as c:
        shadows = c.get("/v1/model").json()["challengers"]
        assert [(x["name"], x["model_version"]) for x in shadows] == [("candidate", "tiny-go")]
        # the champion stops at once where the candidate would go on: explored with 0.5, not 0.05
        assert _first_propensities(c, log, "d") == {0.5}
        # an explored run follows the candidate: its later stops explored with 0.9, not 1 - 1/5
        later = []
        for r in range(40):
            for i in range(4):
                got = c.post(f"/v1/runs/f{r}/decide", json={"events": turn_events(i)}).json()
                if i:
                    later.append(round(got["propensity"], 6))
                if got["action"] == "stop":
                    break
        assert later and set(later) <= {0.9, 0.1} and 0.9 in later
        # a promotion makes the refused candidate stale: gone from the store and from the shadow
        store.promote(models["stop"], version="tiny-stop", previous=None, evidence={})
        deadline = time.monotonic() + 10
        while c.get("/v1/model").json()["challengers"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.get("/v1/model").json()["challengers"] == [] and not store.candidate_dir.exists()
        assert _first_propensities(c, log, "e") <= {0.05, 0.95}  # ε again
        # the next refusal is shadowed again, without a restart
        store.keep_candidate(models["go2"])
        while not c.get("/v1/model").json()["challengers"] and time.monotonic() < deadline + 10:
            time.sleep(0.05)
        assert [x["model_version"] for x in c.get("/v1/model").json()["challengers"]] == ["tiny-go-2"]


def _served(c: TestClient) -> str:
    version: str = c.get("/v1/model").json()["model_version"]
    return version


def _until(c: TestClient, version: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _served(c) != version:
        time.sleep(0.05)
    assert _served(c) == version


def test_the_service_follows_promotions_and_rollbacks(tmp_path: Path, models: dict[str, Path]) -> None:
    store = ModelStore(tmp_path / "logs" / "models")
    with _client(tmp_path, model_dir=models["go"], fsync_interval_s=0.05) as c:
        assert _served(c) == "tiny-go" and c.get("/v1/model").json()["champion"] is None
        store.promote(
            models["stop"],
            version="tiny-stop",
            previous={"version": "tiny-go", "path": models["go"]},
            evidence={},
        )
        _until(c, "tiny-stop")
        champion = c.get("/v1/model").json()["champion"]
        assert champion["version"] == "tiny-stop" and champion["following"] and champion["promotions"] == 1
        assert c.post("/v1/runs/a/decide", json={"events": turn_events(0)}).json()["action"] == "stop"
        # a reload by hand is kept until the next promotion or rollback
        c.post(
            "/v1/admin/reload",
            json={"model_dir": str(models["go2"])},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        time.sleep(0.3)
        assert _served(c) == "tiny-go-2" and not c.get("/v1/model").json()["champion"]["following"]
        store.rollback()
        _until(c, "tiny-go")
    # a restart serves the store's champion, whatever the configured model
    store.promote(models["stop"], version="tiny-stop", previous=None, evidence={})
    with _client(tmp_path, model_dir=models["go"]) as c:
        assert _served(c) == "tiny-stop"
    kinds = [r["kind"] for r in store.history()]
    assert kinds == ["promotion", "rollback", "promotion"]


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_the_background_retrain_starts_idle_and_leaves_the_service_as_it_was(tmp_path: Path) -> None:
    """The retrain's interpreter start-up and imports must not compete with decide calls either."""
    out = (tmp_path / "out").open("wb")
    probe = (
        "import json, os; print(json.dumps([os.sched_getscheduler(0) == os.SCHED_IDLE, os.nice(0), "
        "sorted(os.sched_getaffinity(0)), os.environ.get('OMP_NUM_THREADS')]))"
    )
    before = os.sched_getscheduler(0), os.nice(0), os.sched_getaffinity(0)
    proc = _spawn_idle([sys.executable, "-c", probe], out)
    assert proc.wait(60) == 0
    out.close()
    idle, nice, cores, threads = json.loads((tmp_path / "out").read_text())
    assert idle is True and nice == before[1] + RETRAIN_NICE
    mine = sorted(before[2])
    if len(mine) > 1:  # one core is left to the service, and thread pools are sized to the rest
        assert cores == mine[1:]
        assert threads == os.environ.get("OMP_NUM_THREADS", str(len(mine) - 1))
    # only the throwaway thread that forked it was lowered: this process decides at its own priority
    assert (os.sched_getscheduler(0), os.nice(0), os.sched_getaffinity(0)) == before
    # and so does every thread it still has; the spawning thread's task may linger in /proc a
    # moment after its join (as may another test's), so an idle task must be gone soon
    deadline = time.monotonic() + 10.0
    while (idle_tasks := _idle_tasks()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not idle_tasks, f"threads left at SCHED_IDLE: {idle_tasks}"


def _idle_tasks() -> list[str]:
    """The names of this process's threads scheduled SCHED_IDLE."""
    found = []
    for task in Path("/proc/self/task").iterdir():
        try:
            if os.sched_getscheduler(int(task.name)) == os.SCHED_IDLE:
                found.append(f"{task.name} {(task / 'comm').read_text().strip()}")
        except (ProcessLookupError, FileNotFoundError):  # it ended between the listing and the look
            continue
    return found
