"""Each benchmark script runs on tiny inputs and reports a well-formed section with its figures.

Benchmarks are not tests: nothing here looks at a time. Every part a script measures
has landed, so a section that reports a part "missing" (a script that broke, say on a
renamed function) fails here; only the figures a tiny run leaves out on purpose
(say, a million decision points) may be named missing, and the test says which.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
SHARED_DATA = ROOT.parent / "shared" / "data"  # as tests/conftest.py has it
OWN_SCRIPTS = [
    "bench_featurize.py",
    "bench_decide.py",
    "bench_inference.py",
    "bench_train.py",
    "bench_quality.py",
    "bench_default.py",
    "bench_serve.py",
    "bench_hook.py",
    "bench_sketch.py",
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One scratch folder for the module, so the benchmark model is trained once."""
    return tmp_path_factory.mktemp("bench")


def _run(script: str, workdir: Path, *extra: str, timeout: float = 900) -> dict[str, Any]:
    out = workdir / f"{script}.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / script),
            "--size",
            "tiny",
            *extra,
            "--out",
            str(out),
            "--workdir",
            str(workdir),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        # the quality and default benchmarks train several models even at "tiny" (100-140 s on
        # a quiet machine); the limit is for a hang, not a speed target
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc: dict[str, Any] = json.loads(out.read_text())
    assert doc["markdown"].startswith(f"## {doc['title']}")
    assert "Command: `python bench/" in doc["markdown"]
    for target in doc["targets"]:
        assert target["met"] in (True, False, None)
        assert target["measured"] and target["goal"]
    return doc


def _measured(doc: dict[str, Any], key: str, *, left_out: str | None = None) -> dict[str, Any]:
    """The section's figures under ``key``; nothing missing but what a tiny run leaves out on purpose."""
    for why in doc["missing"]:
        assert why in doc["markdown"]
    missing = [why for why in doc["missing"] if left_out is None or left_out not in why]
    assert not missing, f"{doc['title']}: a part did not run: {missing}"
    assert key in doc["data"], f"{key!r} not measured: {sorted(doc['data'])}"
    figures: dict[str, Any] = doc["data"][key]
    return figures


def test_featurize_smoke(workdir: Path) -> None:
    doc = _run("bench_featurize.py", workdir)
    per_run = _measured(doc, "bytes_per_run")
    synthetic = next(v for k, v in doc["data"].items() if k.startswith("synthetic"))
    assert synthetic["events"] == 3_000
    assert synthetic["fold_events_per_cpu_s"] > 0
    # a run that folded more events holds at least as much memory
    assert per_run["100"] >= per_run["10"] > 0


def test_decide_smoke(workdir: Path) -> None:
    doc = _run("bench_decide.py", workdir)
    results = _measured(doc, "results")
    assert results
    for rows in results.values():
        assert [r["events"] for r in rows] == [10, 1_000]
        for r in rows:
            assert sum(r["actions"].values()) == r["iters"] == 100
            assert r["p99_us"] >= r["p50_us"] > 0


def test_inference_smoke(workdir: Path) -> None:
    doc = _run("bench_inference.py", workdir)
    engines = _measured(doc, "engines", left_out="lleaves")
    timed = {k: v for k, v in engines.items() if "p50_us" in v}
    assert any(k.startswith("LightGBM") for k in timed) and any(k.startswith("stopserve") for k in timed)
    for name, row in timed.items():
        assert row["bit_exact"], name  # every engine gives LightGBM's own scores
        assert row["p99_us"] >= row["p50_us"] > 0 and row["context_p99_us"] >= row["context_p50_us"] > 0


def test_train_smoke(workdir: Path) -> None:
    doc = _run("bench_train.py", workdir)
    train = _measured(doc, "train", left_out="1,000,000 decision points")
    assert train["rc"] == 0 and train["calls"] > 0
    assert train["fit"]["rows"] == train["n_points"] > 0
    assert train["raw_seconds"] > 0 and train["fit"]["seconds"] > 0
    assert [t["name"] for t in doc["targets"]] == [
        f"fit time / raw lightgbm.train ({train['n_points']:,} decision points)"
    ]


def test_simulate_smoke(workdir: Path) -> None:
    doc = _run("bench_simulate.py", workdir)
    assert _measured(doc, "default (behavior-logged)")["traces"] == 1_000


def test_quality_smoke(workdir: Path) -> None:
    doc = _run("bench_quality.py", workdir)
    # without ../shared/data (a fresh clone) the real sets are left out, and the section says so
    absent = None if SHARED_DATA.exists() else "no real runs under"
    assert _measured(doc, "simulator", left_out=absent)


def test_default_smoke(workdir: Path) -> None:
    if not SHARED_DATA.exists():
        pytest.skip(f"{SHARED_DATA} not found: the default model's benchmark needs the real runs")
    doc = _run("bench_default.py", workdir)
    per = doc["data"]["results"]["shipped recipe"]["per_system"]
    # every system of the corpus is held out once and reported
    assert {"mini-swe-agent", "mint", "intercode-sql", "sim-debate"} <= set(per)
    assert all(r["runs"] > 0 and r["oracle"] >= r["behavior"] - 1e-9 for r in per.values())
    assert len(doc["targets"]) == 4


@pytest.mark.slow
def test_default_in_system_smoke(workdir: Path) -> None:
    """The in-system reference: every system trained and judged on its own runs, at each floor."""
    if not SHARED_DATA.exists():
        pytest.skip(f"{SHARED_DATA} not found: the default model's benchmark needs the real runs")
    doc = _run("bench_default.py", workdir / "in-system", "--in-system")
    floors = doc["data"]["in_system"]
    assert set(floors) == {"0.01", "0.0025"}
    for per in floors.values():
        assert {"mini-swe-agent", "mint", "intercode-bash", "sim-swarm"} <= set(per)
        # judged on its own held-out tasks: never below the logged runs by more than the value floor
        assert all(r["runs"] > 0 and r["value"] >= r["behavior"] - 0.005 - 1e-9 for r in per.values())
    assert "--group-by task" in " ".join(doc["data"]["flags"]) and "in-system reference" in doc["title"]


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (apt-get install -y wrk)")
def test_serve_smoke(workdir: Path) -> None:
    doc = _run("bench_serve.py", workdir)
    results = doc["data"]["results"]
    # the baselines need nothing but FastAPI and uvicorn: they are always measured
    for name in ("static ASGI", "bare FastAPI, dict body", "bare FastAPI, DecideRequest body"):
        for r in results[name].values():
            assert r["requests"] > 0
            assert r["errors"] == 0
    for name, rows in results.items():
        if name.startswith("stopserve"):
            for r in rows.values():
                assert r["requests"] > 0 and r["errors_status"] == 0, (name, r)
    if "stopserve, log always" in results:
        # every decision a client received was logged
        assert (
            doc["data"]["logged_lines"]["stopserve, log always"]
            >= doc["data"]["requests"]["stopserve, log always"]
        )


def test_run_all_writes_results(workdir: Path, tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "run_all.py"), "--size", "tiny", "--only", "featurize",
         "--output", str(out), "--workdir", str(workdir / "all")],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert text.startswith("# stopserve benchmark results")
    assert "Command: `python bench/run_all.py --size tiny --only featurize" in text
    assert "## Featurizing" in text
    assert "cores" in text


@pytest.mark.slow
def test_learning_smoke(workdir: Path, tmp_path: Path) -> None:
    """The deployment simulator and the retrain cost at tiny size, then one section from both parts."""
    deploy = _run("bench_learning.py", workdir / "learning", "--parts", "deploy")
    (curve,) = _measured(deploy, "deployments")
    assert len(curve["rounds"]) == 2 and len(curve["retrains"]) == 2
    for r in curve["rounds"]:
        assert r["behavior"] <= r["optimum"] and math.isfinite(r["served"])
    # the last champion re-ruled on more fresh runs: the first of them are the deployment's test set
    final = _run("bench_learning.py", workdir / "learning", "--parts", "final")
    (ruled,) = _measured(final, "finals")
    assert ruled["champion"] == curve["final"]["champion"] and ruled["final"]["runs"] > ruled["test"]["runs"]
    assert ruled["test"]["gap"] == pytest.approx(curve["final"]["gap_test"], abs=1e-12)
    lo, hi = ruled["final"]["gap_ci90"]
    assert lo <= ruled["final"]["gap"] <= hi
    cost = _run("bench_learning.py", workdir / "learning", "--parts", "cost")
    assert _measured(cost, "retrain_cost")["retrain_s"] > 0
    parts = [tmp_path / "deploy.json", tmp_path / "final.json", tmp_path / "cost.json"]
    for path, doc in zip(parts, (deploy, final, cost), strict=True):
        path.write_text(json.dumps(doc))
    out = tmp_path / "both.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_learning.py"), "--from-json", *map(str, parts),
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    both = json.loads(out.read_text())
    assert {"deployments", "finals", "retrain_cost", "p99"} <= set(both["data"])
    assert "--parts deploy" in both["markdown"] and "--parts cost" in both["markdown"]
    assert len(both["targets"]) == len(deploy["targets"]) + len(cost["targets"])
    # the gap target reads the re-ruled champions when they were measured
    (reached,) = [t for t in both["targets"] if "behavior -> optimum gap" in t["name"]]
    assert f"on {ruled['final']['runs']:,} fresh runs" in reached["measured"]


@pytest.mark.slow
def test_reliability_smoke(workdir: Path) -> None:
    doc = _run("bench_reliability.py", workdir)
    data = doc["data"]
    assert data["kill"]["lost"] == 0 and data["disk"]["lost"] == 0
    assert data["kill"]["5xx"] == data["disk"]["5xx"] == 0
    assert data["memory"]["live_runs"] == 200
    for row in data["p99"].values():
        assert row["requests"] > 0 and row["5xx"] == 0


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (apt-get install -y wrk)")
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_replicas_smoke(workdir: Path) -> None:
    doc = _run("bench_replicas.py", workdir)
    results = doc["data"]["results"]
    for name in ("memory x1", "redis x1"):
        for r in results[name].values():
            assert r["requests"] > 0 and r["errors"] == 0, (name, r)
    # one read and one write round trip per decide
    assert doc["data"]["calls_per_decide"]["redis x1"] == pytest.approx(2.0, abs=0.05)


def test_hook_smoke(workdir: Path) -> None:
    doc = _run("bench_hook.py", workdir)
    # without the harness binaries (a fresh clone) the in-harness part is left out, and the section says so
    alone = _measured(doc, "standalone", left_out="inside a harness")
    for case in ("python -c pass", "command hook", "HTTP hook"):
        assert alone[case]["n"] == 5 and alone[case]["p90"] >= alone[case]["p50"] > 0
    names = [t["name"] for t in doc["targets"]]
    assert names[:2] == ["HTTP hook p50, standalone", "command hook p50 / python -c pass, standalone"]
    if doc["data"]["in_harness"] is not None:
        assert doc["data"]["in_harness"]["command hook"]["n"] == 3


def test_sketch_smoke(workdir: Path) -> None:
    if not SHARED_DATA.exists():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    doc = _run("bench_sketch.py", workdir)
    costs = _measured(doc, "cost_us")
    for row in costs.values():
        assert row["record, with sketch"] > row["record, no sketch"] > 0 and row["sketch"] > 0
    assert set(doc["data"]["agreement"]) == {"SWE agent", "MINT", "InterCode"}
    for figures in doc["data"]["agreement"].values():
        assert figures["steps"] > 0 and 0.9 <= figures["agreement"] <= 1.0
    assert [t["name"] for t in doc["targets"]] == [
        "sketch cost per event in the client, mean over real sizes",
        "similarity of two sketches",
    ]
