"""The service learns its system, for real (issue 25): a real uvicorn retrains in the background
under load, and a promotion reaches two replicas sharing a real ``redis-server``.

Runs are simulator runs held to their cap, served turn by turn over HTTP
(:func:`stopserve.training.deploy.drive`): a stop cuts the run there, as in a deployment.
The champion is a stop rule (stop once the reward reaches 0.5); at λ = 1 a rule that
stops at 0.2 is better on these runs, so a retrain that judges it must promote it.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis_server import RedisServer, need_redis
from servers import LiveServer

from stopserve.artifacts import save_model_dir
from stopserve.model_store import ModelStore
from stopserve.training.deploy import drive
from stopserve.training.heuristics import HeuristicRule, TunedHeuristic
from stopserve.training.simulate import simulate

pytestmark = pytest.mark.timeout(900)


def rule_dir(out: Path, version: str, threshold: float) -> Path:
    rule = TunedHeuristic(
        "h", HeuristicRule(loop=False, reward_threshold=threshold), math.nan, "ktokens", 0.0
    )
    return save_model_dir(out, rule.manifest().updated(model_version=version))


def runs(n: int, seed: int) -> list[dict[str, Any]]:
    return list(simulate(n, seed=seed, topology="centralized", run_to_cap=True, optimal_lambda=1.0))


def version(url: str) -> str | None:
    got: str | None = httpx.get(url + "/v1/model", timeout=10).json()["model_version"]
    return got


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


class Load:
    """Decide calls without pause from a few threads: every answer's status and time."""

    def __init__(self, url: str, threads: int = 3) -> None:
        self.url = url
        self.stop = threading.Event()
        self.answers: list[tuple[int, float]] = []
        self.threads = [threading.Thread(target=self._run, args=(k,)) for k in range(threads)]

    def _run(self, k: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            run = 0
            while not self.stop.is_set():
                for i in range(8):
                    events = [
                        {"id": f"c{i}", "t": 2.0 * i, "type": "tool_use", "agent": "a", "tokens": 100},
                        {
                            "id": f"r{i}",
                            "t": 2.0 * i + 1,
                            "type": "return",
                            "agent": "b",
                            "content_ref": f"{i}",
                        },
                    ]
                    t0 = time.perf_counter()
                    r = http.post(f"/v1/runs/load{k}-{run}/decide", json={"events": events, "lambda": 1.0})
                    self.answers.append((r.status_code, time.perf_counter() - t0))
                    if r.status_code != 200 or r.json()["action"] == "stop":
                        break
                http.delete(f"/v1/runs/load{k}-{run}")  # not a finished run: not counted, not logged
                run += 1

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


@pytest.mark.slow
def test_a_background_retrain_under_load_fits_judges_and_never_fails_a_call(tmp_path: Path) -> None:
    champion = rule_dir(tmp_path / "champion", "rule-0.5", 0.5)
    logs = tmp_path / "logs"
    env = {
        "STOPSERVE_EXPLORE": "0.2",
        "STOPSERVE_SEED": "3",
        "STOPSERVE_RETRAIN_EVERY": "300",
        # the trainer stopserve train runs, kept small for a test: two folds, few draws
        "STOPSERVE_RETRAIN_ARGS": "--folds 2 --min-groups 2 --holdout 0.4 --n-boot 200",
    }
    with LiveServer(log_dir=logs, model=champion, env=env) as server:
        served = drive(server.url, runs(300, seed=5), lam=1.0)
        assert len(served) == 300 and any(s.explored for s in served)
        store = ModelStore(logs / "models")
        with Load(server.url) as load:
            wait_for(store.history, 600, "the background retrain wrote its promotion or refusal")
        record = store.history()[-1]
        assert metric(server.url, 'stopserve_retrains_total{result="started"}') == 1.0
        answered = [s for s, _ in load.answers]
    assert len(answered) > 50 and set(answered) == {200}, server.read_output()[-3000:]
    assert record["kind"] in ("promotion", "refusal")
    evidence = record["evidence"]
    # a real fit by the trainer, judged off-policy on the newest runs it did not train on
    assert evidence["timings"]["fit_s"] > 0 and evidence["judged_on"]["runs"] == 120
    assert evidence["objective"]["from"].startswith("the logged runs' lambda 1")
    assert {"candidate", "champion", "logged"} <= set(evidence["estimates"])
    assert (logs / "models" / "retrain.log").read_text().strip()


def test_a_promotion_reaches_both_replicas_on_redis(tmp_path: Path) -> None:
    need_redis()
    champion = rule_dir(tmp_path / "champion", "rule-0.5", 0.5)
    candidate = rule_dir(tmp_path / "candidate", "rule-0.2", 0.2)
    logs = tmp_path / "logs"  # shared by both replicas, as is the model store under it
    with RedisServer(tmp_path / "redis") as redis:
        env = {
            "STOPSERVE_STORE": redis.url,
            "STOPSERVE_EXPLORE": "0.2",
            "STOPSERVE_RETRAIN_EVERY": "240",
            "STOPSERVE_RETRAIN_ARGS": f"--candidate {candidate} --holdout 0.5 --n-boot 300",
        }
        a = LiveServer(log_dir=logs, model=champion, env={**env, "STOPSERVE_SEED": "1"})
        b = LiveServer(log_dir=logs, model=champion, env={**env, "STOPSERVE_SEED": "2"})
        with a, b:
            assert version(a.url) == version(b.url) == "rule-0.5"
            halves = [runs(120, seed=7), runs(120, seed=8)]
            for half, k in zip(halves, "ab", strict=True):
                for t in half:
                    t["trace_id"] = f"{k}-{t['trace_id']}"
            served: list[Any] = []
            drivers = [
                threading.Thread(target=lambda s=s, h=h: served.extend(drive(s.url, h, lam=1.0, batch=40)))
                for s, h in ((a, halves[0]), (b, halves[1]))
            ]
            for t in drivers:
                t.start()
            for t in drivers:
                t.join()
            assert len(served) == 240
            # the 240th finished run, counted in Redis over both replicas, started one retrain
            wait_for(
                lambda: version(a.url) == version(b.url) == "rule-0.2", 120, "both replicas serve rule-0.2"
            )
            for server in (a, b):
                info = httpx.get(server.url + "/v1/model").json()
                assert info["champion"]["version"] == "rule-0.2" and info["champion"]["following"]
            started = metric(a.url, 'stopserve_retrains_total{result="started"}') + metric(
                b.url, 'stopserve_retrains_total{result="started"}'
            )
            assert started == 1.0
            (promotion,) = ModelStore(logs / "models").history()
            assert promotion["kind"] == "promotion" and promotion["evidence"]["difference"]["ci90"][0] > 0
            assert promotion["evidence"]["judged_on"]["runs"] == 120
            # a rollback is followed by both as well
            from stopserve.cli import main as cli

            assert cli(["rollback", "--log-dir", str(logs)]) == 0
            wait_for(
                lambda: version(a.url) == version(b.url) == "rule-0.5", 60, "both replicas back on rule-0.5"
            )


def test_drive_keeps_each_request_within_the_services_event_limit(tmp_path: Path) -> None:
    """Many runs side by side: a batch request carries at most max_events, never a 422."""
    env = {"STOPSERVE_MAX_EVENTS_PER_REQUEST": "60"}
    with LiveServer(log_dir=tmp_path / "logs", no_model=True, env=env) as server:
        traces = runs(40, seed=9)
        for t in traces[:2]:
            t["trace_id"] = "system/a b"  # not a run id, twice: each run still its own
        served = drive(server.url, traces, lam=0.1, max_events=60)
    assert len(served) == 40 and all(s.decisions > 0 for s in served)
    assert len({s.run_id for s in served}) == 40 and sum(s.trace_id == "system/a b" for s in served) == 2
