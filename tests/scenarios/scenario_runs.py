"""The three scenarios every path must get right, as scripted orchestrator turns.

A turn is what an orchestrator sends between two ``decide`` calls. Each scenario yields
the events of one turn at a time; :func:`drive` feeds them to any ``decide`` callable
and stops at the first stop, so the same runs go through raw HTTP, the sync and async
clients, and (re-scripted in each framework's own terms) the integrations.

* :func:`stuck_loop`: the same command and the same output every turn (1,500 tokens a
  turn). The loop detector's ``repeated_action_observation`` (4 in a row) must stop it,
  well within :data:`LOOP_TURNS`.
* :func:`quality_run`: new work every turn and a quality reward (channel ``quality``
  or none) that jumps from 0.1 and 0.2 to 1.0 at turn :data:`QUALITY_AT`: the
  ``quality_met`` net (1.0) must stop it within :data:`QUALITY_WITHIN` decision points.
* :func:`productive_run`: a new command and a new output every turn, no error, ~1,500
  tokens a turn, and (optionally) a quality reward rising slowly (see its docstring).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from stopserve.client import EventRecorder
from stopserve.features import LOOP_PATTERNS
from stopserve.trace import Event

__all__ = [
    "LOOP_TURNS",
    "PRODUCTIVE_TURNS",
    "QUALITY_AT",
    "QUALITY_WITHIN",
    "TOKENS_PER_TURN",
    "Service",
    "assert_loop_stop",
    "drive",
    "productive_reward",
    "productive_run",
    "quality_run",
    "served_reward_thresholds",
    "stuck_loop",
    "summary",
]

#: A stuck loop must be stopped at or before this turn.
LOOP_TURNS: Final = 8
#: The turn whose reward reaches 1.0 in :func:`quality_run`.
QUALITY_AT: Final = 3
#: Decision points a stop may lag behind the reward reaching 1.0.
QUALITY_WITHIN: Final = 2
#: A productive run must not be stopped before this many turns.
PRODUCTIVE_TURNS: Final = 20
#: Tokens one turn costs (a moderate agent step).
TOKENS_PER_TURN: Final = 1500

Turn = list[Event]


@dataclass(frozen=True)
class Service:
    """Where a client or integration is pointed: the live default server, or nowhere (down)."""

    url: str
    down: bool


def stuck_loop(agent: str = "coder") -> Iterator[Turn]:
    """The same command, the same output, every turn, forever."""
    rec = EventRecorder(agent=agent, id_prefix="loop-")
    while True:
        rec.tool_use("bash", content="pytest tests/test_utils.py -x", tokens=TOKENS_PER_TURN)
        rec.returned("bash", content="FAILED tests/test_utils.py::test_parse - AssertionError")
        yield rec.drain()


def quality_run(channel: str | None = "quality") -> Iterator[Turn]:
    """New work every turn; the quality reward is 0.1, 0.2, then 1.0 from turn ``QUALITY_AT`` on."""
    rec = EventRecorder(agent="coder", id_prefix="quality-")
    turn = 0
    while True:
        turn += 1
        rec.tool_use("bash", content=f"edit and test, attempt {turn}", tokens=TOKENS_PER_TURN)
        rec.returned("bash", content=f"{turn} of 3 checks pass")
        rec.reward(1.0 if turn >= QUALITY_AT else 0.1 * turn, channel=channel)
        yield rec.drain()


def productive_reward(turn: int) -> float:
    """The productive run's quality reward at ``turn`` (1-based): 0.05, then +0.02 a turn."""
    return round(0.05 + 0.02 * (turn - 1), 4)


def productive_run(*, with_reward: bool = True) -> Iterator[Turn]:
    """A run that keeps making progress: a new command and a new output every turn, no
    error, ``TOKENS_PER_TURN`` a turn, and (``with_reward``) a quality reward that rises
    slowly: :func:`productive_reward`, 0.43 at turn 20.

    Why so slow: the shipped default model starts from a base rule (``GET /v1/model``
    ``rule``: a reward threshold, "reward >= 0.4545" at the time of writing) that stops a
    run once its reward reaches that threshold, and rightly so. A run that is still
    productive at turn 20 is one that has not reached it yet; the test checks that
    nothing else (the learned value, the nets) cuts such a run short. The test reads the
    served rule and fails loudly if the run's shape no longer stays under it.
    """
    rec = EventRecorder(agent="coder", id_prefix="productive-")
    turn = 0
    while True:
        turn += 1
        rec.tool_use("bash", content=f"implement step {turn}: edit module_{turn}.py", tokens=TOKENS_PER_TURN)
        rec.returned("bash", content=f"module_{turn}.py written; {turn} new tests pass")
        if with_reward:
            rec.reward(productive_reward(turn), channel="quality")
        yield rec.drain()


Decide = Callable[[Sequence[Event]], Any]


def drive(turns: Iterator[Turn], decide: Decide, max_turns: int) -> list[Any]:
    """Feed one turn at a time to ``decide`` until it says stop or ``max_turns`` passed.

    Returns every answer (objects or dicts with ``action``); the last is the stop, if any.
    """
    answers: list[Any] = []
    for _ in range(max_turns):
        answer = decide(next(turns))
        answers.append(answer)
        action = answer["action"] if isinstance(answer, dict) else answer.action
        if action == "stop":
            break
    return answers


def summary(answers: Sequence[Any]) -> str:
    """One line per answer, for assertion messages: what was decided where."""
    rows = []
    for i, a in enumerate(answers, 1):
        d = a if isinstance(a, dict) else a.model_dump()
        rows.append(
            f"turn {i}: {d['action']} (decision point {d['turn']}, reason {d.get('reason')}, "
            f"net {d.get('safety_net')}, pattern {d.get('pattern')}, rule {d.get('rule')}, "
            f"v {d.get('v_stop')}, degraded {d.get('degraded')})"
        )
    return "\n".join(rows)


def assert_loop_stop(answers: Sequence[Any]) -> dict[str, Any]:
    """The stuck loop was stopped within ``LOOP_TURNS`` turns, and the answer names the loop.

    By the loop detector (``loop_detected``), or earlier by the model (``no_progress``)
    while the loop was in progress: then ``pattern`` names what the run was repeating.
    """
    last = answers[-1] if isinstance(answers[-1], dict) else answers[-1].model_dump()
    assert last["action"] == "stop", f"the stuck loop was never stopped:\n{summary(answers)}"
    assert len(answers) <= LOOP_TURNS, summary(answers)
    assert last["reason"] in ("loop_detected", "no_progress"), (
        f"stopped, but not for the loop:\n{summary(answers)}"
    )
    assert last["pattern"] in LOOP_PATTERNS, f"the answer does not name the loop:\n{summary(answers)}"
    return last


def served_reward_thresholds(rule: Any) -> list[float]:
    """Every reward threshold (``quality_met``) in a served base rule (a SafetyConfig as JSON)."""
    if not isinstance(rule, dict):
        return []
    found = [float(rule["quality_met"])] if rule.get("quality_met") is not None else []
    for child in [*(rule.get("any") or []), *(rule.get("all") or [])]:
        found += served_reward_thresholds(child)
    return found
