"""Tests of the one featurizer (stopserve.features)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stopserve.errors import TraceValidationError
from stopserve.features import FEATURE_GROUPS, FEATURE_NAMES, MAX_REF_CHARS, RunState
from stopserve.trace import TOPOLOGIES, Budget, Event, Trace, is_decision_point, parse_trace


def ev(i: int, kind: str, **kw: Any) -> Event:
    data: dict[str, Any] = {"id": f"e{i}", "t": float(kw.pop("t", i)), "type": kind, "agent": "a"}
    data.update(kw)
    return Event.model_validate(data)


def feat(state: RunState, name: str) -> float:
    return float(state.features()[FEATURE_NAMES.index(name)])


def test_names_unique_and_vector_length() -> None:
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES)
    x = RunState().features()
    assert x.dtype == np.float64 and x.shape == (len(FEATURE_NAMES),)


def test_features_returns_a_fresh_array() -> None:
    s = RunState()
    x = s.features()
    x[:] = 99.0
    assert s.features()[FEATURE_NAMES.index("n_events")] == 0.0


def test_basic_progress_and_spend() -> None:
    s = RunState(topology="harness", budget=Budget(max_turns=10, max_tokens=1000))
    s.fold(ev(0, "tool_use", tokens=100, usd=0.5))
    s.fold(ev(1, "return", error=True))
    s.fold(ev(2, "tool_use", tokens=300))
    s.fold(ev(3, "return", t=7.5))
    assert s.turn == 2 and s.n_events == 4 and s.tokens == 400 and s.usd == 0.5
    assert s.elapsed == 7.5
    assert feat(s, "seconds_last_event") == pytest.approx(5.5)
    assert feat(s, "seconds_per_turn") == pytest.approx(3.75)
    assert feat(s, "tokens_per_turn") == 200
    assert feat(s, "budget_share_turns") == pytest.approx(0.2)
    assert feat(s, "budget_share_tokens") == pytest.approx(0.4)
    assert math.isnan(feat(s, "budget_share_usd")) and math.isnan(feat(s, "budget_share_seconds"))
    assert feat(s, "tokens_last_turn") == 300
    assert feat(s, "errors_total") == 1 and feat(s, "errors_consecutive") == 0
    assert feat(s, "error_share_recent") == pytest.approx(0.5)
    assert feat(s, "n_tool_use") == 2 and feat(s, "n_return") == 2
    assert feat(s, "topology_harness") == 1.0
    assert sum(feat(s, f"topology_{t}") for t in TOPOLOGIES) == 1.0


def test_budget_shares_nan_without_budget_then_set() -> None:
    s = RunState()
    s.fold(ev(0, "return", tokens=50, usd=1.0))
    assert all(math.isnan(feat(s, f"budget_share_{k}")) for k in ("turns", "seconds", "tokens", "usd"))
    s.set_budget(Budget(max_usd=4.0, max_seconds=0.0))
    assert feat(s, "budget_share_usd") == 0.25
    assert feat(s, "budget_share_seconds") == 1.0  # a zero cap is exhausted, not a division by zero


def test_errors_consecutive_and_share() -> None:
    s = RunState()
    for i in range(3):
        s.fold(ev(2 * i, "tool_use"))
        s.fold(ev(2 * i + 1, "return", error=True))
    assert feat(s, "errors_consecutive") == 3 and feat(s, "error_share_recent") == 1.0
    s.fold(ev(10, "return"))
    assert feat(s, "errors_consecutive") == 0 and feat(s, "error_share_recent") == 0.75


def test_repetition_features() -> None:
    s = RunState()
    for i in range(4):
        s.fold(ev(i, "communicate", content_ref="same"))
    assert feat(s, "latest_ref_count") == 4
    assert feat(s, "identical_run") == 4 and feat(s, "identical_run_max") == 4
    s.fold(ev(4, "communicate", content_ref="other", agent="b"))
    assert feat(s, "identical_run") == 1 and feat(s, "identical_run_max") == 4
    assert feat(s, "distinct_ref_ratio") == pytest.approx(2 / 5)
    assert feat(s, "monologue_run") == 1
    assert feat(s, "agents_seen") == 2 and feat(s, "agents_active") == 2


def test_abab_alternation_flag() -> None:
    s = RunState()
    i = 0
    for k in range(4):
        ref = "A" if k % 2 == 0 else "B"
        s.fold(ev(i, "tool_use", tool="bash", content_ref=ref))
        s.fold(ev(i + 1, "return", content_ref=ref + "-out"))
        i += 2
    assert feat(s, "abab_flag") == 1.0 and feat(s, "alternation_len") == 4
    assert s.loop_events("alternating_actions") == [f"e{j}" for j in range(8)]


def test_consensus_share_of_modal_ref_among_latest_returns() -> None:
    s = RunState(topology="debate")
    s.fold(ev(0, "return", agent="p1", content_ref="x"))
    s.fold(ev(1, "return", agent="p2", content_ref="x"))
    s.fold(ev(2, "return", agent="p3", content_ref="y"))
    assert feat(s, "consensus_share") == pytest.approx(2 / 3) and feat(s, "consensus_agents") == 3
    s.fold(ev(3, "return", agent="p3", content_ref="x"))
    assert feat(s, "consensus_share") == 1.0
    s.fold(ev(4, "return", agent="p1", content_ref="z"))
    s.fold(ev(5, "return", agent="p2", content_ref="w"))
    assert feat(s, "consensus_share") == pytest.approx(1 / 3)


def test_reward_features() -> None:
    s = RunState()
    assert math.isnan(feat(s, "reward_latest")) and s.latest_reward is None
    # each agent step (a return) is graded by a reward; rewards themselves are not turns
    for i, value in enumerate((0.4, 0.7, 0.5)):
        s.fold(ev(2 * i, "return", tokens=10))
        s.fold(ev(2 * i + 1, "reward", value=value))
    s.fold(ev(6, "reward", value=0.9, channel="other"))
    assert s.turn == 3
    assert s.latest_reward == 0.5 and s.best_reward == 0.7
    assert s.latest_reward_on("other") == 0.9 and s.latest_reward_on("quality") == 0.5
    assert feat(s, "reward_delta") == pytest.approx(-0.2)
    assert feat(s, "turns_since_best") == 1  # best at turn 2, now turn 3
    assert feat(s, "tokens_since_best") == 10


def test_a_reward_is_not_a_turn() -> None:
    s = RunState()
    s.fold(ev(0, "tool_use", tool="bash", content_ref="c"))
    s.fold(ev(1, "return", tool="bash", content_ref="o"))
    s.fold(ev(2, "reward", value=0.3))
    s.fold(ev(3, "reward", value=0.4, channel="tests"))
    assert s.turn == 1
    s.fold(ev(4, "aggregate", content_ref="a"))
    s.fold(ev(5, "stop", reason="quality_met", proposed=True))
    assert s.turn == 3


def test_stop_proposals() -> None:
    s = RunState()
    assert math.isnan(feat(s, "turns_since_proposal"))
    s.fold(ev(0, "stop", reason="quality_met", proposed=True))
    assert s.turn == 1 and feat(s, "stop_proposals") == 1 and feat(s, "turns_since_proposal") == 0
    s.fold(ev(1, "return"))
    s.fold(ev(2, "stop", reason="unknown"))  # the final stop is no decision point
    assert s.turn == 2 and feat(s, "turns_since_proposal") == 1


def test_delegations_pending_and_unmatched_returns() -> None:
    s = RunState()
    s.fold(ev(0, "delegate", to="w1"))
    s.fold(ev(1, "delegate", to="w2"))
    assert feat(s, "delegations_pending") == 2
    s.fold(ev(2, "return", agent="w1"))
    s.fold(ev(3, "return", agent="stranger"))  # an unknown agent returning
    s.fold(ev(4, "return", agent="w2"))  # a return with no delegation left
    assert feat(s, "delegations_pending") == 0 and s.turn == 3


def test_retried_event_ids_are_skipped() -> None:
    s = RunState()
    assert s.fold(ev(0, "return", tokens=5))
    before = s.features()
    assert not s.fold(ev(0, "return", tokens=5))
    np.testing.assert_array_equal(before, s.features())
    assert s.seen("e0") and not s.seen("e1")
    assert s.n_events == 1 and s.tokens == 5
    assert s.fold_many([ev(0, "return"), ev(1, "return")]) == 1


def test_seen_window_is_bounded() -> None:
    s = RunState(seen_window=100)
    for i in range(250):
        s.fold(ev(i, "communicate"))
    # the newest seen_window ids are always remembered, nothing older than twice that
    assert all(s.seen(f"e{i}") for i in range(150, 250))
    assert not any(s.seen(f"e{i}") for i in range(50))


def test_ref_memory_is_bounded_and_huge_refs_are_hashed() -> None:
    s = RunState(ref_window=50)
    huge = "x" * (MAX_REF_CHARS * 1000)
    s.fold(ev(0, "communicate", content_ref=huge))
    for i in range(1, 200):
        s.fold(ev(i, "communicate", content_ref=f"r{i}"))
    s.fold(ev(200, "communicate", content_ref="x" * (MAX_REF_CHARS * 1000)))
    assert feat(s, "latest_ref_count") == 1  # evicted from the 50-ref window
    t = RunState()
    t.fold(ev(0, "communicate", content_ref=huge))
    t.fold(ev(1, "communicate", content_ref=huge[:-1] + "x"))
    assert feat(t, "latest_ref_count") == 2 and feat(t, "monologue_run") == 2
    t.fold(ev(2, "communicate", content_ref=huge[:-1] + "y"))
    assert feat(t, "latest_ref_count") == 1


def test_time_going_backwards_is_rejected_before_any_change() -> None:
    s = RunState()
    s.fold(ev(0, "return", t=5))
    with pytest.raises(TraceValidationError, match="cannot be folded") as info:
        s.fold(ev(1, "return", t=4))
    assert "time goes backwards" in str(info.value) and "e1" in str(info.value)
    assert s.n_events == 1 and not s.seen("e1")


def test_bad_batch_is_rejected_whole() -> None:
    s = RunState()
    batch = [ev(0, "return", t=1), ev(1, "return", t=3), ev(2, "return", t=2)]
    with pytest.raises(TraceValidationError) as info:
        s.fold_many(batch)
    assert info.value.issues[0].path == "events[2].t"
    assert s.n_events == 0 and s.turn == 0


@pytest.mark.parametrize(
    ("field", "value"), [("tokens", -5), ("tokens", math.nan), ("usd", -0.1), ("usd", math.inf)]
)
def test_negative_or_nan_costs(field: str, value: float) -> None:
    # the format rejects them when read ...
    data = {"trace_id": "r", "task_id": "t", "events": [{"id": "e", "t": 0, "type": "return", "agent": "a"}]}
    data["events"][0][field] = value  # type: ignore[index]
    with pytest.raises(TraceValidationError, match=f"events\\[0\\].{field}"):
        parse_trace(data)
    # ... and an event built without validation is refused by the featurizer, naming the field
    bad = Event.model_construct(id="e9", t=0.0, type="return", agent="a", **{field: value})
    s = RunState()
    with pytest.raises(TraceValidationError) as info:
        s.fold(bad)
    assert info.value.issues[0].path == f"event 'e9'.{field}"
    assert s.n_events == 0


def test_unknown_topology_is_refused() -> None:
    with pytest.raises(TraceValidationError, match="topology"):
        RunState(topology="star")


def test_grades_are_never_read() -> None:
    events = [
        ev(0, "tool_use", grade=0.1),
        ev(1, "return", grade=0.2),
        ev(2, "aggregate", grade=0.3),
        ev(3, "reward", value=0.5, grade=0.9),
    ]
    regraded = [e.model_copy(update={"grade": 1.0 - (e.grade or 0.0)}) for e in events]
    ungraded = [e.model_copy(update={"grade": None}) for e in events]
    out = [_feature_rows(evs) for evs in (events, regraded, ungraded)]
    np.testing.assert_array_equal(out[0], out[1])
    np.testing.assert_array_equal(out[0], out[2])


def _feature_rows(events: list[Event], topology: str | None = None, budget: Any = None) -> np.ndarray:
    """The features after each event, folded one at a time."""
    s = RunState(topology=topology, budget=budget)
    rows = []
    for e in events:
        s.fold(e)
        rows.append(s.features())
    return np.array(rows)


def test_contributions_are_never_read() -> None:
    """The simulator's offline label ``contribution``: changing every one moves no feature."""
    from stopserve.trace import Trace
    from stopserve.training.simulate import simulate

    runs = [Trace.model_validate(t) for t in simulate(12, seed=3)]
    assert any(e.contribution for t in runs for e in t.events)
    for trace in runs:
        events = trace.events
        variants = (
            events,
            [e.model_copy(update={"contribution": 7.5 - 3 * (e.contribution or 0.0)}) for e in events],
            [e.model_copy(update={"contribution": None}) for e in events],
        )
        out = [_feature_rows(evs, trace.topology, trace.budget) for evs in variants]
        np.testing.assert_array_equal(out[0], out[1])
        np.testing.assert_array_equal(out[0], out[2])


# ---------------------------------------------------------------- property: chunking

_KINDS = ("spawn", "delegate", "communicate", "tool_use", "return", "aggregate", "reward", "stop")


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    n = draw(st.integers(1, 40))
    t = 0.0
    events: list[dict[str, Any]] = []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.5, 1.0, 7.25]))
        kind = draw(st.sampled_from(_KINDS))
        e: dict[str, Any] = {
            "id": f"e{i}",
            "t": t,
            "type": kind,
            "agent": draw(st.sampled_from(["o", "a", "b"])),
            "tool": draw(st.sampled_from([None, "bash", "search"])),
            "content_ref": draw(st.sampled_from([None, "r1", "r2", "r3"])),
            "tokens": draw(st.one_of(st.none(), st.integers(0, 5000))),
            "usd": draw(st.one_of(st.none(), st.floats(0, 1))),
            "error": draw(st.sampled_from([None, False, True])),
            "grade": draw(st.one_of(st.none(), st.floats(0, 1))),
        }
        if kind == "reward":
            e["value"] = draw(st.floats(-1, 1))
            e["channel"] = draw(st.sampled_from([None, "quality", "tests"]))
        if kind == "stop":
            e["reason"] = "unknown"
            e["proposed"] = draw(st.booleans())
        events.append(e)
    topology = draw(st.sampled_from([None, *TOPOLOGIES]))
    return Trace.model_validate({"trace_id": "r", "task_id": "t", "topology": topology, "events": events})


@settings(max_examples=50, deadline=None)
@given(trace=traces(), seed=st.integers(0, 2**32 - 1), tiny=st.booleans())
def test_chunked_fold_equals_one_pass(trace: Trace, seed: int, tiny: bool) -> None:
    budget = Budget(max_turns=20, max_tokens=50_000)
    # tiny windows make the id and ref compaction happen inside short traces
    windows: dict[str, int] = {"seen_window": 4, "ref_window": 2} if tiny else {}
    one = RunState(trace.topology, budget, **windows)
    expected: dict[int, np.ndarray] = {}
    for i, e in enumerate(trace.events):
        one.fold(e)
        if is_decision_point(e):
            expected[i] = one.features()
    # every decision point but a reward is an agent step
    assert one.turn == sum(1 for i in expected if trace.events[i].type != "reward")

    rng = random.Random(seed)
    chunked = RunState(trace.topology, budget, **windows)
    i = 0
    n = len(trace.events)
    while i < n:
        j = min(n, i + rng.randint(1, 8))
        batch = trace.events[i:j]
        assert chunked.fold_many(batch) == len(batch)
        if not tiny and rng.random() < 0.3:  # a retried request changes nothing
            assert chunked.fold_many(batch) == 0
        if j - 1 in expected:
            np.testing.assert_array_equal(chunked.features(), expected[j - 1])
        i = j
    np.testing.assert_array_equal(chunked.features(), one.features())


# ---------------------------------------------------------------- real runs


def test_real_swe_runs_fold(swe_dir: Path) -> None:
    from stopserve.importers import mini_swe_agent

    traces = list(mini_swe_agent.read([str(swe_dir)]))
    assert len(traces) == 306
    always_known = [i for i, name in enumerate(FEATURE_NAMES) if not _may_be_nan(name)]
    for tr in traces[:60]:
        s = RunState(tr.topology, tr.budget)
        for e in tr.events:
            s.fold(e)
            if is_decision_point(e):
                x = s.features()
                assert np.isfinite(x[always_known]).all(), tr.trace_id
        assert s.turn == sum(is_decision_point(e) for e in tr.events)
        assert s.tokens == sum(e.tokens or 0 for e in tr.events)
        assert feat(s, "topology_harness") == 1.0


def _may_be_nan(name: str) -> bool:
    if name in FEATURE_GROUPS["content"]:
        return name != "near_repeat_run"  # the content block is unknown without sketches or progress
    return name.startswith(
        (
            "budget_share",
            "reward_",
            "turns_since",
            "tokens_since",
            "consensus_share",
            "rounds_at_best",
            "tokens_last_turn_ratio",
            "tokens_share_since_best",
        )
    )


def test_docs_table_lists_every_feature_in_order() -> None:
    import re

    doc = (Path(__file__).resolve().parents[1] / "docs" / "features.md").read_text()
    names: list[str] = []
    for line in doc.splitlines():
        if re.match(r"\| \d+(–\d+)? \| ", line):
            cell = line.split("|")[2]
            names.extend(re.findall(r"`([a-z_0-9]+)`", cell))
    assert names == list(FEATURE_NAMES)


def test_a_batch_repeating_an_earlier_event_is_fine() -> None:
    s = RunState()
    assert s.fold_many([ev(0, "return", t=1), ev(1, "return", t=2), ev(0, "return", t=1)]) == 2
    assert s.turn == 2


def test_memory_stays_bounded_on_a_long_run() -> None:
    import gc
    import tracemalloc

    def grow(state: RunState, start: int, n: int) -> None:
        for i in range(start, start + n):
            kind = ("tool_use", "return", "communicate", "reward")[i % 4]
            extra: dict[str, Any] = {"value": (i % 7) / 7} if kind == "reward" else {}
            state.fold(ev(i, kind, agent=f"a{i % 5}", content_ref=f"ref-{i}", tokens=3, **extra))

    s = RunState(seen_window=200, ref_window=200)
    tracemalloc.start()
    try:
        grow(s, 0, 2_000)
        gc.collect()
        after_2k = tracemalloc.get_traced_memory()[0]
        grow(s, 2_000, 6_000)
        gc.collect()
        after_8k = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # every id and ref is new, yet four times the events hold no more memory
    # (bounded windows; a leak of ~100 bytes per event would add ~600 kB)
    assert after_8k < after_2k * 1.3 + 50_000, (after_2k, after_8k)
    assert s.n_events == 8_000 and s.tokens == 24_000


def test_unknown_event_type_on_a_constructed_event_is_refused() -> None:
    bad = Event.model_construct(id="e1", t=0.0, type="spwan", agent="a")
    s = RunState()
    with pytest.raises(TraceValidationError) as info:
        s.fold_many([ev(0, "return"), bad])
    assert info.value.issues[0].path == "events[1].type" and "spwan" in str(info.value)
    assert s.n_events == 0
    with pytest.raises(TraceValidationError):
        s.fold(bad)
    assert s.n_events == 0 and not s.seen("e1")


def test_rounds_at_best_counts_working_rounds_that_kept_the_best() -> None:
    s = RunState()
    t = 0.0

    def ev(kind: str, **kw: object) -> Event:
        nonlocal t
        t += 1.0
        return Event.model_validate({"id": f"e{t:g}", "t": t, "type": kind, "agent": "orch", **kw})

    def round_(ref: str, value: float) -> None:
        s.fold(ev("aggregate", content_ref=ref))
        s.fold(ev("reward", value=value))

    assert math.isnan(feat(s, "rounds_at_best"))
    round_("a1", 0.3)
    assert feat(s, "rounds_at_best") == 0
    round_("a2", 0.3)  # kept the best after new work
    round_("a3", 0.3)
    assert feat(s, "rounds_at_best") == 2
    round_("a3", 0.3)  # stuck: the same answer again says nothing about the ceiling
    assert feat(s, "rounds_at_best") == 2
    round_("a4", 0.2)  # regression: no evidence either
    round_("a5", 0.3)  # back to the best from below: not a round that kept it
    assert feat(s, "rounds_at_best") == 2
    round_("a6", 0.5)  # a new best resets
    assert feat(s, "rounds_at_best") == 0


# ---------------------------------------------------------------- real-run features


def test_rejected_proposals_count_work_after_a_proposed_stop() -> None:
    s = RunState()
    s.fold(ev(0, "tool_use", tokens=100, content_ref="a"))
    s.fold(ev(1, "return", content_ref="r1"))
    s.fold(ev(2, "stop", proposed=True, reason="information_complete", tokens=50))
    s.fold(ev(3, "reward", value=0.0))  # the verdict: not work, the proposal is still open
    assert feat(s, "proposals_rejected") == 0.0
    s.fold(ev(4, "tool_use", content_ref="b"))  # back to work: the proposal was not taken
    assert feat(s, "proposals_rejected") == 1.0
    s.fold(ev(5, "stop", proposed=True, reason="information_complete"))
    s.fold(ev(6, "stop", proposed=True, reason="information_complete"))  # a second one in a row
    assert feat(s, "proposals_rejected") == 2.0


def test_turns_since_new_result_and_scale_free_spend() -> None:
    s = RunState()
    assert math.isnan(feat(s, "turns_since_new_result"))
    s.fold(ev(0, "tool_use", tokens=100, content_ref="a"))
    s.fold(ev(1, "return", content_ref="same"))
    assert feat(s, "turns_since_new_result") == 0.0
    for i in range(2, 8, 2):  # the same result again and again: no progress
        s.fold(ev(i, "tool_use", tokens=300, content_ref=f"x{i}"))
        s.fold(ev(i + 1, "return", content_ref="same", error=True))
    assert feat(s, "turn") == 4.0
    assert feat(s, "turns_since_new_result") == 3.0
    assert feat(s, "error_share_total") == 3 / 4
    # 1,000 tokens over 4 turns, the last turn 300: 1.2 times the mean
    assert feat(s, "tokens_last_turn_ratio") == pytest.approx(300 * 4 / 1000)
    s.fold(ev(8, "reward", value=0.5))
    s.fold(ev(9, "tool_use", tokens=1000, content_ref="y"))
    s.fold(ev(10, "return", content_ref="same"))
    assert feat(s, "tokens_share_since_best") == pytest.approx(1000 / 2000)


def test_scale_free_subset_drops_absolute_sizes_and_topology() -> None:
    from stopserve.features import ABSOLUTE_SCALE_FEATURES, scale_free_features

    free = scale_free_features()
    assert not set(free) & set(ABSOLUTE_SCALE_FEATURES)
    assert not any(n.startswith("topology_") for n in free)
    # a budget share tells where a corpus's cap falls: a model for unseen systems must not read it
    assert "reward_latest" in free and not any(n.startswith("budget_share_") for n in free)
    assert any(n.startswith("topology_") for n in scale_free_features(topology=True))
    # the groups partition the features
    grouped = [n for names in FEATURE_GROUPS.values() for n in names]
    assert sorted(grouped) == sorted(FEATURE_NAMES) and len(grouped) == len(set(grouped))


def test_reward_trend_features() -> None:
    s = RunState()
    assert math.isnan(feat(s, "reward_gain_recent")) and feat(s, "reward_improving_run") == 0
    for i, v in enumerate([0.1, 0.2, 0.4, 0.5, 0.7]):
        s.fold(ev(i, "reward", value=v))
    # the latest 4: 0.2 .. 0.7 over 3 gaps
    assert feat(s, "reward_gain_recent") == pytest.approx(0.5 / 3)
    assert feat(s, "reward_improving_run") == 4
    s.fold(ev(5, "reward", value=0.7))
    assert feat(s, "reward_improving_run") == 0


# ---------------------------------------------------------------- content: sketches and progress


def _step(state: RunState, i: int, command: str, output: str, **result: Any) -> None:
    """One (action, result) step whose events carry sketches of their texts, as importers send them."""
    from stopserve.ids import content_refs

    state.fold(ev(2 * i, "tool_use", tool="bash", **content_refs(command, sketch=True)))
    state.fold(ev(2 * i + 1, "return", tool="bash", **content_refs(output, sketch=True), **result))


def test_content_features_are_unknown_without_sketches_or_progress() -> None:
    s = RunState()
    for i in range(4):
        s.fold(ev(2 * i, "tool_use", tool="bash", content_ref=f"a{i}"))
        s.fold(ev(2 * i + 1, "return", tool="bash", content_ref=f"r{i}"))
    for name in FEATURE_GROUPS["content"]:
        want = 1.0 if name == "near_repeat_run" else math.nan  # hashes alone: a fresh step each time
        assert feat(s, name) == pytest.approx(want, nan_ok=True), name


def test_a_traceback_again_with_other_numbers_is_alike_and_not_novel() -> None:
    s = RunState()
    for i in range(5):
        _step(
            s,
            i,
            "python run.py",  # the same command; its traceback changes only in its numbers and paths
            f'Traceback (most recent call last):\n  File "/tmp/tmp{i}x/run.py", line {10 + i}\n'
            "KeyError: 'id'",
            error=True,
        )
    assert feat(s, "result_similarity_max") == 1.0
    assert feat(s, "action_similarity_max") == 1.0
    assert feat(s, "novelty_recent") == pytest.approx(1 / 5)  # only the first was new
    assert feat(s, "near_repeat_run") == 5


def test_new_outputs_each_step_are_novel() -> None:
    s = RunState()
    outputs = [
        "src/app.py src/models.py src/views.py README.md setup.cfg",
        "def handler(request): return render(request, 'index.html', context)",
        "class User(Model): name = CharField(max_length=50); email = EmailField()",
        "diff --git a/src/app.py b/src/app.py index changed return value of main",
    ]
    for i, out in enumerate(outputs):
        _step(s, i, f"cat file number {'abcd'[i]} of the project", out)
    assert feat(s, "novelty_recent") == 1.0
    assert feat(s, "result_similarity_max") < 0.5
    assert feat(s, "near_repeat_run") == 1


def test_progress_readings_reset_the_steps_since_progress() -> None:
    s = RunState()
    _step(s, 0, "git status", "nothing to commit, working tree clean")
    assert math.isnan(feat(s, "steps_since_progress")) and math.isnan(feat(s, "tests_failing_share"))
    _step(
        s, 1, "pytest", "=== 3 failed, 7 passed in 0.5s ===", progress={"tests_passed": 7, "tests_failed": 3}
    )
    assert feat(s, "steps_since_progress") == 0 and feat(s, "tests_failing_share") == pytest.approx(0.3)
    _step(s, 2, "cat a.py", "print(1)")
    _step(
        s, 3, "pytest", "=== 3 failed, 7 passed in 0.6s ===", progress={"tests_passed": 7, "tests_failed": 3}
    )
    assert feat(s, "steps_since_progress") == 2  # the same counts: no step forward
    _step(
        s,
        4,
        "pytest -x",
        "=== 1 failed, 9 passed in 0.6s ===",
        progress={"tests_passed": 9, "tests_failed": 1},
    )
    assert feat(s, "steps_since_progress") == 0 and feat(s, "tests_failing_share") == pytest.approx(0.1)


def test_the_orchestrators_ledger_stall_run_is_a_feature() -> None:
    s = RunState()
    assert math.isnan(feat(s, "ledger_stall_run"))
    for i, made in enumerate([True, False, False]):
        s.fold(
            ev(i, "communicate", role="orchestrator", content_ref=f"m{i}", progress={"made_progress": made})
        )
    assert feat(s, "ledger_stall_run") == 2


def test_content_features_survive_serialization_mid_run() -> None:
    a = RunState()
    for i in range(3):
        _step(
            a, i, f"grep -rn needle src/{i}", f"src/{i}/x.py:{i}: needle found", progress={"exit_code": i % 2}
        )
    b = RunState.from_bytes(a.to_bytes())
    for s in (a, b):
        _step(s, 3, "grep -rn needle src/3", "src/3/x.py:3: needle found", progress={"exit_code": 0})
    np.testing.assert_array_equal(a.features(), b.features())
    assert not math.isnan(feat(b, "novelty_recent"))
