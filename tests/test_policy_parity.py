"""The one-row decision and its vectorised twin agree on every decision, in every rule order.

``Policy.decide`` (one row, what the service runs) and ``stop_mask`` (many rows, what the
trainer's searches run) sit side by side in ``stopserve/policy.py``. Here both decide every
decision point of random runs (loops, errors, rewards on two channels, proposed stops, run
budgets), for every combination of what can fire and in what order it wins: a net (the
config's turn cap, the run's own budget), the config's rules (loop detector, ``quality_met``),
the veto (``min_turns``), the base rule (a turn cap, a reward threshold with its own gate),
proposals (taken or refused), and the model's deviation (each margin finite or not, what it
may overrule, its own gate, the evidence gate). Each row's flag must equal ``decide``'s
action there, not only the first stop of each run.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import numpy as np
import pytest

from stopserve.evidence import DEFAULT_EVIDENCE
from stopserve.features import FEATURE_NAMES, RunState
from stopserve.manifest import RULE_KINDS, Manifest, Margins, ModelEntry
from stopserve.objective import Objective
from stopserve.policy import Deviation, Policy, stop_mask
from stopserve.safety import SafetyConfig
from stopserve.trace import Trace
from stopserve.training.fit import _rule_fields
from stopserve.training.heuristics import HeuristicRule, TunedHeuristic, policy_mask
from stopserve.training.labels import DecisionPoints, build_decision_points, fold_events
from stopserve.training.replay import REPLAY_ENGINE
from stopserve.training.tuning import Tuned

OBJECTIVE = Objective(lam=0.05)


def random_run(i: int, rng: random.Random) -> Trace:
    """A run that can trip every rule: repeats, errors, rewards, proposed stops, a budget."""
    events: list[dict[str, Any]] = []
    t = 0.0
    loop_from = rng.randint(1, 8) if rng.random() < 0.5 else None
    for s in range(rng.randint(2, 16)):
        looping = loop_from is not None and s >= loop_from
        t += 1.0
        events.append(
            {
                "id": f"a{s}",
                "t": t,
                "type": "tool_use",
                "agent": "agent",
                "tool": "bash",
                "content_ref": "same" if looping else f"cmd{i}-{s}",
                "tokens": rng.randint(100, 4000),
            }
        )
        t += 0.5
        events.append(
            {
                "id": f"r{s}",
                "t": t,
                "type": "return",
                "agent": "agent",
                "content_ref": "out" if looping else f"out{i}-{s}",
                "error": rng.random() < 0.3,
            }
        )
        if rng.random() < 0.5:
            channel = rng.choice(["quality", None])
            value = round(rng.random(), 2)
            events.append(
                {
                    "id": f"q{s}",
                    "t": t,
                    "type": "reward",
                    "agent": "judge",
                    "value": value,
                    "channel": channel,
                }
            )
        if rng.random() < 0.15:
            events.append(
                {
                    "id": f"p{s}",
                    "t": t,
                    "type": "stop",
                    "agent": "agent",
                    "proposed": True,
                    "reason": "information_complete",
                }
            )
    data: dict[str, Any] = {
        "trace_id": f"run{i}",
        "task_id": f"task{i % 7}",
        "events": events,
        "rewards": {"team": float(rng.random() < 0.5)},
    }
    if rng.random() < 0.3:
        data["budget"] = {"max_turns": rng.randint(3, 12)}
    return Trace.model_validate(data)


@pytest.fixture(scope="module")
def runs() -> list[Trace]:
    rng = random.Random(35)
    return [random_run(i, rng) for i in range(30)]


@pytest.fixture(scope="module")
def boosters(runs: list[Trace]) -> dict[str, Any]:
    """Real LightGBM boosters g and k whose V crosses every margin tried."""
    import lightgbm as lgb

    dp = build_decision_points(runs)
    rng = np.random.default_rng(0)
    x = dp.X
    targets = {
        "g": rng.normal(0.0, 0.4, size=dp.n_rows) + 0.02 * np.nan_to_num(x[:, 1]),
        "k": np.abs(rng.normal(3.0, 2.0, size=dp.n_rows)),
    }
    params = {
        "objective": "regression",
        "num_leaves": 8,
        "min_data_in_leaf": 5,
        "verbose": -1,
        "num_threads": 1,
    }
    return {
        name: lgb.train(params, lgb.Dataset(x, label=y, feature_name=list(FEATURE_NAMES)), 12)
        for name, y in targets.items()
    }


#: The config's nets and rules: (max_turns cap, loop detector, quality_met target, veto min_turns)
CONFIGS = list(itertools.product((None, 9), (True, False), (0.8, None), (0, 3)))
#: Run by default: each setting of each part both ways; the rest of the grid is marked slow
QUICK = {(None, True, 0.8, 0), (9, False, None, 3), (9, True, 0.8, 3), (None, False, 0.8, 0)}
#: The base rule: (turn cap, reward threshold, its gate, proposals taken)
BASE_RULES = list(itertools.product((None, 5), (None, 0.5), (1, 3), (True, False)))
#: The deviation: (stop margin, continue margin, model gate, overrules, stops on evidence)
MARGINS = [(math.inf, math.inf), (0.0, math.inf), (math.inf, -0.3), (-0.1, 0.2), (0.2, -1.0)]
OVERRULES = [
    frozenset(),
    frozenset({"rule", "proposed"}),
    frozenset(RULE_KINDS),
    frozenset({"loop", "quality_met"}),
]
DEVIATIONS = [
    Deviation(m_s, m_c, gate, over, evidence)
    for (m_s, m_c), gate, over, evidence in itertools.product(MARGINS, (0, 4), OVERRULES, (False, True))
]


def _nets(cap: int | None, loop: bool, quality: float | None, veto: int) -> SafetyConfig:
    return SafetyConfig.model_validate(
        {"max_turns": cap, "max_seconds": None, "loop": loop, "quality_met": quality, "min_turns": veto}
    )


def _policy(boosters: dict[str, Any], nets: SafetyConfig, rule: HeuristicRule, dev: Deviation) -> Policy:
    """The served policy of ``rule`` with ``dev``, as the trainer builds one (``_fold_policies``)."""
    base = TunedHeuristic("h", rule, 0.0, "ktokens", OBJECTIVE.lam or 0.0)
    tuned = Tuned(dev.margin_stop, dev.margin_continue, dev.min_turns, 0.0, 0.0, 0.0)
    fields = _rule_fields(base, tuned, nets, dev.overrules, "evidence" if dev.on_evidence else "value")
    manifest = Manifest(
        kind="model",
        method="behavior",
        objective=OBJECTIVE,
        models={n: ModelEntry() for n in boosters},
        **fields,
    )
    return Policy(
        kind="model",
        safety=rule.own_config(nets),
        manifest=manifest,
        rule=base.to_safety_config(),
        boosters=boosters,
        engine=REPLAY_ENGINE,
    )


def _decide_every_row(policy: Policy, runs: list[Trace], raw: np.ndarray) -> np.ndarray:
    """``decide`` at every decision point of every run (not cut at the first stop): stop flags."""
    out: list[bool] = []
    row = 0
    for trace in runs:
        state = RunState(topology=trace.topology, budget=trace.budget)
        for ev, is_row in fold_events(trace, state):
            if is_row:
                proposed = ev.type == "stop" and bool(ev.proposed)
                d = policy.decide(state, objective=OBJECTIVE, proposed_stop=proposed, raw=raw[row])
                out.append(d.action == "stop")
                row += 1
    return np.asarray(out, dtype=bool)


@pytest.mark.parametrize(
    "config",
    [pytest.param(c, marks=() if c in QUICK else pytest.mark.slow) for c in CONFIGS],
    ids=lambda c: f"cap{c[0]}-loop{c[1]}-q{c[2]}-veto{c[3]}",
)
def test_every_decision_agrees_in_every_rule_order(
    runs: list[Trace], boosters: dict[str, Any], config: tuple[Any, ...]
) -> None:
    nets = _nets(*config)
    dp: DecisionPoints = build_decision_points(runs, nets=nets, evidence=DEFAULT_EVIDENCE)
    pick = random.Random(hash(config) & 0xFFFF)
    fired = {"net": 0, "rule": 0, "model": 0, "overruled": 0}
    raw: np.ndarray | None = None
    v = np.zeros(0)
    for cap, threshold, gate, proposals in BASE_RULES:
        rule = HeuristicRule(turn_cap=cap, reward_threshold=threshold, min_turns=gate, proposals=proposals)
        fires = rule.fires(dp)
        # a rule-only policy (no deviation): the heuristics' replays
        heuristic = TunedHeuristic("h", rule, 0.0, "ktokens", 0.0).policy(nets)
        np.testing.assert_array_equal(
            _decide_every_row(heuristic, runs, np.zeros((dp.n_rows, 0))), policy_mask(dp, fires)
        )
        for dev in [DEVIATIONS[0], DEVIATIONS[-1], *pick.sample(DEVIATIONS, 4)]:
            policy = _policy(boosters, nets, rule, dev)
            if raw is None:  # the same boosters throughout: scored once
                raw = policy.raw_rows(dp.X)
                v = np.asarray(policy.values(policy.raw_batch(dp.X), dp.turn, dp.c_raw, OBJECTIVE)[0])
            want = stop_mask(dp, v, fires, dev, stall=dp.stall)
            got = _decide_every_row(policy, runs, raw)
            bad = np.flatnonzero(got != want)
            assert bad.size == 0, (
                f"rule {rule}, {dev}: decide and stop_mask differ at rows {bad[:5].tolist()} "
                f"(decide {got[bad[:5]].tolist()}, stop_mask {want[bad[:5]].tolist()})"
            )
            np.testing.assert_array_equal(policy.stop_mask(dp, v, fires, stall=dp.stall), want)
            fired["net"] += int(dp.net_stop.sum())
            fired["rule"] += int((fires.any() & ~dp.net_stop).sum())
            fired["model"] += int((want & ~fires.any() & ~dp.net_stop).sum())
            fired["overruled"] += int((fires.any() & ~want).sum())
    # the runs exercise every part of the order (a test that can fail only if each part fires)
    assert all(n > 0 for n in fired.values()), fired


def test_stop_mask_needs_the_stall_of_a_model_that_stops_on_evidence(runs: list[Trace]) -> None:
    dp = build_decision_points(runs)
    fires = HeuristicRule().fires(dp)
    with pytest.raises(ValueError, match="stall"):
        stop_mask(dp, np.zeros(dp.n_rows), fires, Deviation(on_evidence=True))


def test_a_deviation_is_read_from_the_manifest() -> None:
    m = Manifest(kind="none", margins=Margins(stop=0.1), overrules=("rule",), stop_on="evidence")
    dev = Deviation.of(m)
    assert (dev.margin_stop, dev.margin_continue, dev.overrules, dev.on_evidence) == (
        0.1,
        math.inf,
        frozenset({"rule"}),
        True,
    )
    assert dev.may_stop(-0.2, 1) and not dev.may_stop(-0.05, 1) and not dev.keeps_going(1e9)
