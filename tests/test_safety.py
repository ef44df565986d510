"""Tests of the safety nets and the loop detector (stopserve.safety)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stopserve.errors import ConfigError
from stopserve.features import LOOP_PATTERNS, RunState
from stopserve.safety import DEFAULT_SAFETY, LedgerConfig, LoopConfig, SafetyConfig, SafetyStop
from stopserve.trace import Budget, Event, Trace

#: The detector's mechanics are tested at OpenHands' thresholds (and ours for the two patterns
#: OpenHands has not); the shipped defaults are higher and tested on their own
#: (test_the_defaults_fire_at_six_and_stop_every_scripted_loop_within_8_steps).
OPENHANDS = SafetyConfig(
    loop=LoopConfig(
        repeated_action_observation=4,
        repeated_action_error=3,
        monologue=3,
        alternating_actions=6,
        repeated_cycle=3,
        repeated_reply=3,
        nudge=0,  # OpenHands stops at its thresholds
    )
)


def ev(i: int, kind: str, **kw: Any) -> Event:
    data: dict[str, Any] = {"id": f"e{i}", "t": float(kw.pop("t", i)), "type": kind, "agent": "a"}
    data.update(kw)
    return Event.model_validate(data)


def steps(state: RunState, pairs: list[tuple[str, str | None, bool]], start: int = 0) -> int:
    """Fold (action ref, result ref, failed) steps as tool_use + return; return the next index."""
    i = start
    for action, result, failed in pairs:
        state.fold(ev(i, "tool_use", tool="bash", content_ref=action))
        state.fold(ev(i + 1, "return", agent="bash", content_ref=result, error=failed))
        i += 2
    return i


# ---------------------------------------------------------------- budgets and quality


@pytest.mark.parametrize(
    ("cfg", "limit", "kw"),
    [
        (SafetyConfig(max_turns=3), "turns", {}),
        (SafetyConfig(max_seconds=2.0), "seconds", {}),
        (SafetyConfig(max_tokens=250), "tokens", {"tokens": 100}),
        (SafetyConfig(max_usd=0.3), "usd", {"usd": 0.1}),
    ],
)
def test_budget_nets(cfg: SafetyConfig, limit: str, kw: dict[str, Any]) -> None:
    s = RunState()
    fired: list[SafetyStop] = []
    for i in range(5):
        s.fold(ev(i, "return", **kw))
        stop = cfg.check(s)
        if stop is not None:
            fired.append(stop)
            break
    assert fired, "the budget never fired"
    stop = fired[0]
    assert stop.reason == "budget_exhausted" and stop.limit == limit and stop.name == f"max_{limit}"
    assert s.turn == 3 and stop.name in stop.message


def test_run_budget_is_enforced_too() -> None:
    s = RunState(budget=Budget(max_turns=2))
    cfg = SafetyConfig()
    s.fold(ev(0, "return"))
    assert cfg.check(s) is None
    s.fold(ev(1, "return"))
    stop = cfg.check(s)
    assert stop is not None and stop.limit == "turns" and "run's budget" in stop.message


def test_quality_met_waits_for_min_turns() -> None:
    cfg = SafetyConfig(quality_met=0.8, min_turns=3)
    s = RunState()
    s.fold(ev(0, "return"))
    s.fold(ev(1, "reward", value=0.95))
    assert cfg.check(s) is None and not cfg.allows_stop(s)
    s.fold(ev(2, "return"))
    s.fold(ev(3, "reward", value=0.5))
    s.fold(ev(4, "return"))
    s.fold(ev(5, "reward", value=0.85))
    assert cfg.allows_stop(s)
    stop = cfg.check(s)
    assert stop is not None and stop.reason == "quality_met" and stop.limit is None


def test_quality_met_on_a_named_channel() -> None:
    cfg = SafetyConfig(quality_met=0.8, quality_channel="tests", min_turns=0)
    s = RunState()
    s.fold(ev(0, "reward", value=0.9))  # primary channel "quality"
    assert cfg.check(s) is None
    s.fold(ev(1, "reward", value=0.9, channel="tests"))
    assert cfg.check(s) is not None


def test_budget_stops_are_not_vetoed_by_min_turns() -> None:
    cfg = SafetyConfig(max_tokens=10, min_turns=5)
    s = RunState()
    s.fold(ev(0, "return", tokens=20))
    assert not cfg.allows_stop(s)
    stop = cfg.check(s)
    assert stop is not None and stop.limit == "tokens"


# ---------------------------------------------------------------- loop detector


def test_same_action_same_result_four_times() -> None:
    cfg = OPENHANDS
    s = RunState()
    i = steps(s, [("ls", "out", False)] * 3)
    assert cfg.check(s) is None
    steps(s, [("ls", "out", False)], start=i)
    stop = cfg.check(s)
    assert stop is not None
    assert (stop.name, stop.reason, stop.pattern) == (
        "loop_detector",
        "loop_detected",
        "repeated_action_observation",
    )
    assert stop.events == [f"e{j}" for j in range(8)]


def test_same_action_different_results_is_no_loop() -> None:
    s = RunState()
    steps(s, [("pytest", f"out{k}", False) for k in range(10)])
    assert OPENHANDS.check(s) is None


def test_unknown_content_never_counts_as_a_repeat() -> None:
    s = RunState()
    steps(s, [(None, None, True)] * 10)  # type: ignore[list-item]
    assert OPENHANDS.check(s) is None


def test_same_action_failing_three_times() -> None:
    s = RunState()
    i = steps(s, [("make", "err1", True), ("make", "err2", True)])
    assert OPENHANDS.check(s) is None
    steps(s, [("make", "err3", True)], start=i)
    stop = OPENHANDS.check(s)
    assert stop is not None and stop.pattern == "repeated_action_error"
    assert stop.events == [f"e{j}" for j in range(6)]


def test_an_error_between_successes_resets() -> None:
    s = RunState()
    steps(s, [("make", "e", True), ("make", "e2", True), ("make", "ok", False), ("make", "e3", True)])
    assert s.loop_run("repeated_action_error") == 1
    assert OPENHANDS.check(s) is None


MONO_ONLY = OPENHANDS.replace(loop={**OPENHANDS.loop.model_dump(), "repeated_reply": 0})


def test_monologue_three_times_nothing_between() -> None:
    s = RunState()
    s.fold(ev(0, "communicate", content_ref="hmm"))
    s.fold(ev(1, "communicate", content_ref="hmm"))
    s.fold(ev(2, "return", agent="b"))  # something between resets
    for i in range(3, 5):
        s.fold(ev(i, "communicate", content_ref="hmm"))
    assert MONO_ONLY.check(s) is None
    s.fold(ev(5, "communicate", content_ref="hmm", agent="other"))  # another agent resets too
    s.fold(ev(6, "communicate", content_ref="hmm", agent="other"))
    s.fold(ev(7, "communicate", content_ref="hmm", agent="other"))
    stop = MONO_ONLY.check(s)
    assert stop is not None and stop.pattern == "monologue" and stop.events == ["e5", "e6", "e7"]


def test_alternation_over_six_actions() -> None:
    s = RunState()
    ab = [("A", "a", False), ("B", "b", False)]
    i = steps(s, ab * 2 + ab[:1])
    assert OPENHANDS.check(s) is None
    steps(s, ab[1:], start=i)
    stop = OPENHANDS.check(s)
    assert stop is not None and stop.pattern == "alternating_actions"
    assert stop.events == [f"e{j}" for j in range(12)]


def test_thresholds_are_configurable_and_can_be_off() -> None:
    s = RunState()
    steps(s, [("ls", "out", False)] * 2)
    assert OPENHANDS.check(s) is None
    cfg = SafetyConfig(loop=LoopConfig(repeated_action_observation=2, nudge=0))
    assert cfg.check(s) is not None
    nudged = SafetyConfig(loop=LoopConfig(repeated_action_observation=2))  # nudges twice first
    assert nudged.check(s) is None and nudged.loop.nudging(s) is not None
    steps(s, [("ls", "out", False)] * 5, start=10)
    assert SafetyConfig(loop=LoopConfig(repeated_action_observation=0)).check(s) is None
    assert SafetyConfig.loads('{"loop": false}').check(s) is None
    assert SafetyConfig.loads('{"loop": null}').check(s) is None


# ---------------------------------------------------------------- composition and JSON


def test_or_and_compose() -> None:
    tokens = SafetyConfig(max_tokens=100, min_turns=0, loop=LoopConfig(enabled=False))
    quality = SafetyConfig(quality_met=0.9, min_turns=0, loop=LoopConfig(enabled=False))
    s = RunState()
    s.fold(ev(0, "reward", value=0.95, tokens=10))
    assert (tokens & quality).check(s) is None
    fired = (tokens | quality).check(s)
    assert fired is not None and fired.reason == "quality_met"
    s.fold(ev(1, "reward", value=0.95, tokens=100))
    both = (tokens & quality).check(s)
    assert both is not None and both.name == "max_tokens&quality_met" and both.limit == "tokens"


def test_and_keeps_the_loop_net_of_its_parts() -> None:
    s = RunState()
    loop = LoopConfig()
    steps(s, [("ls", "out", False)] * (loop.repeated_action_observation + loop.nudge))  # the default stop
    assert (SafetyConfig(max_tokens=10**9) & SafetyConfig(quality_met=0.99)).check(s) is not None


def test_min_turns_of_any_part_applies() -> None:
    cfg = SafetyConfig(min_turns=0) | SafetyConfig(min_turns=7)
    assert cfg.effective_min_turns == 7


def test_json_examples_from_the_brief() -> None:
    text = (
        '{"max_turns": 50, "max_seconds": 600, "max_tokens": 2000000, "max_usd": 5.0,'
        ' "min_turns": 2, "quality_met": 0.9, "loop": {"repeated_action_error": 5}}'
    )
    cfg = SafetyConfig.loads(text)
    assert cfg.max_tokens == 2_000_000 and cfg.loop.repeated_action_error == 5
    composed = SafetyConfig.loads(
        '{"any": [{"max_turns": 5}, {"all": [{"max_usd": 1}, {"quality_met": 0.5}]}]}'
    )
    assert composed.any is not None and composed.any[1].all is not None
    assert SafetyConfig.loads(composed.dumps()) == composed


def test_dump_without_nones_round_trips() -> None:
    # the client sends model_dump(exclude_none=True): switched-off nets must stay off
    cfg = SafetyConfig(loop=LoopConfig(enabled=False, monologue=0))
    again = SafetyConfig.model_validate(cfg.model_dump(mode="json", exclude_none=True))
    assert again == cfg and not again.loop.enabled


_leaf = st.builds(
    SafetyConfig,
    max_turns=st.one_of(st.none(), st.integers(0, 100)),
    max_usd=st.one_of(st.none(), st.floats(0, 10)),
    quality_met=st.one_of(st.none(), st.floats(0, 1)),
    min_turns=st.integers(0, 5),
    loop=st.builds(LoopConfig, enabled=st.booleans(), monologue=st.sampled_from([0, 2, 3, 9])),
    ledger=st.builds(LedgerConfig, enabled=st.booleans(), in_loop=st.sampled_from([0, 2, 3, 9])),
)
_configs = st.recursive(
    _leaf,
    lambda kids: st.tuples(kids, kids, st.booleans()).map(lambda t: t[0] | t[1] if t[2] else t[0] & t[1]),
)


@settings(max_examples=60, deadline=None)
@given(cfg=_configs)
def test_json_round_trip(cfg: SafetyConfig) -> None:
    assert SafetyConfig.loads(cfg.dumps()) == cfg


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"max_turn": 5}', "max_turn"),
        ('{"max_usd": -1}', "max_usd"),
        ('{"loop": {"monologue": 1}}', "loop.monologue"),
        ('{"loop": {"alternating_actions": 3}}', "loop.alternating_actions"),
        ('{"any": [{"max_tokens": "lots"}]}', "any[0].max_tokens"),
        ('{"all": [{}, {"min_turns": -2}]}', "all[1].min_turns"),
        ('{"ledger": {"in_loop": 1}}', "ledger.in_loop"),
        ('{"ledger": {"stuck": 3}}', "ledger.stuck"),
        ('{"quality_met": NaN}', None),
    ],
)
def test_bad_config_names_the_field(text: str, field: str | None) -> None:
    with pytest.raises(ConfigError) as info:
        SafetyConfig.loads(text, source="safety.json")
    assert "safety.json" in str(info.value)
    if field is not None:
        assert [i.path for i in info.value.issues] == [field]


def test_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        SafetyConfig.load(tmp_path / "missing.json")
    p = tmp_path / "s.json"
    p.write_text('{"max_turns": 3}')
    assert SafetyConfig.load(p).max_turns == 3


# ---------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def swe_traces(swe_dir: Path) -> list[Trace]:
    from stopserve.importers import mini_swe_agent

    return list(mini_swe_agent.read([str(swe_dir)]))


def test_defaults_cut_no_resolved_swe_run(swe_traces: list[Trace]) -> None:
    cfg = SafetyConfig()
    traces = swe_traces
    resolved = [t for t in traces if t.rewards.get("team") == 1.0]
    assert len(resolved) == 234
    cut = [t.trace_id for t in resolved if cfg.first_stop(t) is not None]
    assert cut == []


def test_a_real_run_made_to_loop_is_caught(swe_traces: list[Trace]) -> None:
    trace = swe_traces[0]
    events = [e for e in trace.events if e.type != "stop"]
    act, res = next(
        (a, r) for a, r in itertools.pairwise(events) if a.type == "tool_use" and r.type == "return"
    )
    t = events[-1].t
    extra = []
    for k in range(4):
        extra.append(act.model_copy(update={"id": f"loop-a{k}", "t": t + k}))
        extra.append(res.model_copy(update={"id": f"loop-r{k}", "t": t + k + 0.5}))
    looped = trace.model_copy(update={"events": events + extra, "stop": None})
    found = OPENHANDS.first_stop(looped)
    assert found is not None
    _turn, index, stop = found
    assert stop.pattern == "repeated_action_observation" and index == len(looped.events) - 1
    assert stop.events[-1] == "loop-r3"


def _debate_round(state: RunState, start: int, refs: tuple[str, str, str], score: float) -> int:
    i = start
    state.fold(ev(i, "communicate", agent="d1", to="d2", content_ref=refs[0]))
    state.fold(ev(i + 1, "communicate", agent="d2", to="d1", content_ref=refs[1]))
    state.fold(ev(i + 2, "return", agent="d1", to="o", content_ref=refs[2]))
    state.fold(ev(i + 3, "aggregate", agent="o", content_ref=refs[2]))
    state.fold(ev(i + 4, "reward", agent="v", value=score))
    return i + 5


def test_a_debate_round_repeating_unchanged_is_a_cycle() -> None:
    s = RunState(topology="debate")
    i = _debate_round(s, 0, ("x1", "y1", "z1"), 0.4)
    i = _debate_round(s, i, ("x2", "y2", "z2"), 0.5)  # progress: new content
    i = _debate_round(s, i, ("x3", "y3", "z3"), 0.5)
    i = _debate_round(s, i, ("x3", "y3", "z3"), 0.5)
    assert OPENHANDS.check(s) is None and s.loop_run("repeated_cycle") == 2
    i = _debate_round(s, i, ("x3", "y3", "z3"), 0.5)
    stop = OPENHANDS.check(s)
    assert stop is not None and stop.pattern == "repeated_cycle"
    # round 2's score (e9) already matched: the periodic stretch starts there
    assert stop.events == [f"e{j}" for j in range(9, 25)]
    # one new message breaks it
    _debate_round(s, i, ("x3", "y4", "z3"), 0.5)
    assert s.loop_run("repeated_cycle") == 0 and OPENHANDS.check(s) is None


def test_a_changing_score_is_progress_not_a_cycle() -> None:
    s = RunState()
    i = 0
    for k in range(5):
        i = _debate_round(s, i, ("x", "y", "z"), 0.1 * k)
    assert s.loop_run("repeated_cycle") == 0


def test_cycles_without_content_refs_do_not_count() -> None:
    s = RunState()
    for i in range(0, 30, 2):
        s.fold(ev(i, "delegate", agent="o", to="w"))
        s.fold(ev(i + 1, "return", agent="w"))
    assert s.loop_run("repeated_cycle") == 0 and OPENHANDS.check(s) is None


def test_first_stop_replays_the_run_budget() -> None:
    events = [{"id": f"e{i}", "t": float(i), "type": "return", "agent": "a"} for i in range(6)]
    trace = Trace.model_validate(
        {"trace_id": "r", "task_id": "t", "events": events, "budget": {"max_turns": 4}}
    )
    found = OPENHANDS.first_stop(trace)
    assert found is not None
    turn, index, stop = found
    assert (turn, index, stop.limit, stop.reason) == (4, 3, "turns", "budget_exhausted")
    assert OPENHANDS.first_stop(trace.model_copy(update={"budget": None})) is None


def test_repeated_reply_one_agent_repeats_itself_while_others_speak() -> None:
    s = RunState()
    for i in range(2):
        s.fold(ev(2 * i, "return", agent="coder", content_ref="same answer"))  # a text reply, no action
        # the critic varies only once: nothing new after it
        s.fold(ev(2 * i + 1, "return", agent="critic", content_ref=f"critique {min(i, 1)}"))
    assert s.loop_run("repeated_reply") == 1  # the latest reply is the critic's
    s.fold(ev(4, "return", agent="coder", content_ref="same answer"))
    assert OPENHANDS.check(s) is None  # the coder's repeats restart after the critic's new critique
    for i in (5, 7):  # from here on nobody brings anything new
        s.fold(ev(i, "return", agent="critic", content_ref="critique 1"))
        s.fold(ev(i + 1, "return", agent="coder", content_ref="same answer"))
    assert s.loop_run("repeated_reply") == 3 and s.loop_events("repeated_reply") == ["e4", "e6", "e8"]
    stop = OPENHANDS.check(s)  # the whole exchange repeats as well: the cycle is named first
    assert stop is not None and stop.reason == "loop_detected"
    assert stop.pattern in ("repeated_cycle", "repeated_reply")


def test_a_reply_repeated_while_the_others_bring_new_content_is_no_loop() -> None:
    # MINT with sparse feedback: the critic's stock message after each new attempt of the actor
    s = RunState()
    for i in range(6):
        s.fold(ev(2 * i, "return", agent="actor", content_ref=f"attempt {i}"))
        s.fold(ev(2 * i + 1, "communicate", agent="critic", content_ref="Your answer is wrong."))
    assert s.loop_run("repeated_reply") == 1 and OPENHANDS.check(s) is None
    # once the actor repeats itself too, the critic's repeats count
    for i in range(6, 9):
        s.fold(ev(2 * i, "return", agent="actor", content_ref="attempt 5"))
        s.fold(ev(2 * i + 1, "communicate", agent="critic", content_ref="Your answer is wrong."))
    stop = OPENHANDS.check(s)
    assert stop is not None and stop.reason == "loop_detected"


def test_repeated_reply_ignores_tool_results_and_resets_on_new_content() -> None:
    s = RunState()
    for i in range(5):  # the same output of different actions: results, not replies
        s.fold(ev(2 * i, "tool_use", content_ref=f"cmd{i}"))
        s.fold(ev(2 * i + 1, "return", agent="env", content_ref="ok"))
    assert s.loop_run("repeated_reply") == 0 and OPENHANDS.check(s) is None
    s.fold(ev(20, "communicate", agent="x", content_ref="a"))
    s.fold(ev(21, "communicate", agent="x", content_ref="b"))
    s.fold(ev(22, "communicate", agent="x", content_ref="b"))
    assert s.loop_run("repeated_reply") == 2


def test_every_loop_pattern_has_a_run_length_and_unknown_ones_are_refused() -> None:
    s = RunState()
    assert {p: s.loop_run(p) for p in LOOP_PATTERNS} == dict.fromkeys(LOOP_PATTERNS, 0)
    with pytest.raises(KeyError):
        s.loop_run("stuck")


def test_closest_names_the_pattern_in_progress_without_firing() -> None:
    s = RunState()
    assert LoopConfig().closest(s) is None
    for i in range(2):
        s.fold(ev(2 * i, "tool_use", content_ref="same"))
        s.fold(ev(2 * i + 1, "return", content_ref="out"))
    assert OPENHANDS.check(s) is None  # 2 of 4: no stop yet
    assert LoopConfig().closest(s) == "repeated_action_observation"
    assert LoopConfig(repeated_action_observation=0).closest(s) is None


def test_a_replaced_config_forgets_the_cached_views_of_the_original() -> None:
    base = OPENHANDS.replace(max_tokens=100)
    s = RunState()
    for i in range(5):
        s.fold(ev(2 * i, "tool_use", tool="bash", content_ref="same", tokens=30))
        s.fold(ev(2 * i + 1, "return", tool="bash", content_ref="out"))
    assert base.check(s) is not None  # the caps and the loop detector views are cached now
    off = base.replace(loop={"enabled": False}, max_tokens=None)
    assert off.check(s) is None and off.loop.patterns == ()
    assert base.replace(max_tokens=1000).check(s).name == "loop_detector"


def test_the_defaults_nudge_at_six_and_stop_every_scripted_loop_within_8_steps() -> None:
    loop = LoopConfig()
    assert (loop.repeated_action_observation, loop.repeated_action_error, loop.repeated_cycle) == (6, 6, 6)
    assert (loop.repeated_reply, loop.monologue, loop.alternating_actions) == (6, 4, 8)
    assert (loop.near_repeat, loop.nudge) == (6, 2)
    for failing in (True, False):
        s = RunState()
        fired_at = None
        nudged = []
        for i in range(1, 9):
            steps(s, [("pytest -x", "FAILED" if failing else "ok", failing)], start=2 * (i - 1))
            stop = SafetyConfig().check(s)
            if stop is not None:
                fired_at = i
                assert "still repeated after 2 nudges" in (stop.message or "")
                break
            if (words := loop.nudging(s)) is not None:
                nudged.append(i)
                assert "try something different" in words
        assert (nudged, fired_at) == ([6, 7], 8), (failing, nudged, fired_at)


# ---------------------------------------------------------------- the orchestrator's own verdict


def ledger_turns(state: RunState, verdicts: list[tuple[bool | None, bool | None]], start: int = 0) -> int:
    """Fold (made_progress, in_loop) ledger turns, each on the reply it judges; return the next index."""
    i = start
    for made, in_loop in verdicts:
        progress = {k: v for k, v in (("made_progress", made), ("in_loop", in_loop)) if v is not None}
        state.fold(ev(i, "delegate", agent="orchestrator", to="surfer", content_ref=f"instruction {i}"))
        state.fold(ev(i + 1, "return", agent="surfer", content_ref=f"page {i}", progress=progress or None))
        i += 2
    return i


def test_a_run_its_orchestrator_says_is_in_a_loop_stops_at_the_third_verdict() -> None:
    state = RunState()
    i = ledger_turns(state, [(False, True), (False, True)])
    assert DEFAULT_SAFETY.check(state) is None
    ledger_turns(state, [(False, True)], start=i)
    fired = DEFAULT_SAFETY.check(state)
    assert fired is not None and fired.name == "orchestrator_ledger" and fired.kind == "rule"
    assert (fired.reason, fired.pattern) == ("loop_detected", "in_loop")
    assert "orchestrator's own progress ledger" in fired.message and "is_in_loop: true" in fired.message


def test_no_progress_four_verdicts_in_a_row_stops_with_no_progress() -> None:
    state = RunState()
    i = ledger_turns(state, [(False, False)] * 3)
    assert DEFAULT_SAFETY.check(state) is None  # Magentic-One re-plans at its third stall: give it that
    ledger_turns(state, [(False, False)], start=i)
    fired = DEFAULT_SAFETY.check(state)
    assert fired is not None and (fired.reason, fired.pattern) == ("no_progress", "stalled")
    assert "is_progress_being_made: false" in fired.message


def test_a_run_its_ledger_says_progresses_is_never_stopped_by_it() -> None:
    state = RunState()
    ledger_turns(state, [(True, False)] * 40)
    assert DEFAULT_SAFETY.check(state) is None
    # stalls that do not come in a row: each verdict of progress starts the count again
    mixed = RunState()
    i = 0
    for _ in range(10):
        i = ledger_turns(mixed, [(False, True), (False, True), (True, False)], start=i)
        assert DEFAULT_SAFETY.check(mixed) is None
    assert mixed.ledger_turns == 30 and mixed.ledger_loop_run == 0


def test_events_without_a_verdict_leave_the_counts_alone() -> None:
    state = RunState()
    i = ledger_turns(state, [(False, True), (False, True)])
    # tool results with other progress signals, and no ledger, between two verdicts
    state.fold(ev(i, "tool_use", tool="bash", content_ref="pytest"))
    state.fold(ev(i + 1, "return", content_ref="out", progress={"tests_failed": 2, "source": "pytest"}))
    assert (state.ledger_turns, state.ledger_loop_run, state.ledger_stall_run) == (2, 2, 2)
    ledger_turns(state, [(None, True)], start=i + 2)  # a ledger that states only the loop verdict
    assert DEFAULT_SAFETY.check(state) is not None
    plain = RunState()
    steps(plain, [("a", "b", False)] * 3)  # a run with no orchestrator verdict at all
    assert plain.ledger_turns == 0 and DEFAULT_SAFETY.check(plain) is None


def test_the_ledger_rule_is_configurable_and_can_be_off() -> None:
    state = RunState()
    ledger_turns(state, [(False, True)] * 5)
    assert SafetyConfig.loads('{"ledger": false}').check(state) is None
    assert SafetyConfig.loads('{"ledger": {"in_loop": 0, "stalled": 0}}').check(state) is None
    only_stalls = SafetyConfig.loads('{"ledger": {"in_loop": 0}}').check(state)
    assert only_stalls is not None and only_stalls.pattern == "stalled"
    later = SafetyConfig.loads('{"ledger": {"in_loop": 6, "stalled": 6}}')
    assert later.check(state) is None
    assert SafetyConfig.loads('{"ledger": false}').switched_off() == ["ledger"]
    assert SafetyConfig.loads('{"ledger": {"stalled": 0}}').switched_off() == ["ledger.stalled"]
    assert DEFAULT_SAFETY.switched_off() == []
    assert SafetyConfig.loads(SafetyConfig.loads('{"ledger": null}').dumps()).ledger.enabled is False
    # composed: a node built by | keeps each part's rule
    assert (SafetyConfig(max_turns=100) | SafetyConfig(max_usd=1.0)).check(state) is not None


def test_the_ledger_stops_a_replayed_trace_where_it_would_have_live() -> None:
    verdicts = [(True, False), (False, True), (False, True), (False, True), (True, False)]
    events: list[dict[str, Any]] = []
    for k, (made, in_loop) in enumerate(verdicts):
        events.append({"id": f"d{k}", "t": 2.0 * k, "type": "delegate", "agent": "orchestrator"})
        progress = {"made_progress": made, "in_loop": in_loop, "source": "magentic_one"}
        reply = {"id": f"r{k}", "t": 2.0 * k + 1, "type": "return", "agent": "surfer"}
        events.append({**reply, "progress": progress})
    trace = Trace.model_validate({"trace_id": "m1", "task_id": "t", "events": events})
    first = DEFAULT_SAFETY.first_stop(trace)
    assert first is not None
    turn, index, fired = first
    assert (turn, index, fired.name, fired.pattern) == (4, 7, "orchestrator_ledger", "in_loop")
