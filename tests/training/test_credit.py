"""Message-level credit: the value it reads, TD and ablation credit, aggregates, the command."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from credit_models import sim_traces, summed, value_models

from stopserve.cli import main
from stopserve.errors import ConfigError, ModelError
from stopserve.features import RunState
from stopserve.objective import Objective, cost_so_far
from stopserve.policy import Policy
from stopserve.trace import Event, Trace, write_traces
from stopserve.training.credit import (
    ABLATION_TYPES,
    GROUPINGS,
    TraceCredit,
    aggregate,
    cost_price,
    credit_trace,
)
from stopserve.training.labels import fold_events


@pytest.fixture(scope="module")
def traces() -> list[Trace]:
    return sim_traces(120, seed=5)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return value_models(tmp_path_factory.mktemp("credit-models"), sim_traces(160, seed=4))


@pytest.fixture(scope="module")
def models(model_dirs: dict[str, Path]) -> dict[str, Policy]:
    return {name: Policy.load(path) for name, path in model_dirs.items()}


def _interval_sum(report: TraceCredit) -> float:
    """V(s_last) − V(s_0) − Σ price × cost over the credited events: what the credits must add to."""
    cost = sum(report.values[e.point].price * e.cost for e in report.events if e.credit is not None)
    return report.values[-1].v - report.values[0].v - cost


@pytest.mark.parametrize("name", ["behavior", "optimal-per-run", "lambda"])
@pytest.mark.parametrize("split", ["tokens", "equal"])
@pytest.mark.parametrize("window", ["decision", "reward"])
@pytest.mark.parametrize("baseline", ["zero", "model"])
def test_td_credits_telescope_to_the_change_of_value_net_of_cost(
    models: dict[str, Policy], traces: list[Trace], name: str, split: str, window: str, baseline: str
) -> None:
    for trace in traces[:12]:
        report = credit_trace(models[name], trace, split=split, window=window, baseline=baseline)
        assert summed(e.credit for e in report.events) == pytest.approx(_interval_sum(report), abs=1e-9)
        # every event up to the last decision point is credited, none after it
        last = report.values[-1].index
        assert all((e.credit is not None) == (e.index <= last) for e in report.events)
        if baseline == "zero":
            assert report.values[0].v == 0.0


@pytest.mark.parametrize("name", ["behavior", "optimal-per-run", "lambda"])
def test_the_value_is_the_one_decide_reads(models: dict[str, Policy], traces: list[Trace], name: str) -> None:
    """V_continue and S along the run are what Policy.decide answers at each decision point."""
    policy = models[name]
    trace = traces[3]
    report = credit_trace(policy, trace)
    state = RunState(topology=trace.topology, budget=trace.budget)
    points = iter(report.values[1:])
    for ev, is_row in fold_events(trace, state):
        if not is_row:
            continue
        point = next(points)
        assert point.event_id == ev.id
        decision = policy.decide(state)
        if decision.v_stop is None:  # a safety net fired: decide reads no value there
            continue
        assert point.v_continue == pytest.approx(decision.v_stop, abs=1e-9)
        if decision.q_stop is not None:
            assert point.s == pytest.approx(decision.q_stop, abs=1e-9)
        assert point.v == pytest.approx(point.s + max(0.0, point.v_continue), abs=1e-12)


def test_cost_price_is_the_weight_the_policy_puts_on_cost(models: dict[str, Policy]) -> None:
    k, turn, cost = np.array([0.0, 0.5, 3.0, 12.0]), np.array([1, 2, 5, 9]), np.array([0.1, 0.4, 1.2, 2.0])
    for policy in models.values():
        for lam, share in ((0.7, None), (None, 0.3), (None, 0.0)):
            worth = policy.resolve(Objective.of(lam, share))
            price = cost_price(policy, k, turn, cost, worth)
            w, ctg = worth.weight(k, turn, cost, mean_cost=policy.mean_behavior_cost)
            # the rest of the run is priced at the same rate: w = price × cost still to come
            np.testing.assert_allclose(price * ctg, w, atol=1e-12)
            if lam is not None:
                np.testing.assert_allclose(price, lam)
    per_run = models["optimal-per-run"]
    price = cost_price(per_run, k, turn, cost, Objective(cost_share=0.3))
    expected_total = cost / turn * (turn + k)  # the run's expected total cost
    np.testing.assert_allclose(price, 0.3 / expected_total)
    fixed = models["behavior"]
    mean = fixed.mean_behavior_cost
    assert mean is not None
    np.testing.assert_allclose(cost_price(fixed, k, turn, cost, Objective(cost_share=0.3)), 0.3 / mean)


def _ev(i: int, kind: str, agent: str, tokens: int = 0, **extra: object) -> Event:
    return Event.model_validate(
        {"id": f"e{i}", "t": float(i), "type": kind, "agent": agent, "tokens": tokens, **extra}
    )


def test_a_reward_passes_its_change_to_the_work_it_scored(models: dict[str, Policy]) -> None:
    events = [
        _ev(0, "delegate", "orch", 10),
        _ev(1, "return", "w1", 30),
        _ev(2, "return", "w2", 90),
        _ev(3, "aggregate", "orch", 40),
        _ev(4, "reward", "verifier", value=0.9, channel="quality"),
        _ev(5, "delegate", "orch", 10),
        _ev(6, "return", "w1", 20),
    ]
    trace = Trace(trace_id="r", task_id="t", topology="centralized", events=events)
    policy = models["behavior"]
    report = credit_trace(policy, trace)
    v = [p.v for p in report.values]  # points: start, e1, e2, e3, e4, e6
    price = [p.price for p in report.values]
    credit = [e.credit for e in report.events]
    assert credit[4] == 0.0  # the verifier's score is never credited a value change (it costs nothing)
    dv_reward = v[4] - v[3]
    # the reward's interval holds only the reward: its change goes to e0..e3 by tokens
    ks = 1000.0
    assert credit[3] == pytest.approx((v[3] - v[2]) + dv_reward * 40 / 170 - price[3] * 40 / ks)
    assert credit[2] == pytest.approx((v[2] - v[1]) + dv_reward * 90 / 170 - price[2] * 90 / ks)
    assert credit[0] == pytest.approx((v[1] - v[0]) * 10 / 40 + dv_reward * 10 / 170 - price[1] * 10 / ks)
    # equal split: the same amounts shared equally
    equal = credit_trace(policy, trace, split="equal")
    assert equal.events[3].credit == pytest.approx((v[3] - v[2]) + dv_reward / 4 - price[3] * 40 / ks)
    # window "reward": V read at the reward and the last point only; e0..e3 share one interval
    window = credit_trace(policy, trace, window="reward")
    assert [p.index for p in window.values] == [p.index for p in report.values]
    assert window.events[1].credit == pytest.approx((v[4] - v[0]) * 30 / 170 - price[4] * 30 / ks)
    assert window.events[6].credit == pytest.approx((v[5] - v[4]) * 20 / 30 - price[5] * 20 / ks)


def test_a_score_in_an_interval_with_a_message_goes_to_all_the_work_it_scored(
    models: dict[str, Policy],
) -> None:
    """MINT's order: a proposal (a decision point), the critic's message, then the environment's score."""
    events = [
        _ev(0, "tool_use", "model", 100),
        _ev(1, "return", "env"),
        _ev(2, "stop", "model", 300, reason="information_complete", proposed=True),
        _ev(3, "communicate", "critic", 200),
        _ev(4, "reward", "env", value=0.0),
    ]
    report = credit_trace(models["behavior"], Trace(trace_id="r", task_id="t", events=events))
    v = [p.v for p in report.values]  # start, e1, e2, e4
    price = [p.price for p in report.values]
    drop = v[3] - v[2]
    credit = [e.credit for e in report.events]
    # the score covers everything since the previous one (none): e0, e2, e3 by tokens
    assert credit[3] == pytest.approx(drop * 200 / 600 - price[3] * 0.2)
    assert credit[2] == pytest.approx((v[2] - v[1]) + drop * 300 / 600 - price[2] * 0.3)
    assert credit[0] == pytest.approx((v[1] - v[0]) + drop * 100 / 600 - price[1] * 0.1)
    assert credit[1] == pytest.approx(0.0) and credit[4] == 0.0


def test_events_without_tokens_share_equally(models: dict[str, Policy]) -> None:
    events = [_ev(0, "tool_use", "a"), _ev(1, "communicate", "critic"), _ev(2, "return", "env")]
    report = credit_trace(models["behavior"], Trace(trace_id="r", task_id="t", events=events))
    credits = [e.credit for e in report.events]
    assert credits[0] == pytest.approx(credits[1]) and credits[1] == pytest.approx(credits[2])
    assert summed(credits) == pytest.approx(report.values[1].v)  # baseline zero, nothing spent


def _refolded_value(policy: Policy, trace: Trace, events: list[Event]) -> float:
    """V after folding ``events`` from scratch: the ablation's counterfactual, computed independently."""
    state = RunState(topology=trace.topology, budget=trace.budget)
    state.fold_many(events)
    raw = {
        n: float(b.predict(state.features()[None, :], raw_score=True)[0]) for n, b in policy.boosters.items()
    }
    worth = policy.resolve(None)
    v, _, s = policy.values(raw, state.turn, cost_so_far(state, policy.cost_unit), worth)
    s = policy.transformed("s", raw["s"]) if s is None else s
    return float(s + max(0.0, float(v)))


@pytest.mark.parametrize("name", ["behavior", "optimal-per-run"])
def test_ablation_is_the_value_without_the_event_refolded(
    models: dict[str, Policy], traces: list[Trace], name: str
) -> None:
    policy = models[name]
    trace = traces[1]
    report = credit_trace(policy, trace, method="ablation")
    events = list(trace.events)
    checked = 0
    for e in report.events:
        if e.credit is None:
            assert e.type not in ABLATION_TYPES or e.point == 0
            continue
        assert e.type in ABLATION_TYPES
        point = report.values[e.point]
        without = [x for x in events[: point.index + 1] if x.id != e.event_id]
        expected = point.v - _refolded_value(policy, trace, without) - point.price * e.cost
        assert e.credit == pytest.approx(expected, abs=1e-9)
        checked += 1
    assert checked > 10


def test_ablation_caps_types_and_decision_points(models: dict[str, Policy], traces: list[Trace]) -> None:
    trace = traces[2]
    report = credit_trace(models["behavior"], trace, method="ablation", types=["return"], last_k=3)
    credited = [e for e in report.events if e.credit is not None]
    assert credited and all(e.type == "return" for e in credited)
    n_points = len(report.values) - 1
    assert all(e.point > n_points - 3 for e in credited)
    assert all(e.credit is None for e in report.events if e.type == "return" and e.point <= n_points - 3)


def test_bad_options_and_models_without_a_value_are_refused(
    models: dict[str, Policy], traces: list[Trace]
) -> None:
    trace = traces[0]
    with pytest.raises(ModelError, match="learned value"):
        credit_trace(Policy.safety_only(), trace)
    heuristic = Policy.from_manifest({"kind": "heuristic", "base_rule": {"config": {"max_turns": 5}}})
    with pytest.raises(ModelError, match="tuned heuristic"):
        credit_trace(heuristic, trace)
    policy = models["behavior"]
    for kwargs, match in (
        ({"method": "shapley"}, "method"),
        ({"split": "words"}, "split"),
        ({"window": "round"}, "window"),
        ({"baseline": "one"}, "baseline"),
        ({"method": "ablation", "types": ["message"]}, "types: 'message'"),
        ({"method": "ablation", "last_k": 0}, "last_k"),
        ({"method": "ablation", "window": "reward"}, "window"),
    ):
        with pytest.raises(ConfigError, match=match):
            credit_trace(policy, trace, **kwargs)  # type: ignore[arg-type]


def test_aggregates_sum_the_event_credits(models: dict[str, Policy], traces: list[Trace]) -> None:
    reports = [credit_trace(models["behavior"], t) for t in traces[:10]]
    total = sum(summed(e.credit for e in r.events) for r in reports)
    truth = sum(summed(e.contribution for e in r.events) for r in reports)
    for by in GROUPINGS:
        rows = aggregate(reports, by)
        assert sum(r["credit"] for r in rows) == pytest.approx(total)
        assert sum(r["events"] for r in rows) == sum(
            1 for r in reports for e in r.events if e.credit is not None
        )
        labelled = [r["contribution"] for r in rows if "contribution" in r]
        assert sum(labelled) == pytest.approx(truth)
        if by != "event":
            assert [r["credit"] for r in rows] == sorted((r["credit"] for r in rows), reverse=True)
    by_agent = {r["agent"]: r for r in aggregate(reports, "agent")}
    workers = sum(summed(e.credit for e in r.events if e.agent == "worker-1") for r in reports)
    if "worker-1" in by_agent:
        assert by_agent["worker-1"]["credit"] == pytest.approx(workers)
    with pytest.raises(ConfigError, match="by"):
        aggregate(reports, "colour")


def test_contribution_labels_are_offline_and_never_read(
    models: dict[str, Policy], traces: list[Trace]
) -> None:
    trace = traces[4]
    flipped = trace.model_copy(
        update={
            "events": [
                e.model_copy(update={"contribution": None if e.contribution is None else -e.contribution})
                for e in trace.events
            ]
        }
    )
    a, b = credit_trace(models["behavior"], trace), credit_trace(models["behavior"], flipped)
    assert [e.credit for e in a.events] == [e.credit for e in b.events]


# --------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def files(
    tmp_path_factory: pytest.TempPathFactory, traces: list[Trace], model_dirs: dict[str, Path]
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("credit-cli")
    runs = root / "runs.jsonl"
    write_traces(runs, traces[:6])
    return {"runs": runs, "model": model_dirs["behavior"], "root": root}


def test_command_tables_json_csv(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    runs, model = str(files["runs"]), str(files["model"])
    assert main(["credit", runs, "--model", model]) == 0
    out = capsys.readouterr().out
    assert "by agent" in out and "by type" in out and "worker" in out and "contribution" in out
    first = Trace.model_validate(json.loads(files["runs"].read_text().splitlines()[0]))
    assert main(["credit", runs, "--model", model, "--trace", first.trace_id, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["n_traces"] == 1 and data["method"] == "td" and data["baseline"] == "zero"
    (report,) = data["traces"]
    assert [e["event_id"] for e in report["events"]] == [e.id for e in first.events]
    total = summed(e["credit"] for e in report["events"])
    assert sum(r["credit"] for r in data["aggregates"]["agent"]) == pytest.approx(total)
    out_csv = files["root"] / "credit.csv"
    args = [
        "credit",
        runs,
        "--model",
        model,
        "--csv",
        str(out_csv),
        "--by",
        "agent-type",
        "--method",
        "ablation",
    ]
    assert main(args) == 0
    assert "by agent, type" in capsys.readouterr().out
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == sum(len(Trace.model_validate(json.loads(x)).events) for x in files["runs"].open())
    assert {r["type"] for r in rows if r["credit"]} <= set(ABLATION_TYPES)


def test_command_plot(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    png = files["root"] / "timeline.png"
    assert main(["credit", str(files["runs"]), "--model", str(files["model"]), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "timeline" in capsys.readouterr().err


def test_command_errors_name_what_is_wrong(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    runs, model = str(files["runs"]), str(files["model"])
    assert main(["credit", runs, "--model", model, "--trace", "nope"]) == 2
    assert "no trace with trace id nope" in capsys.readouterr().err
    assert main(["credit", runs, "--model", model, "--by", "colour"]) == 2
    assert "by: expected one of" in capsys.readouterr().err
    assert main(["credit", runs, "--model", model, "--method", "ablation", "--types", "mesage"]) == 2
    assert "'mesage' is not an event type" in capsys.readouterr().err
    heuristic = files["root"] / "heuristic"
    from stopserve.artifacts import save_model_dir

    save_model_dir(
        heuristic, {"kind": "heuristic", "base_rule": {"config": {"max_turns": 5}}, "feature_names": []}
    )
    assert main(["credit", runs, "--model", str(heuristic)]) == 2
    assert "tuned heuristic" in capsys.readouterr().err


def test_command_on_the_shared_swe_runs(
    swe_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shipped default model on real SWE-bench runs (the shared data; skipped without it)."""
    from stopserve.importers import IMPORTERS
    from stopserve.settings import default_model_dir

    model = default_model_dir()
    if model is None:
        pytest.skip("no shipped default model (models/default)")
    trajs = sorted((swe_dir / "trajs").glob("*.traj.json"))[:3]
    runs = tmp_path / "swe.jsonl"
    results = str(swe_dir / "results_summary.json")
    write_traces(runs, IMPORTERS["mini-swe-agent"]([str(p) for p in trajs], results=results))
    assert main(["credit", str(runs), "--json", "--by", "event,agent"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["n_traces"] == 3
    for report in data["traces"]:
        credits = [e["credit"] for e in report["events"]]
        values = report["values"]
        cost = sum(
            values[e["point"]]["price"] * e["cost"] for e in report["events"] if e["credit"] is not None
        )
        assert summed(credits) == pytest.approx(values[-1]["v"] - cost, abs=1e-9)
        assert {e["agent"] for e in report["events"]} >= {"agent"}
