"""The sidecar learns your system (issue 25): a deployment simulator, real replays, retrain cost.

Every figure comes from a real ``stopserve serve`` on loopback, driven over HTTP by
``stopserve.training.deploy.drive`` (``POST /v1/decide:batch`` one decision point at a
time; a stop cuts the run; every outcome posted, so the service logs the runs it served):

- **Deployment simulator.** Per topology and λ: the service starts from the shipped default
  model with exploration on (``STOPSERVE_EXPLORE``) and ``STOPSERVE_RETRAIN_EVERY`` set to a
  round's size, so after each round it retrains in the background (``stopserve retrain``
  with the simulator's protocol options) and follows what it promotes. The runs are
  ``stopserve simulate --run-to-cap --optimal`` traces, so every stop's value is exact and
  the behavior's and the optimum's values on the same runs are the ruler. Per round: the
  served value, the champion's value without exploration on the same runs (what
  exploration cost), the gap closed; per retrain: the off-policy estimates of the
  candidate against its true value on the held-out runs (and of a refused candidate's
  second look on the runs logged since), and each promotion's true change on a fixed test
  set of fresh runs.
- **Final champions, re-ruled** (``--parts final``, with the deploy run's ``--workdir``): each
  deployment's last champion on 10,000 fresh runs (the first 2,000 are its test set), each
  gap with a 90% bootstrap interval; the gap target reads these when they were measured.
- **Real replays.** MINT, InterCode and SWE runs (``../shared/data``) replayed through the
  service (the default model, exploration on), 2,000 logged runs of one system (fewer
  where the set is smaller), one ``stopserve retrain``; then the champion it leaves and the
  best tuned heuristic (tuned on the logged runs) on that system's next runs, by truncation.
- **Retrain cost.** ``stopserve retrain`` on a log of 10,000 served runs against
  ``stopserve train`` on the same traces, and decide p99 under load while a background
  retrain runs against the quiet p99 of the same server, windows interleaved.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _common import ROOT, SHARED_DATA, Section, Target, command_line, parser, percentile

sys.path.insert(0, str(ROOT / "tests"))

import httpx
from servers import LiveServer

from stopserve.features import RunState
from stopserve.model_store import ModelStore
from stopserve.objective import Objective
from stopserve.policy import Policy
from stopserve.trace import Trace, is_decision_point
from stopserve.training.deploy import drive, end_value, prefix_values, run_cost
from stopserve.training.replay import REPLAY_ENGINE
from stopserve.training.retrain import KEPT, recency_order
from stopserve.training.simulate import SIM_TOPOLOGIES, simulate

DEFAULT_MODEL = ROOT / "models" / "default"
#: The learning curves RESULTS.md shows.
CURVES = ROOT / "bench" / "learning-curves.png"
#: The simulator's documented protocol (docs/simulator.md, "End to end"), for every retrain.
SIM_RETRAIN_ARGS = "--cost-unit ktokens --method optimal --min-turns 2"
EXPLORE = 0.05
ADMIN_TOKEN = "bench-learning"
EXPLORE_STEPS = 5
HOLDOUT = 0.3

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "topologies": ("centralized",),
        "lams": (0.1,),
        "rounds": 2,
        "runs": 200,
        "test": 200,
        "final": 400,
        "real": 300,
        "big": 300,
    },
    "quick": {
        "topologies": ("centralized", "harness"),
        "lams": (0.1, 1.0),
        "rounds": 3,
        "runs": 500,
        "test": 800,
        "final": 2000,
        "real": 1000,
        "big": 2000,
    },
    "full": {
        "topologies": SIM_TOPOLOGIES,
        "lams": (0.1, 1.0),
        "rounds": 5,
        "runs": 1000,
        "test": 2000,
        "final": 10_000,
        "real": 2000,
        "big": 10_000,
    },
}


# --------------------------------------------------------------------------- exact values


def policy_stop(
    policy: Policy, trace: dict[str, Any], *, lam: float | None, cost_share: float | None = None
) -> int | None:
    """The event after which ``policy`` (no exploration) first stops the run; None: never."""
    tr = Trace.model_validate(trace)
    state = RunState(topology=tr.topology, budget=tr.budget)
    for k, ev in enumerate(tr.events):
        state.fold(ev)
        if is_decision_point(ev):
            proposed = ev.type == "stop" and bool(ev.proposed)
            worth = Objective.of(lam, cost_share)
            if policy.decide(state, objective=worth, proposed_stop=proposed).action == "stop":
                return k
    return None


def true_values(
    policy: Policy,
    traces: Sequence[dict[str, Any]],
    lam: float,
    *,
    cost_share: float | None = None,
    cost_unit: str = "ktokens",
    labels_from_rewards: bool = False,
) -> np.ndarray:
    """Each run's exact value under ``policy`` (its stop, else the logged end)."""
    out = []
    for tr in traces:
        k = policy_stop(policy, tr, lam=None if cost_share is not None else lam, cost_share=cost_share)
        if k is None:
            out.append(end_value(tr, lam, cost_unit=cost_unit, labels_from_rewards=labels_from_rewards))
        else:
            out.append(
                prefix_values(tr, lam, cost_unit=cost_unit, labels_from_rewards=labels_from_rewards)[k]
            )
    return np.asarray(out)


def ruler_runs(traces: Sequence[dict[str, Any]], lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Each run's behavior value (its own stop) and optimum, on run-to-cap simulator traces."""
    b = [prefix_values(tr, lam)[int(tr["metrics"]["behavior_stop_index"])] for tr in traces]
    o = [float(tr["metrics"]["optimal_value"]) for tr in traces]
    return np.asarray(b, dtype=np.float64), np.asarray(o, dtype=np.float64)


def ruler(traces: Sequence[dict[str, Any]], lam: float) -> tuple[float, float]:
    """Mean behavior value (the run's own stop) and mean optimum on run-to-cap simulator traces."""
    b, o = ruler_runs(traces, lam)
    return float(b.mean()), float(o.mean())


def gap(value: float, behavior: float, optimum: float) -> float:
    return (value - behavior) / (optimum - behavior) if optimum > behavior else math.nan


def _boot_ci(diff: np.ndarray, seed: int = 0, n: int = 1000) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, diff.size, size=(n, diff.size))
    means = diff[idx].mean(axis=1)
    return float(np.quantile(means, 0.05)), float(np.quantile(means, 0.95))


# --------------------------------------------------------------------------- the service


def _server(work: Path, env: dict[str, str], model: Path = DEFAULT_MODEL) -> LiveServer:
    base = {
        "STOPSERVE_EXPLORE": str(EXPLORE),
        "STOPSERVE_EXPLORE_STEPS": str(EXPLORE_STEPS),
        "STOPSERVE_SEED": "25",
        "STOPSERVE_LOG_LEVEL": "warning",
        "STOPSERVE_FSYNC_INTERVAL_S": "0.5",
        "STOPSERVE_ADMIN_TOKEN": ADMIN_TOKEN,
    }
    return LiveServer(log_dir=work / "logs", model=model, env={**base, **env}, startup_timeout=120)


def _promotions(store: Path) -> list[dict[str, Any]]:
    path = store / "promotions.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait_retrain(http: httpx.Client, store: Path, seen: int, timeout: float) -> dict[str, Any]:
    """The next promotions-log record after ``seen`` records; once promoted, the service serves it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = _promotions(store)
        if len(records) > seen:
            record = records[seen]
            if record["kind"] == "promotion":
                while time.monotonic() < deadline:
                    if http.get("/v1/model").json()["model_version"] == record["version"]:
                        break
                    time.sleep(0.2)
            return record
        time.sleep(0.5)
    log = store / "retrain.log"
    raise RuntimeError(
        f"no retrain finished within {timeout}s:\n{log.read_text()[-3000:] if log.exists() else ''}"
    )


def _logged(logs: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (logs / "traces.jsonl").read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------- deployment simulator


def deployment(topology: str, lam: float, size: dict[str, Any], work: Path, seed: int) -> dict[str, Any]:
    """One deployment: rounds of runs of one topology served, retrained after each round."""
    work.mkdir(parents=True, exist_ok=True)
    rounds, n = size["rounds"], size["runs"]
    test = list(
        simulate(size["test"], seed=seed + 999, topology=topology, run_to_cap=True, optimal_lambda=lam)
    )
    b_test, o_test = ruler(test, lam)
    env = {
        "STOPSERVE_LAM": repr(lam),
        "STOPSERVE_RETRAIN_EVERY": str(n),
        "STOPSERVE_RETRAIN_ARGS": SIM_RETRAIN_ARGS,
    }
    store = work / "logs" / "models"
    twins: dict[str, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    retrains: list[dict[str, Any]] = []
    kept: Path | None = None
    with _server(work, env) as server, httpx.Client(base_url=server.url, timeout=120) as http:
        champion_path = Path(http.get("/v1/model").json()["path"])
        champion = Policy.load(champion_path, engine=REPLAY_ENGINE)
        champ_test = float(true_values(champion, test, lam).mean())
        for r in range(rounds):
            runs = list(simulate(n, seed=seed + r, topology=topology, run_to_cap=True, optimal_lambda=lam))
            for tr in runs:
                tr["trace_id"] = f"r{r}-{tr['trace_id']}"
                tr["task_id"] = f"r{r}-{tr['task_id']}"
                twins[tr["trace_id"]] = tr
            t0 = time.perf_counter()
            served = drive(server.url, runs, lam=lam, client=http)
            serve_s = time.perf_counter() - t0
            by_id = {s.trace_id: s for s in served}
            v_served = np.array([by_id[tr["trace_id"]].value for tr in runs])
            v_pure = true_values(champion, runs, lam)
            b, o = ruler(runs, lam)
            explored = np.array([by_id[tr["trace_id"]].explored for tr in runs])
            cost = v_pure - v_served
            rows.append(
                {
                    "round": r + 1,
                    "champion": champion.model_version,
                    "served": float(v_served.mean()),
                    "pure": float(v_pure.mean()),
                    "behavior": b,
                    "optimum": o,
                    "gap_served": gap(float(v_served.mean()), b, o),
                    "gap_pure": gap(float(v_pure.mean()), b, o),
                    "champion_test": champ_test,
                    "gap_test": gap(champ_test, b_test, o_test),
                    "explored": float(explored.mean()),
                    "explore_cost": float(cost.mean()),
                    "explore_cost_ci90": _boot_ci(cost, seed=r),
                    "serve_s": serve_s,
                    "decisions": int(sum(s.decisions for s in served)),
                }
            )
            record = _wait_retrain(http, store, len(retrains), timeout=3600)
            retrains.append(
                _judge_retrain(record, store, work / "logs", twins, champion, lam, test, champ_test, kept)
            )
            kept = None
            if record["kind"] == "refusal" and (store / "candidate").is_dir():
                kept = work / f"kept-{r + 1}"  # the next retrain's second look is judged against the truth
                shutil.copytree(store / "candidate", kept, dirs_exist_ok=True)
            if record["kind"] == "promotion":
                champion_path = Path(record["path"])
                champion = Policy.load(champion_path, engine=REPLAY_ENGINE)
                champ_test = retrains[-1]["candidate_test"]
            print(
                f"{topology} λ={lam} round {r + 1}: served {rows[-1]['served']:.4f} pure "
                f"{rows[-1]['pure']:.4f} "
                f"gap {rows[-1]['gap_pure']:.1%} (test {rows[-1]['gap_test']:.1%}); retrain: "
                f"{record['kind']} "
                f"{retrains[-1]['reason'][:90]}",
                file=sys.stderr,
                flush=True,
            )
        output = server.read_output()
    final = {
        "champion": champion.model_version,
        "test": champ_test,
        "gap_test": gap(champ_test, b_test, o_test),
    }
    return {
        "topology": topology,
        "lambda": lam,
        "rounds": rows,
        "retrains": retrains,
        "final": final,
        "test_ruler": {"behavior": b_test, "optimum": o_test, "runs": len(test)},
        "tracebacks": output.count("Traceback"),
    }


def deploy_seed(topology: str, lam: float) -> int:
    """The seed of one deployment (its rounds are ``seed + r``, its test runs ``seed + 999``): by the
    topology's and λ's place in the full size, so a run of some of them repeats those cells."""
    lams = list(SIZES["full"]["lams"])
    at = lams.index(lam) if lam in lams else len(lams)
    return 25_000 + 100 * list(SIM_TOPOLOGIES).index(topology) + 10 * at


def final_ruler(topology: str, lam: float, size: dict[str, Any], work: Path) -> dict[str, Any]:
    """A finished deployment's last champion (its model store in ``work``) on ``final`` fresh runs.

    The deployment's own test set is the first ``test`` of them (the same seed), so both figures
    are given, each with a 90% bootstrap interval over runs: on a gap of a few hundredths of a
    success the test set's ruler moves by several points.
    """
    promoted = ModelStore(work / "logs" / "models").champion()
    # never promoted: the shipped default served every round
    champion = Policy.load(promoted.path if promoted else DEFAULT_MODEL, engine=REPLAY_ENGINE)
    seed = deploy_seed(topology, lam)
    runs = list(
        simulate(size["final"], seed=seed + 999, topology=topology, run_to_cap=True, optimal_lambda=lam)
    )
    b, o = ruler_runs(runs, lam)
    v = true_values(champion, runs, lam)
    rng = np.random.default_rng(seed)

    def ruled(n: int) -> dict[str, Any]:
        idx = rng.integers(0, n, size=(1000, n))
        draws = (v[idx].mean(1) - b[idx].mean(1)) / (o[idx].mean(1) - b[idx].mean(1))
        return {
            "runs": n,
            "behavior": float(b[:n].mean()),
            "optimum": float(o[:n].mean()),
            "value": float(v[:n].mean()),
            "gap": gap(float(v[:n].mean()), float(b[:n].mean()), float(o[:n].mean())),
            "gap_ci90": [float(np.quantile(draws, 0.05)), float(np.quantile(draws, 0.95))],
        }

    return {
        "topology": topology,
        "lambda": lam,
        "champion": champion.model_version,
        "final": ruled(len(runs)),
        "test": ruled(min(size["test"], len(runs))),
    }


def _judge_retrain(
    record: dict[str, Any],
    store: Path,
    logs: Path,
    twins: dict[str, dict[str, Any]],
    champion: Policy,
    lam: float,
    test: list[dict[str, Any]],
    champ_test: float,
    kept: Path | None,
) -> dict[str, Any]:
    """A retrain's off-policy figures against the truth, and a promotion's true change on the test set.

    ``kept``: a copy of the candidate the retrain before refused (its second look is judged too).
    """
    evidence = record.get("evidence", {})
    out: dict[str, Any] = {"kind": record["kind"], "reason": record.get("reason", evidence.get("reason", ""))}
    estimates = evidence.get("estimates")
    if not estimates:
        return out
    logged = _logged(logs)
    look = evidence.get("second_look") or {}
    # the runs logged since the refused candidate's refusal, in the log's order, as the retrain took them
    since = (
        [twins[t["trace_id"]] for t in logged[len(logged) - int(look["judged_on"]["runs"]) :]]
        if "difference" in look
        else []
    )
    if "difference" in look and kept is not None:  # the refused candidate judged again on the runs since
        kept_policy = Policy.load(kept, engine=REPLAY_ENGINE)
        out["second_look"] = {
            "dr": look["difference"]["mean"],
            "ci90": look["difference"]["ci90"],
            "truth": float(
                true_values(kept_policy, since, lam).mean() - true_values(champion, since, lam).mean()
            ),
            "passed": look.get("winner") is not None,
            "support": look["estimates"]["candidate"]["support"],
            "runs": len(since),
        }
    elif look:
        out["second_look"] = {"skipped": look.get("skipped", "")}
    # the judgement that decided: the second look's when it promoted the refused candidate
    kept_won = evidence.get("winner") == KEPT
    judged = look if kept_won else evidence
    candidate_dir = Path(record["path"]) if record["kind"] == "promotion" else Path(record["candidate"])
    candidate = Policy.load(candidate_dir, engine=REPLAY_ENGINE)
    if kept_won:
        held = since
    else:
        n_hold = int(evidence["judged_on"]["runs"])
        order, _ = recency_order([t.get("metrics") or {} for t in logged])  # as the retrain split them
        held = [twins[logged[i]["trace_id"]] for i in order[len(order) - n_hold :]]
    truth = {
        "candidate": float(true_values(candidate, held, lam).mean()),
        "champion": float(true_values(champion, held, lam).mean()),
    }
    # the challenger the difference is of: the candidate, or the tuned heuristic promoted instead
    shown = judged["difference"].get("policy", "candidate")
    out["promoted_policy"] = evidence.get("winner")
    for who in ("candidate", "champion"):
        est = judged["estimates"][shown if who == "candidate" else who]
        lo, hi = est["dr_ci90"]
        out[who] = {
            "truth": truth[who],
            "dr": est["dr"],
            "dr_ci90": [lo, hi],
            "ips": est["ips"],
            "ips_ci90": est["ips_ci90"],
            "covered_dr": lo <= truth[who] <= hi,
            "covered_ips": est["ips_ci90"][0] <= truth[who] <= est["ips_ci90"][1],
            "support": est["support"],
            "enough": est["enough"],
        }
    diff = judged["difference"]
    out["difference"] = {
        "dr": diff["mean"],
        "ci90": diff["ci90"],
        "truth": truth["candidate"] - truth["champion"],
    }
    if record["kind"] == "promotion":
        cand_test = float(true_values(candidate, test, lam).mean())
        width = diff["ci90"][1] - diff["ci90"][0]
        out["candidate_test"] = cand_test
        out["test_change"] = cand_test - champ_test
        out["interval_width"] = width
        out["safe"] = cand_test - champ_test >= -width
    return out


# --------------------------------------------------------------------------- real replays


def real_replay(name: str, size: dict[str, Any], work: Path) -> dict[str, Any] | str:
    """One real system: serve ``real`` logged runs, retrain once, judge on that system's next runs."""
    from stopserve.training.corpus import REAL_SETS, import_set

    if not SHARED_DATA.exists():
        return f"{SHARED_DATA} is absent"
    path = import_set(name, SHARED_DATA, work / "imported")
    traces = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    spec = REAL_SETS[name]
    if name == "intercode":  # one system: the largest (gpt-3.5 on SQL)
        traces = [t for t in traces if t.get("system") == "intercode-sql/gpt-3.5"]
    labels = name == "intercode"  # graded every turn: rewards are the quality labels
    unit = "usd" if name == "swe" else "ktokens"
    rng = random.Random(25)
    rng.shuffle(traces)
    n_log = min(size["real"], (2 * len(traces)) // 3)
    logged, following = traces[:n_log], traces[n_log : n_log + size["real"]]
    share = 0.3
    lam = share / float(np.mean([run_cost(t, unit) for t in logged]))
    env = {"STOPSERVE_COST_SHARE": repr(share)}
    work.mkdir(parents=True, exist_ok=True)
    with _server(work, env) as server, httpx.Client(base_url=server.url, timeout=120) as http:
        drive(
            server.url,
            logged,
            cost_share=share,
            value_lambda=lam,
            cost_unit=unit,
            labels_from_rewards=labels,
            client=http,
        )
        args = [
            sys.executable,
            "-m",
            "stopserve",
            "retrain",
            "--log-dir",
            str(work / "logs"),
            "--cost-share",
            repr(share),
            "--cost-unit",
            unit,
            "--group-by",
            spec.group_by,
            "--no-progress",
            "--json",
        ]
        if labels:
            args.append("--labels-from-rewards")
        t0 = time.perf_counter()
        proc = subprocess.run(args, capture_output=True, text=True, check=False, timeout=7200)
        retrain_s = time.perf_counter() - t0
        if proc.returncode != 0:
            return f"retrain failed: {proc.stderr[-2000:]}"
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        deadline = time.monotonic() + 30
        if result["promoted"]:
            # the candidate, or the tuned heuristic the gate promoted instead
            want = (result.get("promoted_policy") or {}).get("version") or result["candidate"]["version"]
            while time.monotonic() < deadline and http.get("/v1/model").json()["model_version"] != want:
                time.sleep(0.2)
        champion = Policy.load(Path(http.get("/v1/model").json()["path"]), engine=REPLAY_ENGINE)
    lam = float(result.get("lambda", lam))  # what the retrain judged at
    default = Policy.load(DEFAULT_MODEL, engine=REPLAY_ENGINE)
    best = result.get("best_heuristic")
    heuristic = _heuristic(logged, lam, unit, labels, spec.group_by, best)
    kw = {"cost_share": share, "cost_unit": unit, "labels_from_rewards": labels}
    v_champ = true_values(champion, following, lam, **kw)
    v_default = true_values(default, following, lam, **kw)
    v_heur = true_values(heuristic, following, lam, cost_unit=unit, labels_from_rewards=labels)
    v_logged = np.array([end_value(t, lam, cost_unit=unit, labels_from_rewards=labels) for t in following])
    diff = v_champ - v_heur
    lo, hi = _boot_ci(diff)
    return {
        "set": name,
        "system": "intercode-sql/gpt-3.5" if name == "intercode" else name,
        "logged_runs": len(logged),
        "next_runs": len(following),
        "lambda": lam,
        "cost_unit": unit,
        "promoted": result["promoted"],
        "reason": result["reason"],
        "champion": champion.model_version,
        "best_heuristic": best,
        "values": {
            "champion": float(v_champ.mean()),
            "best_heuristic": float(v_heur.mean()),
            "default": float(v_default.mean()),
            "logged": float(v_logged.mean()),
        },
        "champion_minus_heuristic": float(diff.mean()),
        "champion_minus_heuristic_ci90": [lo, hi],
        "retrain_s": retrain_s,
    }


def _heuristic(
    logged: list[dict[str, Any]], lam: float, unit: str, labels: bool, group_by: str, best: str | None
) -> Policy:
    """The best tuned heuristic family (as the retrain's trainer ranked it), tuned on the logged runs."""
    from stopserve.training.heuristics import tune_heuristics
    from stopserve.training.labels import build_decision_points

    dp = build_decision_points(
        (Trace.model_validate(t) for t in logged),
        cost_unit=unit,
        labels_from_rewards=labels,
        group_by=group_by,
    )
    family = (best or "heuristic combination").removeprefix("heuristic ")
    policy: Policy = tune_heuristics(dp, lam)[family].policy()
    return policy


# --------------------------------------------------------------------------- retrain cost


def retrain_cost(size: dict[str, Any], work: Path) -> dict[str, Any]:
    """``stopserve retrain`` on a log of ``big`` served runs against ``stopserve train`` on those traces."""
    work.mkdir(parents=True, exist_ok=True)
    lam = 0.1
    runs = list(simulate(size["big"], seed=4242, topology="all", run_to_cap=True, optimal_lambda=lam))
    with _server(work, {"STOPSERVE_LAM": repr(lam)}) as server:
        drive(server.url, runs, lam=lam)
    traces = work / "logs" / "traces.jsonl"
    common = ["--lambda", repr(lam), *SIM_RETRAIN_ARGS.split(), "--no-progress"]
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "stopserve", "train", str(traces), "-o", str(work / "trained"), *common],
        check=True,
        capture_output=True,
        timeout=7200,
    )
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "stopserve", "retrain", "--log-dir", str(work / "logs"), "--json", *common],
        check=True,
        capture_output=True,
        text=True,
        timeout=7200,
    )
    retrain_s = time.perf_counter() - t0
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "runs": len(runs),
        "train_s": train_s,
        "retrain_s": retrain_s,
        "ratio": retrain_s / train_s,
        "retrain_fit_s": result.get("timings", {}).get("fit_s"),
        "retrain_evaluate_s": result.get("timings", {}).get("evaluate_s"),
        "promoted": result["promoted"],
    }


def p99_during_retrain(size: dict[str, Any], work: Path) -> dict[str, Any]:
    """Decide latency under steady load: quiet windows before and after, and while a retrain runs."""
    work.mkdir(parents=True, exist_ok=True)
    lam = 0.1
    n_log = max(200, size["big"] // 5)
    seconds = {"tiny": 2.0, "quick": 8.0, "full": 15.0}[size["name"]]
    store = work / "logs" / "models"
    runs = list(simulate(n_log, seed=5151, topology="all", run_to_cap=True, optimal_lambda=lam))
    env = {
        "STOPSERVE_LAM": repr(lam),
        "STOPSERVE_RETRAIN_EVERY": str(n_log + 1),
        "STOPSERVE_RETRAIN_ARGS": SIM_RETRAIN_ARGS,
    }
    quiet: list[dict[str, Any]] = []
    busy: list[dict[str, Any]] = []
    with _server(work, env) as server, httpx.Client(base_url=server.url, timeout=120) as http:
        drive(server.url, runs, lam=lam, client=http)  # the log to retrain on: n_log outcomes
        for _ in range(2):
            quiet.append(_load_window(server.url, seconds))
        started = time.monotonic()
        drive(server.url, runs[:1], lam=lam, client=http, run_prefix="trigger-")  # outcome n_log + 1: retrain
        while not _promotions(store) and time.monotonic() - started < 3600:
            busy.append(_load_window(server.url, seconds))
        retrain_s = time.monotonic() - started
        for _ in range(2):
            quiet.append(_load_window(server.url, seconds))
        # a refused candidate decides in the shadow after it (exploration is on): say so
        shadowed = len(http.get("/v1/model").json()["challengers"])
        # what one more shadow challenger costs a decide call (the default model beside the
        # champion): windows with and without it, alternated, on the same champion
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        body = {"model_dir": str(DEFAULT_MODEL), "name": "bench-shadow"}
        pairs: list[tuple[float, float]] = []
        for _ in range(3):
            without = _load_window(server.url, seconds)["p99_ms"]
            http.post("/v1/admin/challengers", json=body, headers=auth).raise_for_status()
            pairs.append((without, _load_window(server.url, seconds)["p99_ms"]))
            http.delete("/v1/admin/challengers/bench-shadow", headers=auth).raise_for_status()
    return {
        "retrain": (_promotions(store) or [{}])[-1].get("kind"),
        "challengers_after": shadowed,
        "shadow": {
            "pairs": pairs,
            "without_p99_ms": statistics.median(a for a, _ in pairs),
            "with_p99_ms": statistics.median(b for _, b in pairs),
        },
        "quiet_p99_ms": statistics.median(w["p99_ms"] for w in quiet),
        "retrain_p99_ms": statistics.median(w["p99_ms"] for w in busy) if busy else math.nan,
        "quiet_windows": len(quiet),
        "retrain_windows": len(busy),
        "retrain_s": retrain_s,
        "windows": {"quiet": quiet, "retrain": busy},
        "logged_runs": n_log,
    }


def _load_window(url: str, seconds: float) -> dict[str, Any]:
    """Two client threads deciding turn after turn for ``seconds``: requests, p50, p99."""
    from reliability.harness import Load

    load = Load(url, workers=2, tag=f"p{time.monotonic_ns()}-").start()
    time.sleep(seconds)
    load.stop()
    lat = sorted(load.latencies)
    return {
        "requests": load.sent,
        "p50_ms": 1000 * percentile(lat, 50) if lat else math.nan,
        "p99_ms": 1000 * percentile(lat, 99) if lat else math.nan,
    }


# --------------------------------------------------------------------------- report


def _plot(deployments: list[dict[str, Any]], path: Path) -> None:
    from stopserve.plotting import pyplot, save

    topologies = sorted({d["topology"] for d in deployments}, key=SIM_TOPOLOGIES.index)
    lams = sorted({d["lambda"] for d in deployments})
    plt = pyplot()
    fig, axes = plt.subplots(
        len(lams), len(topologies), figsize=(3.2 * len(topologies), 3.0 * len(lams)), squeeze=False
    )
    for d in deployments:
        ax = axes[lams.index(d["lambda"])][topologies.index(d["topology"])]
        rounds = [row["round"] for row in d["rounds"]]
        ax.plot(rounds, [100 * row["gap_served"] for row in d["rounds"]], "o-", label="served (explore 5%)")
        ax.plot(
            rounds, [100 * row["gap_pure"] for row in d["rounds"]], "s--", label="champion, no exploration"
        )
        ax.plot(
            [rounds[-1] + 1],
            [100 * d["final"]["gap_test"]],
            "k*",
            markersize=10,
            label="final champion, test runs",
        )
        ax.axhline(0, color="grey", lw=0.8)
        ax.axhline(100, color="green", lw=0.8)
        ax.axhline(90, color="green", lw=0.5, ls=":")
        ax.set_title(f"{d['topology']}, λ {d['lambda']:g}", fontsize=9)
        ax.set_xlabel("round (1: the shipped default)", fontsize=8)
        ax.set_ylabel("% of behavior → optimum gap", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    save(fig, path)


def main() -> int:
    p = parser((__doc__ or "").splitlines()[0])
    p.add_argument(
        "--parts",
        default="deploy,final,real,cost",
        help="comma list of deploy, final (the last champions of the deploy runs in --workdir on the "
        "size's 'final' fresh runs), real, cost",
    )
    p.add_argument("--topologies", help="comma list (default: the size's)")
    p.add_argument("--lambdas", help="comma list (default: the size's)")
    p.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="where the learning curves go (default: bench/learning-curves.png at full size, else "
        "the workdir, or beside --out with --from-json); in bench/ the section embeds it",
    )
    p.add_argument(
        "--from-json",
        nargs="+",
        type=Path,
        metavar="SECTION.json",
        help="measure nothing: one section from parts measured by earlier runs (their --out files), "
        "each part with the command that measured it",
    )
    args = p.parse_args()
    sec = Section(
        "The sidecar learns your system: deployment simulator, off-policy promotion (issue 25)", sys.argv
    )
    if args.from_json:
        data: dict[str, Any] = {"parts": []}
        for path in args.from_json:
            doc = json.loads(path.read_text())
            part = doc["data"]
            data["parts"].append({"command": doc["command"], "has": sorted(k for k in part if k in _PARTS)})
            for key, value in part.items():
                if key in data and isinstance(value, list) and key in _PARTS:
                    data[key] = [*data[key], *value]  # e.g. deployments of other topologies
                elif key in _PARTS or key not in data:
                    data[key] = value
            data.setdefault("spec", {**SIZES[part["size"]], "name": part["size"]})
        sec.argv = ["bench/bench_learning.py", "--from-json", *[str(x) for x in args.from_json]]
        _render(sec, data, args.plot or (args.out or Path("section.json")).with_name("learning-curves.png"))
        for part in data["parts"]:
            sec.add(f"- {', '.join(part['has'])}: `{part['command']}`")
        sec.data = data
        sec.emit(args.out)
        return 0
    size = {**SIZES[args.size], "name": args.size}
    if args.topologies:
        size["topologies"] = tuple(args.topologies.split(","))
    if args.lambdas:
        size["lams"] = tuple(float(x) for x in args.lambdas.split(","))
    parts = set(args.parts.split(","))
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-learning-"))
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    data = {"size": args.size, "spec": size, "explore": EXPLORE, "explore_steps": EXPLORE_STEPS}
    if "deploy" in parts:
        deployments = []
        for topology in size["topologies"]:
            for lam in size["lams"]:
                seed = deploy_seed(topology, lam)
                deployments.append(deployment(topology, lam, size, work / f"deploy-{topology}-{lam:g}", seed))
                data["deployments"] = deployments
                _keep(work, data)
    if "final" in parts:  # the champions a deploy run (this one, or one in --workdir) left, re-ruled
        data["finals"] = [
            final_ruler(topology, lam, size, work / f"deploy-{topology}-{lam:g}")
            for topology in size["topologies"]
            for lam in size["lams"]
        ]
        _keep(work, data)
    if "real" in parts:
        reals = []
        for name in ("mint", "intercode", "swe"):
            try:
                got = real_replay(name, size, work / f"real-{name}")
            except Exception as exc:  # one system's failure is reported; the others still run
                got = f"failed: {type(exc).__name__}: {exc}"
            if isinstance(got, str):
                sec.skip(f"real replay {name}: {got}")
            else:
                reals.append(got)
        data["real"] = reals
        _keep(work, data)
    if "cost" in parts:
        data["retrain_cost"] = retrain_cost(size, work / "cost")
        data["p99"] = p99_during_retrain(size, work / "p99")
    data["seconds"] = time.perf_counter() - t_start
    _render(sec, data, args.plot or (CURVES if args.size == "full" else work / "learning-curves.png"))
    sec.data = data
    sec.add(
        f"Measured in {data['seconds'] / 60:.0f} min on {os.cpu_count()} cores (load shared with other work)."
    )
    sec.emit(args.out)
    return 0


def _keep(work: Path, data: dict[str, Any]) -> None:
    """The parts measured so far, in ``work/partial.json`` (a later part that fails loses nothing)."""
    (work / "partial.json").write_text(
        json.dumps({"command": command_line(sys.argv), "data": data}, default=str)
    )


#: The measured parts of a section's data, each rendered by its own report.
_PARTS = ("deployments", "finals", "real", "retrain_cost", "p99")


def _render(sec: Section, data: dict[str, Any], png: Path) -> None:
    """The section's targets and tables from its data (measured now, or read back); the curves to ``png``."""
    size = data["spec"]
    if "deployments" in data:
        _report_deployments(sec, data["deployments"], size, data.get("finals"))
        _plot(data["deployments"], png)
        shown = png.resolve().parent == (ROOT / "bench").resolve()  # beside RESULTS.md: embedded
        sec.add(f"![learning curves]({png.name})" if shown else f"(plot: {png})", "")
    if "finals" in data:
        _report_finals(sec, data["finals"])
    if "real" in data:
        _report_real(sec, data["real"], size)
    if "retrain_cost" in data:
        _report_cost(sec, data["retrain_cost"], data["p99"], size)


def _report_finals(sec: Section, ruled: list[dict[str, Any]]) -> None:
    """The last champions of the deploy runs on the 'final' part's fresh runs, and on their test set."""
    sec.add(
        f"The last champion of each deployment on {ruled[0]['final']['runs']:,} fresh runs, and on the "
        f"first {ruled[0]['test']['runs']:,} of them (the deployment's test set), each gap with its 90% "
        "bootstrap interval over runs: the behavior → optimum gap is a few hundredths of a success at "
        "λ 0.1, so a ruler of a few thousand runs moves by several points.",
        "",
    )
    sec.table(
        [
            "topology",
            "λ",
            "champion",
            "gap, final runs [90%]",
            "gap, test set [90%]",
            "behavior",
            "optimum",
            "value",
        ],
        [
            [
                f["topology"],
                f["lambda"],
                f["champion"],
                _gap_shown(f["final"]),
                _gap_shown(f["test"]),
                f["final"]["behavior"],
                f["final"]["optimum"],
                f["final"]["value"],
            ]
            for f in ruled
        ],
    )


def _gap_shown(g: dict[str, Any]) -> str:
    """A gap, with its 90% interval when it has one."""
    return f"{g['gap']:.1%}" + (
        f" [{g['gap_ci90'][0]:.0%}, {g['gap_ci90'][1]:.0%}]" if "gap_ci90" in g else ""
    )


def _report_deployments(
    sec: Section,
    deployments: list[dict[str, Any]],
    size: dict[str, Any],
    ruled: list[dict[str, Any]] | None = None,
) -> None:
    rounds = size["rounds"]
    # the final champions on the 'final' part's fresh runs when measured, else on the test set
    by_cell = {(f["topology"], f["lambda"]): f["final"] for f in ruled or []}
    finals = [
        (
            d["topology"],
            d["lambda"],
            by_cell.get((d["topology"], d["lambda"]), {"gap": d["final"]["gap_test"]}),
        )
        for d in deployments
    ]
    worst = min(finals, key=lambda x: x[2]["gap"])
    on = f" on {worst[2]['runs']:,} fresh runs (90% intervals)" if "runs" in worst[2] else " on the test set"

    sec.targets.append(
        Target(
            f"deployment simulator: after {rounds} rounds of {size['runs']:,} runs the served policy "
            "reaches >= 90% "
            "of the behavior -> optimum gap, each topology and λ",
            f"lowest {_gap_shown(worst[2])} ({worst[0]}, λ {worst[1]:g}){on}; "
            + ", ".join(f"{t} λ{lm:g} {_gap_shown(g)}" for t, lm, g in finals),
            ">= 90% each",
            all(g["gap"] >= 0.9 for _, _, g in finals),
        )
    )
    promotions = [r for d in deployments for r in d["retrains"] if r["kind"] == "promotion" and "safe" in r]
    unsafe = [r for r in promotions if not r["safe"]]
    worst_change = min((r["test_change"] + r["interval_width"] for r in promotions), default=math.nan)
    sec.targets.append(
        Target(
            "no promotion lowers the true value by more than its interval's width",
            f"{len(promotions)} promotions, {len(unsafe)} lowered it by more; smallest (change + width) "
            f"{worst_change:+.4f}",
            "0 promotions lower it by more",
            not unsafe if promotions else None,
        )
    )
    costs = [(d, row) for d in deployments for row in d["rounds"] if row["explored"] > 0]
    rel = [
        row["explore_cost"] / abs(row["pure"]) if abs(row["pure"]) > 1e-9 else math.inf for _, row in costs
    ]
    gap_rel = [row["explore_cost"] / (row["optimum"] - row["behavior"]) for _, row in costs]
    sec.targets.append(
        Target(
            "exploration at 5% costs <= 1% of value in the rounds it runs",
            f"worst {max(rel, default=math.nan):.1%} of the champion's value "
            f"({max(gap_rel, default=math.nan):.1%} of the gap); "
            f"mean {np.mean(rel) if rel else math.nan:.1%} over {len(rel)} rounds",
            "<= 1% each round",
            bool(all(x <= 0.01 for x in rel)) if rel else None,
        )
    )
    judged = [(r, who) for d in deployments for r in d["retrains"] for who in ("candidate",) if who in r]
    covered = [r[who]["covered_dr"] for r, who in judged]
    sec.targets.append(
        Target(
            "off-policy estimates (DR) on held-out logged runs within their 90% interval of the true value",
            f"{sum(covered)} of {len(covered)} retrains "
            f"({np.mean(covered) if covered else math.nan:.0%}); IS "
            f"{np.mean([r[w]['covered_ips'] for r, w in judged]) if judged else math.nan:.0%}",
            ">= 85% of rounds",
            bool(np.mean(covered) >= 0.85) if covered else None,
        )
    )
    sec.add(
        "Learning curves: value per round of the runs served (with exploration) and of the champion that "
        "served "
        "them (the same runs, no exploration), against the behavior (each run's own stop) and the "
        "optimum on the "
        "same runs; gap closed = (value − behavior) / (optimum − behavior). Round 1 is served by the shipped "
        "default; each later round by what the retrain after the previous round left as champion. "
        "'final' is the champion after the last retrain on a fixed test set of fresh runs.",
        "",
    )
    table = []
    for d in deployments:
        for row in d["rounds"]:
            table.append(
                [
                    d["topology"],
                    d["lambda"],
                    row["round"],
                    row["behavior"],
                    row["optimum"],
                    row["served"],
                    row["pure"],
                    f"{row['gap_served']:.1%}",
                    f"{row['gap_pure']:.1%}",
                    f"{row['explored']:.1%}",
                    row["explore_cost"],
                ]
            )
        table.append(
            [
                d["topology"],
                d["lambda"],
                "final (test)",
                d["test_ruler"]["behavior"],
                d["test_ruler"]["optimum"],
                "—",
                d["final"]["test"],
                "—",
                f"{d['final']['gap_test']:.1%}",
                "—",
                "—",
            ]
        )
    sec.table(
        [
            "topology",
            "λ",
            "round",
            "behavior",
            "optimum",
            "served",
            "champion",
            "gap served",
            "gap champion",
            "runs explored",
            "explore cost",
        ],
        table,
    )
    sec.add(
        "Each retrain (after each round): what it decided, its doubly robust estimate of candidate − "
        "champion on the held-out runs, and the truth.",
        "",
    )
    rt = []
    for d in deployments:
        for k, r in enumerate(d["retrains"]):
            if "difference" not in r:
                rt.append(
                    [d["topology"], d["lambda"], k + 1, r["kind"], "—", "—", "—", "—", "—", r["reason"][:80]]
                )
                continue
            diff = r["difference"]
            c = r["candidate"]
            look = r.get("second_look") or {}
            if "dr" in look:
                second = (
                    f"{look['dr']:+.4f} [{look['ci90'][0]:+.4f}, {look['ci90'][1]:+.4f}] "
                    f"vs {look['truth']:+.4f} on {look['runs']}" + (", passed" if look["passed"] else "")
                )
            else:
                second = "—"
            rt.append(
                [
                    d["topology"],
                    d["lambda"],
                    k + 1,
                    r["kind"] + (" (second look)" if r.get("promoted_policy") == KEPT else ""),
                    f"{diff['dr']:+.4f} [{diff['ci90'][0]:+.4f}, {diff['ci90'][1]:+.4f}]",
                    f"{diff['truth']:+.4f}",
                    f"{c['dr']:.4f} [{c['dr_ci90'][0]:.4f}, {c['dr_ci90'][1]:.4f}] vs {c['truth']:.4f}",
                    "/".join(str(c["support"][k_]) for k_ in ("exact", "weighted", "zeroed", "unsupported")),
                    second,
                    f"{r['test_change']:+.4f}" if "test_change" in r else "—",
                ]
            )
    sec.table(
        [
            "topology",
            "λ",
            "retrain",
            "decision",
            "DR candidate − champion [90%]",
            "true difference",
            "candidate DR [90%] vs truth",
            "runs exact/weighted/zeroed/unsupported",
            "second look of the refused candidate: DR − champion [90%] vs truth, on the runs since",
            "promotion's true change (test)",
        ],
        rt,
    )


def _report_real(sec: Section, reals: list[dict[str, Any]], size: dict[str, Any]) -> None:
    if not reals:
        return
    below = [r for r in reals if r["champion_minus_heuristic"] < 0]
    sec.targets.append(
        Target(
            f"real replays: after retraining on {size['real']:,} logged runs of one real system (fewer where "
            "the set is smaller), the promoted model "
            "is never below "
            "the best tuned heuristic on that system's next runs",
            "; ".join(
                f"{r['system']}: {'promoted' if r['promoted'] else 'not promoted'}, champion − heuristic "
                f"{r['champion_minus_heuristic']:+.4f}"
                for r in reals
            ),
            "champion − best heuristic >= 0 on every system",
            not below,
        )
    )
    sec.table(
        [
            "system",
            "logged runs",
            "next runs",
            "λ",
            "retrain",
            "champion",
            "best heuristic",
            "shipped default",
            "as logged",
            "champion − heuristic [90%]",
        ],
        [
            [
                r["system"],
                r["logged_runs"],
                r["next_runs"],
                f"{r['lambda']:.3g}/{r['cost_unit']}",
                ("promoted" if r["promoted"] else "refused") + f" ({r['reason'].split(' per run')[0]})",
                r["values"]["champion"],
                f"{r['values']['best_heuristic']:.3g} ({r['best_heuristic']})",
                r["values"]["default"],
                r["values"]["logged"],
                f"{r['champion_minus_heuristic']:+.4f} [{r['champion_minus_heuristic_ci90'][0]:+.4f}, "
                f"{r['champion_minus_heuristic_ci90'][1]:+.4f}]",
            ]
            for r in reals
        ],
    )


def _report_cost(sec: Section, cost: dict[str, Any], p99: dict[str, Any], size: dict[str, Any]) -> None:
    sec.targets.append(
        Target(
            f"a retrain round of {cost['runs']:,} runs finishes in <= 2x the time `stopserve train` "
            "takes on the same traces",
            f"retrain {cost['retrain_s']:.0f} s, train {cost['train_s']:.0f} s: {cost['ratio']:.2f}x",
            "<= 2x",
            bool(cost["ratio"] <= 2.0),
        )
    )
    ratio = p99["retrain_p99_ms"] / p99["quiet_p99_ms"] if p99["quiet_p99_ms"] > 0 else math.nan
    sec.targets.append(
        Target(
            "decide p99 during a background retrain within 1.2x of the quiet p99",
            f"{p99['retrain_p99_ms']:.2f} ms against {p99['quiet_p99_ms']:.2f} ms quiet: {ratio:.2f}x "
            f"({p99['retrain_windows']} windows during, {p99['quiet_windows']} quiet)",
            "<= 1.2x",
            bool(ratio <= 1.2) if math.isfinite(ratio) else None,
        )
    )
    shadow = p99.get("shadow")
    if shadow:
        sec.add(
            "",
            f"Decide p99 with one more shadow challenger (the default model beside the champion; with "
            f"exploration on, a refused candidate is one), {len(shadow['pairs'])} windows with and without "
            f"it alternated on the same champion: {shadow['with_p99_ms']:.2f} ms against "
            f"{shadow['without_p99_ms']:.2f} ms, {shadow['with_p99_ms'] / shadow['without_p99_ms']:.2f}x "
            f"(the retrain measured: {p99.get('retrain')}; challengers already shadowed after it: "
            f"{p99.get('challengers_after')}).",
        )


if __name__ == "__main__":
    raise SystemExit(main())
