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
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from logged_runs import explored_stops, rule_dir, serve, true_value
from service._service_models import tiny_model

from stopserve.cli import main as cli
from stopserve.model_store import ModelStore
from stopserve.objective import Objective
from stopserve.policy import Policy
from stopserve.training.heuristics import HeuristicRule, TunedHeuristic
from stopserve.training.retrain import Judgement, _evidence_for, _heuristic_dir, _split, judge
from stopserve.training.sequential import Evidence
from stopserve.training.simulate import simulate

EPS, RHO = 0.2, 0.6
N_RUNS = 300
HOLDOUT = 0.5


def _deploy(root: Path, threshold: float, epsilon: float, rho: float) -> dict[str, Any]:
    """A log of N_RUNS runs served by a champion (stop at ``threshold``) with exploration, and a candidate."""
    champion = rule_dir(root / "champion", f"rule-{threshold}", threshold)
    candidate = rule_dir(root / "candidate", "rule-0.2", 0.2)
    twins = list(simulate(N_RUNS, seed=21, topology="centralized", run_to_cap=True, optimal_lambda=0.1))
    logs = root / "logs"
    logs.mkdir()
    _log(logs / "traces.jsonl", Policy.load(champion), twins, epsilon, rho, random.Random(0))
    held = twins[N_RUNS - math.ceil(HOLDOUT * N_RUNS) :]
    return {"logs": logs, "champion": champion, "candidate": candidate, "held": held, "twins": twins}


def _log(
    path: Path, served: Policy, twins: list[dict[str, Any]], epsilon: float, rho: float, rng: random.Random
) -> Path:
    """``twins`` as the service logs them when ``served`` decides them, exploring (``epsilon``, ``rho``)."""
    with path.open("w") as fh:
        for twin in twins:
            explore = explored_stops(rng, epsilon, rho)
            logged = serve(served, twin, lam=0.1, epsilon=epsilon, rho=rho, explore=explore)
            fh.write(json.dumps(logged.trace) + "\n")
    return path


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The champion stops at reward 0.5, and explores with ``EPS`` and ``RHO``."""
    return _deploy(tmp_path_factory.mktemp("retrain"), 0.5, EPS, RHO)


@pytest.fixture(scope="module")
def explored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A champion stopping early (reward 0.2) that explores every stop it makes, going on at the next
    with probability 0.9: enough runs show what follows for a tuned rule that goes on further to be
    judged at λ 0.1 (never stopping, or a fitted candidate that nearly never does, are not)."""
    return _deploy(tmp_path_factory.mktemp("explored"), 0.2, 1.0, 0.9)


def _truth(model: Path, twins: list[dict[str, Any]], lam: float) -> float:
    policy = Policy.load(model)
    return float(np.mean([true_value(policy, t, lam=lam) for t in twins]))


def _retrain(d: dict[str, Any], lam: float, capsys: pytest.CaptureFixture[str], *more: str) -> dict[str, Any]:
    """``stopserve retrain --json`` on the deployment's log: judging ``d["candidate"]``, or fitting one
    (``"--fit"`` in ``more``, costs in ktokens as the rules were served)."""
    fit = "--fit" in more
    judged = ("--cost-unit", "ktokens") if fit else ("--candidate", str(d["candidate"]))
    capsys.readouterr()
    rc = cli(
        [
            "retrain",
            *(
                "--log-dir",
                str(d["logs"]),
                "--model-store",
                str(d["store"]),
                "--champion",
                str(d["champion"]),
            ),
            *judged,
            *("--lambda", str(lam), "--holdout", str(HOLDOUT), "--n-boot", "400", "--no-progress", "--json"),
            *(m for m in more if m != "--fit"),
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
    # with what its refusal saw: the next retrain judges it again on the runs logged after this one
    kept = store.kept_candidate()
    last = json.loads((d["logs"] / "traces.jsonl").read_text().splitlines()[-1])["trace_id"]
    assert kept is not None and kept.seen_through == last
    assert kept.first_look["ci90"] == [lo, hi] and kept.first_look["enough"] is True


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


def _held(deployment: dict[str, Any], tmp_path: Path) -> Path:
    lines = (deployment["logs"] / "traces.jsonl").read_text().splitlines()
    held = tmp_path / "held.jsonl"
    held.write_text("\n".join(lines[N_RUNS - math.ceil(HOLDOUT * N_RUNS) :]) + "\n")
    return held


def test_a_tuned_heuristic_that_beats_champion_and_candidate_is_the_one_promoted(
    deployment: dict[str, Any], tmp_path: Path
) -> None:
    """The gate judges the tuned heuristics too: a champion below the best of them is replaced."""
    held = _held(deployment, tmp_path)
    champion = Policy.load(deployment["champion"])
    candidate = Policy.load(rule_dir(tmp_path / "late", "rule-0.9", 0.9))  # goes on: worse at λ 1
    early = Policy.load(deployment["candidate"])  # stops at 0.2: better at λ 1
    rules = {"heuristic early": early, "heuristic late": Policy.load(rule_dir(tmp_path / "l2", "r", 0.95))}
    truth = {
        name: _truth(path, deployment["held"], 1.0)
        for name, path in (("champion", deployment["champion"]), ("early", deployment["candidate"]))
    }
    assert truth["early"] - truth["champion"] > 0.1
    kw: dict[str, Any] = {"lam": 1.0, "objective": Objective(lam=1.0), "n_boot": 300, "cost_unit": "ktokens"}
    got = judge(candidate, champion, held, heuristics=rules, heuristics_compete=True, **kw)
    assert got.promoted and got.winner == "heuristic early", got.reason
    lo, hi = got.evidence["difference"]["ci90"]
    assert got.evidence["difference"]["policy"] == "heuristic early"
    assert 0 < lo <= truth["early"] - truth["champion"] <= hi
    assert (
        "heuristic early − champion" in got.reason
        and "(the fitted candidate: its figure is not supported" in got.reason
    )
    assert set(got.evidence["challengers"]) == {"candidate", "heuristic early", "heuristic late"}
    # shown but not promoted when only the candidate may be (``--candidate``: judge this model)
    shown = judge(candidate, champion, held, heuristics=rules, **kw)
    assert not shown.promoted and shown.winner is None
    assert "no tuned heuristic is better either" not in shown.reason
    assert set(shown.evidence["estimates"]) >= {"heuristic early", "heuristic late"}
    # none better: said, with the best heuristic's bound
    worse = judge(
        candidate,
        champion,
        held,
        heuristics={"heuristic late": rules["heuristic late"]},
        heuristics_compete=True,
        **kw,
    )
    assert (
        not worse.promoted and "no tuned heuristic is better either (the best, heuristic late" in worse.reason
    )


def test_a_tuned_heuristics_figure_is_its_own_whichever_candidate_is_judged_beside_it(
    deployment: dict[str, Any], tmp_path: Path
) -> None:
    """A heuristic has no value of going on of its own: it borrows none (a candidate's is that model's).

    On the runs where it goes on past an unexplored stop its DR figure counts what stopping
    there is worth, so a candidate sure that going on pays (or sure it does not) moves it not at all.
    """
    held = _held(deployment, tmp_path)
    champion = Policy.load(deployment["champion"])
    late = {"heuristic late": Policy.load(rule_dir(tmp_path / "late", "rule-0.95", 0.95))}
    kw: dict[str, Any] = {"lam": 0.1, "objective": Objective(lam=0.1), "n_boot": 200, "cost_unit": "ktokens"}
    figures = {}
    for sure, bias in (("goes on", -1.0), ("stops", 1.0)):
        candidate = Policy.load(tiny_model(tmp_path / sure, f"tiny-{bias}", stop_bias=bias))
        got = judge(candidate, champion, held, heuristics=late, heuristics_compete=True, **kw)
        figures[sure] = got.evidence["estimates"]["heuristic late"]
    assert figures["goes on"]["support"]["zeroed"] > 20  # it goes on past many stops nothing explored
    assert figures["goes on"]["dr"] == figures["stops"]["dr"]
    assert figures["goes on"]["dr_ci90"] == figures["stops"]["dr_ci90"]


def test_a_promoted_heuristic_is_served_as_it_was_judged(deployment: dict[str, Any], tmp_path: Path) -> None:
    """The model directory written for a winning heuristic decides as the policy the gate replayed."""
    rule = TunedHeuristic("h", HeuristicRule(loop=True, reward_threshold=0.3), math.nan, "ktokens", 1.0)
    candidate = Policy.load(rule_dir(tmp_path / "cand", "rule-0.2", 0.2))
    written = Policy.load(_heuristic_dir(rule, candidate, tmp_path / "heuristic"))
    assert written.kind == "heuristic" and str(written.model_version).startswith("heuristic-")
    judged = rule.policy()
    values = [(true_value(written, t, lam=1.0), true_value(judged, t, lam=1.0)) for t in deployment["held"]]
    assert all(a == b for a, b in values) and len({a for a, _ in values}) > 10


def test_the_runs_judged_on_are_the_most_recently_started_not_the_last_to_finish(tmp_path: Path) -> None:
    """In a burst the last runs to finish are the longest: the held-out share is taken by start;
    the runs logged since a given one, by the log's order."""
    log = tmp_path / "traces.jsonl"
    # logged (finished) in this order; started in the reverse order but for the first two
    started = [5.0, 6.0, 4.0, 3.0, 2.0, 1.0]
    log.write_text(
        "".join(
            json.dumps({"trace_id": f"r{i}", "metrics": {"service_started": s}}) + "\n"
            for i, s in enumerate(started)
        )
    )
    work = tmp_path / "work"
    work.mkdir()
    split = _split([log], 0.34, work)
    train, held, n_train, n_hold, order = split.train, split.held, split.n_train, split.n_hold, split.by
    ids = lambda path: [json.loads(line)["trace_id"] for line in path.read_text().splitlines()]  # noqa: E731
    assert (n_train, n_hold, order) == (3, 3, "started")
    assert ids(held) == ["r2", "r0", "r1"] and ids(train) == ["r5", "r4", "r3"]
    # a refused candidate's second look: every run logged after its last, in the log's order, however
    # early it started (r4 and r5 started first, and ran longest)
    split = _split([log], 0.34, work, after="r3")
    assert split.since is not None and ids(split.since) == ["r4", "r5"] and split.n_since == 2
    assert split.last_id == "r5" and _split([log], 0.34, work, after="gone").since is None
    # older logs (no start time on some run): by when they were logged, as before
    with log.open("a") as fh:
        fh.write(json.dumps({"trace_id": "old"}) + "\n")
    split = _split([log], 0.3, work)
    train, held, order = split.train, split.held, split.by
    assert order == "logged" and ids(held) == ["r4", "r5", "old"]


def _keep(
    store: Path, model: Path, logs: Path, after_run: int, first_look: dict[str, Any] | None = None
) -> str:
    """Keep ``model`` as the store's refused candidate, as if refused with run ``after_run`` logged last."""
    seen = json.loads((logs / "traces.jsonl").read_text().splitlines()[after_run])["trace_id"]
    ModelStore(store).keep_candidate(model, seen_through=seen, first_look=first_look or {})
    return str(seen)


def test_a_refused_candidate_is_judged_again_on_the_runs_logged_since(
    deployment: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The second look: the same gate, on exactly the runs logged after its refusal, against the truth."""
    since = deployment["twins"][150:]
    for lam, passes in ((1.0, True), (0.1, False)):
        d = {**deployment, "store": tmp_path / f"store-{lam}"}
        seen = _keep(d["store"], d["candidate"], d["logs"], 149)
        got = _retrain(d, lam, capsys, "--fit", "--dry-run")
        look = got["second_look"]
        assert look["judged_on"]["runs"] == 150 and look["judged_on"]["after"] == seen
        assert (look["judged_on"]["first"], look["judged_on"]["last"]) == ("sim-21-150", "sim-21-299")
        # the rule stops before the champion does: read from the log exactly, so the figure is the truth
        truth = _truth(d["candidate"], since, lam) - _truth(d["champion"], since, lam)
        assert look["estimates"]["candidate"]["support"]["exact"] == 150
        assert look["difference"]["mean"] == pytest.approx(truth, abs=1e-9)
        assert (look["winner"] == "candidate") is passes
        lo, hi = look["difference"]["ci90"]
        assert (lo > 0) if passes else (hi < 0)
    # found worse the first time, it is judged again all the same (on runs the first look never saw),
    # and its first look is kept beside the second; not judged again when its last run is gone
    d = {**deployment, "store": tmp_path / "store-worse"}
    _keep(d["store"], d["candidate"], d["logs"], 149, {"mean": -0.08, "ci90": [-0.1, -0.06]})
    got = _retrain(d, 1.0, capsys, "--fit", "--dry-run")
    assert got["second_look"]["winner"] == "candidate" and got["second_look"]["first_look"]["mean"] == -0.08
    ModelStore(d["store"]).keep_candidate(d["candidate"], seen_through="a-run-rotated-away")
    got = _retrain(d, 1.0, capsys, "--fit", "--dry-run")
    assert "no longer in the log" in got["second_look"]["skipped"]


def test_a_refused_candidate_passing_its_second_look_is_promoted_before_a_tuned_heuristic(
    explored: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """At λ 0.1 the fitted candidate is refused for support and a tuned heuristic passes: kept
    from a first retrain (as a candidate refused before), that heuristic passes its second look
    and is the one promoted, from the store's ``candidate/``."""
    d = {**explored, "store": tmp_path / "store"}
    first = _retrain(d, 0.1, capsys, "--fit", "--dry-run")
    assert first["estimates"]["candidate"]["enough"] is False and first["winner"] == "heuristic turn_cap"
    kept = tmp_path / "kept"
    shutil.copytree(d["store"] / "work" / "heuristic", kept)
    version = Policy.load(kept).model_version
    _keep(d["store"], kept, d["logs"], 149)
    got = _retrain(d, 0.1, capsys, "--fit")
    assert got["promoted"] is True and got["winner"] == "kept candidate", got["reason"]
    assert got["reason"].startswith(
        f"the candidate refused last time ({version}), judged again on the 150 runs"
    )
    assert "heuristic turn_cap is promoted" in got["reason"]  # what the held-out runs alone would do
    assert got["difference"]["policy"] == "kept candidate" and got["difference"]["ci90"][0] > 0
    assert got["promoted_policy"] == {"policy": "kept candidate", "version": version}
    store = ModelStore(d["store"])
    champion = store.champion()
    assert champion is not None and champion.version == version
    assert Policy.load(champion.path).model_version == version  # copied in before candidate/ was removed
    assert store.kept_candidate() is None and not (d["store"] / "candidate.json").exists()
    (promotion,) = store.history()
    assert promotion["evidence"]["second_look"]["judged_on"]["runs"] == 150


def _rounds(
    root: Path, champion: Path, *, seed: int, n_rounds: int, per_round: int
) -> list[tuple[Path, list[dict[str, Any]]]]:
    """Rounds of new runs the champion served with exploration: each a retrain's held-out runs, and
    their run-to-cap twins."""
    twins = list(
        simulate(n_rounds * per_round, seed=seed, topology="centralized", run_to_cap=True, optimal_lambda=0.1)
    )
    served, rng = Policy.load(champion), random.Random(seed)
    return [
        (_log(root / f"round-{r}.jsonl", served, batch, EPS, RHO, rng), batch)
        for r in range(n_rounds)
        if (batch := twins[r * per_round : (r + 1) * per_round])
    ]


def _judged_over_rounds(
    root: Path, candidate: Path, champion: Path, lam: float, *, seed: int, n_rounds: int, per_round: int
) -> tuple[list[Judgement], list[dict[str, Any]]]:
    """The gate round after round, its sequential evidence kept in a model store between rounds (as a
    retrain keeps it), until it promotes; the judgements and the twins of the runs judged."""
    store = ModelStore(root / "store")
    cand, champ = Policy.load(candidate), Policy.load(champion)
    kw: dict[str, Any] = {"lam": lam, "objective": Objective(lam=lam), "n_boot": 200, "cost_unit": "ktokens"}
    got: list[Judgement] = []
    seen: list[dict[str, Any]] = []
    for held, twins in _rounds(root, champion, seed=seed, n_rounds=n_rounds, per_round=per_round):
        stored = Evidence.from_dict(store.sequential() or {})
        sequence = _evidence_for(stored, champ.model_version, cand.model_version)
        got.append(judge(cand, champ, held, sequence=sequence, **kw))
        seen += twins
        if got[-1].promoted:
            break
        assert got[-1].sequence is not None
        store.save_sequential(got[-1].sequence.to_dict())
    return got, seen


def test_a_small_gain_too_small_for_a_rounds_interval_is_promoted_by_the_sequential_evidence(
    tmp_path: Path,
) -> None:
    """Rounds of 40 new runs each (a retrain every few runs): too few for one round's figure, so the
    one-round gate never passes; the evidence carried over the rounds promotes the small true gain."""
    champion = rule_dir(tmp_path / "champion", "rule-0.5", 0.5)
    candidate = rule_dir(tmp_path / "candidate", "rule-0.4", 0.4)
    got, seen = _judged_over_rounds(tmp_path, candidate, champion, 0.25, seed=31, n_rounds=40, per_round=40)
    truth = _truth(candidate, seen, 0.25) - _truth(champion, seen, 0.25)
    assert 0 < truth < 0.03  # a small gain: about a tenth of a run's spread
    *before, last = got
    assert len(before) >= 3 and all(not j.promoted for j in before)
    assert all("40 logged runs: at least 50 are needed" in j.reason for j in got)
    assert all("; the sequential evidence: " in j.reason for j in before)
    assert all(not j.evaluation.estimates["candidate"].enough for j in got)
    assert last.promoted and last.winner == "candidate" and last.decided_by == "sequence", last.reason
    seq = last.evidence["sequential"]
    assert seq["rounds"] == len(got) and seq["runs"] == 40 * len(got) and seq["added"] == 40
    assert 0 < seq["lower"] <= truth and seq["e_value"] >= 20 and seq["passed"] is True
    assert last.reason.startswith(f"better by the sequential evidence: {40 * len(got)} held-out runs over")
    assert last.evidence["decided_by"] == "sequence"
    assert before[-1].evidence["sequential"]["e_value"] < 20  # the round before had not enough


def test_a_worse_candidate_is_never_promoted_over_many_rounds(tmp_path: Path) -> None:
    """Three deployments of 12 rounds of 60 runs each (its figure supported every round): neither the
    one-round gate nor the sequence promotes a candidate a little worse than the champion."""
    champion = rule_dir(tmp_path / "champion", "rule-0.5", 0.5)
    candidate = rule_dir(tmp_path / "candidate", "rule-0.4", 0.4)
    for seed in (51, 52, 53):
        root = tmp_path / f"seed-{seed}"
        root.mkdir()
        got, seen = _judged_over_rounds(root, candidate, champion, 0.15, seed=seed, n_rounds=12, per_round=60)
        truth = _truth(candidate, seen, 0.15) - _truth(champion, seen, 0.15)
        assert -0.03 < truth < 0
        assert len(got) == 12 and not any(j.promoted for j in got)
        seq = got[-1].evidence["sequential"]
        assert (
            seq["runs"] == 720
            and seq["rounds"] == 12
            and seq["lower"] <= truth
            and seq["e_value"] < seq["needed"]
        )


def test_the_sequential_evidence_counts_new_runs_once_and_resets_with_the_champion(
    deployment: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``stopserve retrain --candidate`` round after round: its held-out runs add to the evidence in
    ``sequential.json`` once each; another champion, or another candidate, starts it anew."""
    d = {**deployment, "store": tmp_path / "store"}
    store = ModelStore(d["store"])
    first = _retrain(d, 0.1, capsys)
    seq = first["sequential"]
    assert not first["promoted"] and seq["runs"] == 150 and seq["rounds"] == 1 and seq["added"] == 150
    assert (seq["champion"], seq["candidate"]) == ("rule-0.5", "rule-0.2") and seq["lower"] < 0
    assert "; the sequential evidence: 150 held-out runs over 1 round, " in first["reason"]
    saved = store.sequential()
    assert saved is not None and len(saved["run_ids"]) == 150
    held_ids = [json.loads(line)["trace_id"] for line in _held(deployment, tmp_path).read_text().splitlines()]
    assert saved["run_ids"] == held_ids
    (refusal,) = store.history()
    assert refusal["evidence"]["sequential"]["runs"] == 150 and refusal["evidence"]["decided_by"] is None
    # the same log again: every held-out run was counted, nothing is added
    again = _retrain(d, 0.1, capsys)
    assert again["sequential"]["runs"] == 150 and again["sequential"]["added"] == 0
    assert again["sequential"]["rounds"] == 1 and "every run was counted before" in again["reason"]
    # a log rotated on: half the held-out runs were counted, the other half are new
    lines = (deployment["logs"] / "traces.jsonl").read_text().splitlines()
    twins = list(simulate(75, seed=22, topology="centralized", run_to_cap=True, optimal_lambda=0.1))
    logs = tmp_path / "logs"
    logs.mkdir()
    new = _log(tmp_path / "new.jsonl", Policy.load(d["champion"]), twins, EPS, RHO, random.Random(1))
    (logs / "traces.jsonl").write_text("\n".join(lines[75:]) + "\n" + new.read_text())
    rotated = _retrain({**d, "logs": logs}, 0.1, capsys)
    assert rotated["sequential"]["added"] == 75 and rotated["sequential"]["runs"] == 225
    assert rotated["sequential"]["rounds"] == 2
    saved = store.sequential()
    assert saved is not None and len(set(saved["run_ids"])) == len(saved["run_ids"]) == 225
    # another champion: the evidence was about the one before, and starts from this round's runs
    other = rule_dir(tmp_path / "other", "rule-0.45", 0.45)  # stops where the logging champion did
    reset = _retrain({**d, "champion": other}, 0.1, capsys)
    assert reset["sequential"]["champion"] == "rule-0.45" and reset["sequential"]["runs"] == 150
    assert reset["sequential"]["rounds"] == 1
    # another candidate too
    cand = rule_dir(tmp_path / "cand", "rule-0.3", 0.3)
    fresh = _retrain({**d, "champion": other, "candidate": cand}, 0.1, capsys)
    assert fresh["sequential"]["candidate"] == "rule-0.3" and fresh["sequential"]["rounds"] == 1
    # the text output says it too: in the reason of a refusal, on a line of its own beside a promotion
    # by the interval
    capsys.readouterr()
    argv = ["retrain", "--log-dir", str(d["logs"]), "--model-store", str(d["store"]), "--champion"]
    argv += [str(other), "--candidate", str(cand), "--lambda", "0.1", "--holdout", str(HOLDOUT)]
    assert cli([*argv, "--n-boot", "100", "--no-progress", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "; the sequential evidence: 150 held-out runs over 1 round (none added this round: every" in text
    assert "sequential evidence, candidate against the champion" not in text  # said once
    argv = ["retrain", "--log-dir", str(d["logs"]), "--model-store", str(d["store"]), "--champion"]
    argv += [
        str(d["champion"]),
        "--candidate",
        str(d["candidate"]),
        "--lambda",
        "1",
        "--holdout",
        str(HOLDOUT),
    ]
    assert cli([*argv, "--n-boot", "400", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "PROMOTED: better on the 150 held-out runs: candidate − champion" in text
    assert "sequential evidence, candidate against the champion: 150 held-out runs over 1 round," in text
    # a promotion clears it: the next challenger is judged against another champion
    promotion = store.history()[-1]
    assert promotion["kind"] == "promotion" and promotion["evidence"]["decided_by"] == "interval"
    assert store.sequential() is None


def test_a_kept_candidate_with_the_stronger_sequential_evidence_stays_kept(
    deployment: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fitted candidate refused does not replace the kept one when the kept one's evidence, gathered
    over its rounds, is the stronger: it stays kept (and shadowed), its evidence grows by its second look."""
    d = {**deployment, "store": tmp_path / "store"}
    kept = rule_dir(tmp_path / "kept", "rule-0.45", 0.45)  # decides as the champion on these runs
    seen = _keep(d["store"], kept, d["logs"], 149, {"mean": 0.02})
    earlier = Evidence.start("rule-0.5", "rule-0.45")
    rng = np.random.default_rng(3)
    earlier.add([f"earlier-{i}" for i in range(300)], rng.normal(0.02, 0.1, size=300), floor=1.3)
    assert 1 < earlier.capital <= earlier.e_value < 20  # some evidence, not enough
    store = ModelStore(d["store"])
    store.save_sequential(earlier.to_dict())
    got = _retrain(d, 0.1, capsys, "--fit")
    assert got["promoted"] is False, got["reason"]
    look = got["second_look"]["sequential"]
    assert look["added"] == 150 and look["runs"] == 450 and look["rounds"] == 2
    assert look["capital"] > got["sequential"]["capital"]
    assert "the candidate refused last time stays kept: its sequential evidence" in got["reason"]
    assert got["kept"] == "the candidate refused last time"
    now = store.kept_candidate()
    last = json.loads((d["logs"] / "traces.jsonl").read_text().splitlines()[-1])["trace_id"]
    assert now is not None and now.seen_through == last != seen and now.first_look == {"mean": 0.02}
    assert Policy.load(now.path).model_version == "rule-0.45"
    saved = Evidence.from_dict(store.sequential() or {})
    assert saved is not None and saved.matches("rule-0.5", "rule-0.45") and saved.runs == 450
    (refusal,) = store.history()
    assert refusal["kept"] == str(now.path) and refusal["candidate"] == str(d["store"] / "work" / "candidate")


def test_stopserve_retrain_promotes_on_the_sequential_evidence_and_logs_what_decided(
    deployment: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Earlier rounds left evidence short of 20; this round's interval alone refuses (its lower end
    below 0), and its 150 runs take the evidence past 20: promoted, said so, logged, the state cleared."""
    candidate = rule_dir(tmp_path / "rule-0.4", "rule-0.4", 0.4)
    d = {**deployment, "store": tmp_path / "store", "candidate": candidate}
    truth = _truth(candidate, d["held"], 0.25) - _truth(d["champion"], d["held"], 0.25)
    assert 0 < truth < 0.01
    earlier = Evidence.start("rule-0.5", "rule-0.4")
    gains = np.random.default_rng(4).normal(0.015, 0.1, size=700)
    earlier.add([f"earlier-{i}" for i in range(700)], gains, floor=1.8)
    assert 10 < earlier.e_value < 20
    store = ModelStore(d["store"])
    store.save_sequential(earlier.to_dict())
    capsys.readouterr()
    argv = ["retrain", "--log-dir", str(d["logs"]), "--model-store", str(d["store"]), "--champion"]
    argv += [str(d["champion"]), "--candidate", str(candidate), "--lambda", "0.25", "--holdout", str(HOLDOUT)]
    assert cli([*argv, "--n-boot", "400", "--no-progress", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "PROMOTED (dry run): better by the sequential evidence: 850 held-out runs over 2 rounds" in text
    assert "this round alone, on the 150 held-out runs: candidate − champion" in text
    got = _retrain(d, 0.25, capsys)
    assert got["promoted"] and got["decided_by"] == "sequence" and got["winner"] == "candidate"
    assert got["difference"]["ci90"][0] < 0  # this round's interval would have refused it
    seq = got["sequential"]
    assert seq["runs"] == 850 and seq["added"] == 150 and seq["rounds"] == 2 and seq["e_value"] >= 20
    assert seq["lower"] > 0 and seq["passed"] is True
    (promotion,) = store.history()
    assert promotion["kind"] == "promotion" and promotion["evidence"]["decided_by"] == "sequence"
    assert promotion["evidence"]["sequential"]["runs"] == 850
    champion = store.champion()
    assert champion is not None and champion.version == "rule-0.4"
    assert store.sequential() is None  # a new champion: the next candidate starts from nothing


def test_the_sequence_takes_a_round_only_as_evidence_and_sizes_its_floor_on_the_weights(
    deployment: dict[str, Any], explored: dict[str, Any], tmp_path: Path
) -> None:
    """A candidate going on past stops few explored runs show what follows adds nothing; one judged
    through explored runs adds its round, its floor that of a run read through its largest weight."""
    kw: dict[str, Any] = {"lam": 0.1, "objective": Objective(lam=0.1), "n_boot": 200, "cost_unit": "ktokens"}
    late = Policy.load(rule_dir(tmp_path / "late", "rule-0.9", 0.9))
    thin = judge(
        late,
        Policy.load(deployment["champion"]),
        _held(deployment, tmp_path),
        sequence=Evidence.start("a", "b"),
        **kw,
    )
    assert not thin.evaluation.estimates["candidate"].enough
    assert thin.evidence["sequential"]["runs"] == 0 and thin.evidence["sequential"]["supported"] is False
    assert "the sequential evidence: no runs yet (this round's figures are not supported" in thin.reason
    (tmp_path / "explored").mkdir()
    held = _held(explored, tmp_path / "explored")
    on = Policy.load(rule_dir(tmp_path / "on", "rule-0.4", 0.4))
    got = judge(on, Policy.load(explored["champion"]), held, sequence=Evidence.start("a", "b"), **kw)
    cand = got.evaluation.estimates["candidate"]
    seq = got.evidence["sequential"]
    assert seq["supported"] is True and seq["added"] == 150 and cand.weighted > 0 and cand.max_weight > 1
    c_max = float(got.evaluation.dp.trace_c_final.max())
    assert seq["floor"] == pytest.approx(cand.max_weight * (1 + 0.1 * c_max))
