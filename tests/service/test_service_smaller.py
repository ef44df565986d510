"""Issue 13, item 9: no decision dropped from a trace, atomic model writes, start-up errors, '/' in ids."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from _service_models import tiny_model
from test_service_app import lines, make_client, turn_events

from stopserve.artifacts import load_model_dir, save_model_dir
from stopserve.manifest import Manifest


def test_a_decide_without_new_events_keeps_every_decision_in_the_trace(
    tmp_path: Path, model_dir: Path
) -> None:
    with make_client(tmp_path, model_dir=model_dir, epsilon=0.5, seed=1) as c:
        answers = [c.post("/v1/runs/x/decide", json={"events": turn_events(0)}).json()]
        answers += [c.post("/v1/runs/x/decide", json={}).json() for _ in range(3)]
        answers.append(c.post("/v1/runs/x/decide", json={"proposed_stop": True}).json())
        assert c.post("/v1/runs/x/outcome", json={"rewards": {"team": 0.0}}).status_code == 200
    logged = [x for x in lines(tmp_path / "logs" / "decisions.jsonl") if x["run_id"] == "x"]
    assert len(logged) == 5
    trace = lines(tmp_path / "logs" / "traces.jsonl")[0]
    last = trace["events"][-1]
    kept = [last["decision"], *last["later_decisions"]]
    assert [(d["action"], d["propensity"]) for d in kept] == [(a["action"], a["propensity"]) for a in answers]
    assert all(e.get("decision") is None for e in trace["events"][:-1])


def _crash_at(n: int, out: Path, manifest: Manifest, models: dict[str, str]) -> None:
    """In a forked child: SIGKILL itself at the n-th file-system step of save_model_dir."""
    pid = os.fork()
    if pid == 0:  # the child
        count = 0

        def hook(event: str, args: Any) -> None:
            nonlocal count
            if event in (
                "open",
                "os.rename",
                "os.remove",
                "os.rmdir",
                "os.unlink",
                "shutil.rmtree",
                "os.mkdir",
                "ctypes.call_function",
                "os.replace",
                "os.chmod",
            ):
                count += 1
                if count == n:
                    os.kill(os.getpid(), signal.SIGKILL)

        sys.addaudithook(hook)
        try:
            save_model_dir(out, manifest, models)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def test_a_crash_at_any_step_of_a_model_write_leaves_a_whole_model(tmp_path: Path) -> None:
    base = tiny_model(tmp_path / "src", "v-old")
    old = load_model_dir(base)
    out = tmp_path / "models" / "current"
    save_model_dir(out, old.manifest.updated(model_version="v-old"), old.models)
    new_manifest = old.manifest.updated(model_version="v-new", files={}, created=None)
    versions = set()
    for n in range(1, 60):
        _crash_at(n, out, new_manifest, old.models)
        version = load_model_dir(out).manifest.model_version  # never missing, never half-written
        versions.add(version)
        if version == "v-new":
            save_model_dir(out, old.manifest.updated(model_version="v-old"), old.models)
    assert versions == {"v-old", "v-new"}
    # what crashes leave behind are hidden work folders beside it, never a second model path
    leftovers = [p.name for p in out.parent.iterdir() if p.name != "current"]
    assert all(name.startswith(".current.") for name in leftovers), leftovers


@pytest.mark.parametrize("value", ['{"max_turns": -3}', "not json", '{"loop": {"monologue": "x"}}'])
def test_a_bad_safety_variable_is_one_line_at_start_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    from stopserve.cli import main

    monkeypatch.setenv("STOPSERVE_SAFETY", value)
    assert main(["serve", "--no-model", "--log-dir", str(tmp_path), "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "STOPSERVE_SAFETY" in err and "Traceback" not in err and len(err.strip().splitlines()) <= 3, err


def test_a_slash_in_a_run_id_is_a_422_naming_it(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        for method, path in (
            ("POST", "/v1/runs/a%2Fb/decide"),
            ("POST", "/v1/runs/a/b/decide"),
            ("POST", "/v1/runs/a/b/outcome"),
            ("GET", "/v1/runs/a/b"),
            ("DELETE", "/v1/runs/a/b"),
        ):
            body = json.dumps({"events": [], "rewards": {"team": 1}} if "outcome" in path else {"events": []})
            r = c.request(method, path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 422, (method, path, r.status_code, r.text)
            assert r.json()["error"]["issues"][0]["field"] == "path.run_id", r.text
