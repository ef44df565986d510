"""``stopserve retrain``, ``rollback`` and ``evaluate --logged`` on runs the service logged (issue 25).

The log is what a service serving a stop rule with exploration writes (``logged_runs.serve``
on simulator runs held to their cap), so every policy's true value on the same runs is
known. The rules' stops do not depend on the cost weight, so one log is judged at two:
at λ = 1 (cost dear) a rule that stops earlier is better than the champion, at λ = 0.1 it
is worse; the gate must promote it at the first and refuse it at the second.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from logged_runs import explored_stops, serve, true_value

from stopserve.artifacts import save_model_dir
from stopserve.cli import main as cli
from stopserve.model_store import ModelStore
from stopserve.policy import Policy
from stopserve.training.heuristics import HeuristicRule, TunedHeuristic
from stopserve.training.simulate import simulate

EPS, RHO = 0.2, 0.6
N_RUNS = 300
HOLDOUT = 0.5


def rule_dir(out: Path, version: str, threshold: float) -> Path:
    """A served stop rule (stop once the reward reaches ``threshold``) as a model directory."""
    rule = TunedHeuristic(
        "h", HeuristicRule(loop=False, reward_threshold=threshold), math.nan, "ktokens", 0.0
    )
    return save_model_dir(out, {**rule.manifest(), "model_version": version})


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A log of N_RUNS runs served by the champion (threshold 0.5) with exploration, and a candidate."""
    root = tmp_path_factory.mktemp("retrain")
    champion = rule_dir(root / "champion", "rule-0.5", 0.5)
    candidate = rule_dir(root / "candidate", "rule-0.2", 0.2)
    twins = list(simulate(N_RUNS, seed=21, topology="centralized", run_to_cap=True, optimal_lambda=0.1))
    served = Policy.load(champion)
    rng = random.Random(0)
    logs = root / "logs"
    logs.mkdir()
    with (logs / "traces.jsonl").open("w") as fh:
        for twin in twins:
            explore = explored_stops(rng, EPS, RHO)
            logged = serve(served, twin, lam=0.1, epsilon=EPS, rho=RHO, explore=explore)
            fh.write(json.dumps(logged.trace) + "\n")
    held = twins[N_RUNS - math.ceil(HOLDOUT * N_RUNS) :]
    return {"logs": logs, "champion": champion, "candidate": candidate, "held": held, "twins": twins}


def _truth(model: Path, twins: list[dict[str, Any]], lam: float) -> float:
    policy = Policy.load(model)
    return float(np.mean([true_value(policy, t, lam=lam) for t in twins]))


def _retrain(d: dict[str, Any], lam: float, capsys: pytest.CaptureFixture[str], *more: str) -> dict[str, Any]:
    capsys.readouterr()
    rc = cli(
        [
            "retrain",
            "--log-dir",
            str(d["logs"]),
            "--model-store",
            str(d["store"]),
            "--champion",
            str(d["champion"]),
            "--candidate",
            str(d["candidate"]),
            "--lambda",
            str(lam),
            "--holdout",
            str(HOLDOUT),
            "--n-boot",
            "400",
            "--no-progress",
            "--json",
            *more,
        ]
    )
    assert rc == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_a_worse_candidate_is_refused_with_its_numbers(
    deployment: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = {**deployment, "store": tmp_path / "store"}
    truth = _truth(d["candidate"], d["held"], 0.1) - _truth(d["champion"], d["held"], 0.1)
    assert truth < -0.02  # the ruler: at λ 0.1 stopping at 0.2 loses value
    got = _retrain(d, 0.1, capsys)
    assert got["promoted"] is False
    lo, hi = got["difference"]["ci90"]
    assert hi < 0 and lo <= truth <= hi and "not better" in got["reason"]
    assert f"{got['difference']['mean']:+.4f}" in got["reason"]
    store = ModelStore(d["store"])
    assert store.champion() is None  # nothing promoted: the service keeps its model
    (refusal,) = store.history()
    assert refusal["kind"] == "refusal" and refusal["reason"] == got["reason"]
    assert set(refusal["evidence"]["estimates"]) >= {"candidate", "champion", "logged"}
    assert (d["store"] / "candidate" / "manifest.json").exists()  # the refused candidate is kept to look at


def test_a_better_candidate_is_promoted_and_rollback_restores_the_champion(
    deployment: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = {**deployment, "store": tmp_path / "store"}
    truth = _truth(d["candidate"], d["held"], 1.0) - _truth(d["champion"], d["held"], 1.0)
    assert truth > 0.1  # at λ 1 the earlier stop saves more than it loses
    got = _retrain(d, 1.0, capsys)
    assert got["promoted"] is True, got["reason"]
    lo, hi = got["difference"]["ci90"]
    assert 0 < lo <= truth <= hi
    store = ModelStore(d["store"])
    champion = store.champion()
    assert champion is not None and champion.version == "rule-0.2"
    assert Policy.load(champion.path).model_version == "rule-0.2"  # a copy in the store, loadable
    (promotion,) = store.history()
    assert promotion["kind"] == "promotion" and promotion["evidence"]["difference"]["ci90"] == [lo, hi]

    assert cli(["rollback", "--model-store", str(d["store"]), "--log-dir", str(d["logs"])]) == 0
    back = store.champion()
    assert back is not None and back.version == "rule-0.5" and back.path == d["champion"]
    assert [r["kind"] for r in store.history()] == ["promotion", "rollback"]
    capsys.readouterr()
    # nothing before the first champion: said so, no traceback
    assert cli(["rollback", "--model-store", str(d["store"]), "--log-dir", str(d["logs"])]) == 2
    assert "nothing to roll back to" in capsys.readouterr().err


def test_too_few_logged_runs_promote_nothing(
    deployment: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = (deployment["logs"] / "traces.jsonl").read_text().splitlines()
    (logs / "traces.jsonl").write_text("\n".join(lines[:60]) + "\n")
    d = {**deployment, "logs": logs, "store": tmp_path / "store"}
    got = _retrain(d, 1.0, capsys)
    assert got["promoted"] is False and "too few logged runs" in got["reason"]
    assert [r["kind"] for r in ModelStore(d["store"]).history()] == ["refusal"]


def test_evaluate_logged_gives_the_support_and_says_when_it_is_too_thin(
    deployment: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = deployment["logs"] / "traces.jsonl"
    capsys.readouterr()
    rc = cli(
        ["evaluate", "--logged", "--model", str(deployment["candidate"]), str(log), "--lambda", "1", "--json"]
    )
    assert rc == 0
    got = json.loads(capsys.readouterr().out)
    model = got["policies"]["model"]
    truth = _truth(deployment["candidate"], deployment["twins"], 1.0)  # on every logged run
    assert model["enough"] and model["runs"] == N_RUNS
    assert model["dr_ci90"][0] <= truth <= model["dr_ci90"][1]
    # a rule that goes on past the champion's stops rests on the few explored runs: said so
    later = rule_dir(tmp_path / "later", "rule-0.9", 0.9)
    assert cli(["evaluate", "--logged", "--model", str(later), str(log), "--lambda", "1"]) == 0
    text = capsys.readouterr().out
    assert "too few" in text and "NOTE: model: too few runs support its figure" in text
    assert "explored runs show what follows" in text or "no exploration could undo" in text
    # fewer runs than a figure needs
    few = tmp_path / "few.jsonl"
    few.write_text("\n".join(log.read_text().splitlines()[:20]) + "\n")
    assert (
        cli(["evaluate", "--logged", "--model", str(deployment["candidate"]), str(few), "--lambda", "1"]) == 0
    )
    assert "20 logged runs: at least 50 are needed" in capsys.readouterr().out
    # a chart is not an off-policy figure: a clear error, no traceback
    assert (
        cli(["evaluate", "--logged", "--model", str(later), str(log), "--plot", str(tmp_path / "x.png")]) == 2
    )
    assert "--plot and --dask do not apply" in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_a_niced_retrain_runs_on_idle_cpu_only(tmp_path: Path) -> None:
    """The service's background retrain (``--nice``) must not take CPU from decide calls."""
    probe = (
        "import os, sys\n"
        "from stopserve.cli import main\n"
        "code = main(['retrain', '--nice', '3', '--log-dir', sys.argv[1]])\n"
        "print(os.sched_getscheduler(0) == os.SCHED_IDLE, os.nice(0), code)\n"
    )
    cmd = [sys.executable, "-c", probe, str(tmp_path / "no-logs")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    idle, niceness, _ = out.stdout.split()
    assert idle == "True" and int(niceness) >= 3, out.stderr[-2000:]
