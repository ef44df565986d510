"""RunState.to_bytes / from_bytes: a restored state folds on exactly as the original (issue 15).

The service's shared run store moves a run's state between processes at every call, so a
restored state must be indistinguishable from one never serialized: every slot, every
feature, every loop view, after any further events, in any process.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stopserve.features import LOOP_PATTERNS, STATE_VERSION, RunState
from stopserve.trace import TOPOLOGIES, Budget, Event

pytest.importorskip("msgpack", reason="RunState.to_bytes needs msgpack: pip install -e '.[redis]'")

ROOT = Path(__file__).resolve().parents[1]
_KINDS = ("spawn", "delegate", "communicate", "tool_use", "return", "aggregate", "reward", "stop")
_LONG_REF = "x" * 300  # above MAX_REF_CHARS: remembered as a digest


@st.composite
def runs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Event dicts of one run: few agents, tools and refs, so loops and repeats happen often."""
    n = draw(st.integers(1, 70))
    t = 0.0
    events: list[dict[str, Any]] = []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.5, 1.0, 7.25]))
        kind = draw(st.sampled_from(_KINDS))
        e: dict[str, Any] = {
            "id": f"e{i}",
            "t": t,
            "type": kind,
            "agent": draw(st.sampled_from(["o", "a", "b", "c"])),
            "to": draw(st.sampled_from([None, "a", "b"])),
            "tool": draw(st.sampled_from([None, "bash", "search"])),
            "content_ref": draw(st.sampled_from([None, "r1", "r2", "r3", _LONG_REF])),
            "tokens": draw(st.one_of(st.none(), st.integers(0, 5000))),
            "usd": draw(st.one_of(st.none(), st.floats(0, 1))),
            "error": draw(st.sampled_from([None, False, True])),
        }
        if kind == "reward":
            e["value"] = draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, -1.0]))
            e["channel"] = draw(st.sampled_from([None, "quality", "tests"]))
        if kind == "stop":
            e["reason"] = "unknown"
            e["proposed"] = draw(st.booleans())
        events.append({k: v for k, v in e.items() if v is not None})
    return events


def events_of(raw: list[dict[str, Any]]) -> list[Event]:
    return [Event.model_validate(e) for e in raw]


def assert_same(a: RunState, b: RunState, where: str) -> None:
    """Every slot equal (deques with the same bound), every feature and loop view equal."""
    for name in RunState.__slots__:
        x, y = getattr(a, name), getattr(b, name)
        assert type(x) is type(y), f"{where}: slot {name}: {type(x).__name__} vs {type(y).__name__}"
        assert x == y, f"{where}: slot {name} differs"
        if isinstance(x, deque):
            assert x.maxlen == y.maxlen, f"{where}: slot {name}: deque bound differs"
        if isinstance(x, dict) and name == "_reply_ids":
            for k in x:
                assert x[k].maxlen == y[k].maxlen, f"{where}: slot {name}[{k}] bound differs"
    np.testing.assert_array_equal(a.features(), b.features(), err_msg=where)
    for pattern in LOOP_PATTERNS:
        assert a.loop_run(pattern) == b.loop_run(pattern), f"{where}: loop_run({pattern})"
        assert a.loop_events(pattern) == b.loop_events(pattern), f"{where}: loop_events({pattern})"


@settings(max_examples=80, deadline=None)
@given(
    raw=runs(),
    seed=st.integers(0, 2**32 - 1),
    tiny=st.booleans(),
    topology=st.sampled_from([None, *TOPOLOGIES]),
    budget=st.booleans(),
)
def test_restored_state_folds_on_like_its_twin(
    raw: list[dict[str, Any]], seed: int, tiny: bool, topology: str | None, budget: bool
) -> None:
    # tiny windows make the id, ref and agent compaction happen inside short runs
    windows: dict[str, int] = {"seen_window": 3, "ref_window": 2, "max_agents": 2} if tiny else {}
    caps = Budget(max_turns=20, max_tokens=50_000) if budget else None
    twin = RunState(topology, caps, **windows)
    moved = RunState(topology, caps, **windows)
    rng = random.Random(seed)
    for i, event in enumerate(events_of(raw)):
        if rng.random() < 0.4:  # serialized at random points, restored, and folded on
            moved = RunState.from_bytes(moved.to_bytes())
            assert_same(twin, moved, f"restored before event {i}")
        assert twin.fold(event) == moved.fold(event)
        if rng.random() < 0.1:  # a retried event is skipped by both
            assert twin.fold(event) is False and moved.fold(event) is False
        assert_same(twin, moved, f"after event {i}")
    assert_same(twin, RunState.from_bytes(moved.to_bytes()), "at the end")


def cycle_run(n: int) -> list[dict[str, Any]]:
    """A run stuck in a 3-event cycle (two agents talking past a tool call)."""
    kinds = [("tool_use", "a", "bash", "q"), ("return", "a", None, "res"), ("communicate", "b", None, "m")]
    out = []
    for i in range(n):
        kind, agent, tool, ref = kinds[i % 3]
        e = {"id": f"c{i}", "t": float(i), "type": kind, "agent": agent, "content_ref": ref}
        if tool:
            e["tool"] = tool
        out.append(e)
    return out


def test_a_state_restored_in_another_process_folds_on_the_same(tmp_path: Path) -> None:
    """str hashes are salted per process: a restored state must not depend on them."""
    raw = cycle_run(40)
    head, tail = events_of(raw[:20]), raw[20:]
    here = RunState()
    here.fold_many(head)
    (tmp_path / "state.bin").write_bytes(here.to_bytes())
    (tmp_path / "tail.json").write_text(json.dumps(tail))
    script = (
        "import json,sys\n"
        "from pathlib import Path\n"
        "from stopserve.features import RunState\n"
        "from stopserve.trace import Event\n"
        "d = Path(sys.argv[1])\n"
        "s = RunState.from_bytes((d / 'state.bin').read_bytes())\n"
        "rows = []\n"
        "for e in json.loads((d / 'tail.json').read_text()):\n"
        "    s.fold(Event.model_validate(e))\n"
        "    rows.append([s.loop_run('repeated_cycle'), s.features().tolist()])\n"
        "print(json.dumps(rows))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "12345"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    there = json.loads(done.stdout)
    for i, event in enumerate(events_of(tail)):
        here.fold(event)
        cycle, features = there[i]
        assert cycle == here.loop_run("repeated_cycle"), f"event {i}: repeated_cycle differs"
        np.testing.assert_array_equal(np.array(features, dtype=float), here.features())
    assert here.loop_run("repeated_cycle") >= 10  # the cycle went on across the move


def test_bad_bytes_are_refused_with_what_is_wrong() -> None:
    import msgpack

    good = RunState().to_bytes()
    doc = msgpack.unpackb(good)
    cases = {
        b"\x00not msgpack at all": "not a serialized RunState",
        msgpack.packb({"hello": 1}): "no 'stopserve.runstate' header",
        msgpack.packb({**doc, "version": STATE_VERSION + 1}): f"version {STATE_VERSION + 1}",
        msgpack.packb(
            {**doc, "slots": {k: v for k, v in doc["slots"].items() if k != "_turn"}}
        ): "lacks _turn",
        msgpack.packb({**doc, "slots": {**doc["slots"], "_sig_pos": [[1, 2], [3]]}}): "malformed",
    }
    for data, words in cases.items():
        with pytest.raises(ValueError, match=words):
            RunState.from_bytes(data)
