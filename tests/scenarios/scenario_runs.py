"""Scripted runs every path must get right, written from how real agents behave.

A step is what an orchestrator sends between two ``decide`` calls: one agent step (a tool
call and its result, a message handed back) and, where the run has a reward channel, its
reward. Each scenario yields the events of one step at a time; :func:`drive` feeds them to
any ``decide`` callable and stops at the first stop, so the same runs go through raw
HTTP, the sync and async clients (service up and down), and, re-scripted in each
framework's own terms, the integrations.

Productive runs, which nothing may stop before they are done (:data:`PRODUCTIVE`):

* ``fix_and_retest``: edit (new content each time), run the same ``pytest`` command,
  the same failure, five times; the sixth run passes;
* ``rising_reward_03`` / ``rising_reward_08``: a new command each step and a quality
  reward rising by 0.03 / 0.08 a step until it reaches 1.0;
* ``reward_dip``: a rising reward that dips for three steps, then recovers to 1.0;
* ``no_reward_100``: 100 steps of new content and no reward channel at all;
* ``distinct_errors``: a new command each step, each failing with a new error;
* ``retry_until_success``: fresh attempts at a task (new plan, new output), the first
  six fail, the seventh succeeds (the pattern of a retry agent with no reward channel);
* ``support_chat``: a customer-service agent talking with a user over 40 turns and calling
  lookup tools, reward only at the end (none reaches the service during the run);
* ``polling_progress``: a job polled with the same command, whose log grows each time;
* ``recoverable_bumps``: six identical bumps into a wall (the exact-repeat threshold), then
  twenty new rooms: nudged, not stopped (issue 37: an exact repeat is evidence, not a verdict).

Runs that must stop (:data:`MUST_STOP`):

* ``failing_loop``: the same failing command, the same output: stopped within
  :data:`LOOP_STEPS` steps, the reason naming the loop;
* ``succeeding_loop``: the same succeeding command, the same output, likewise;
* ``traceback_loop``: the same failing command, the same traceback with another timestamp,
  temp dir and line number each time, likewise;
* ``rephrased_search``: a search rephrased only in its numbers, the same empty result each
  time (no two actions equal: only the sketches see the repeat, ``near_repeat``), likewise;
* ``solved``: the quality reward reaches 1.0 at step :data:`SOLVED_AT`: stopped within
  :data:`SOLVED_WITHIN` decision points (``quality_met``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from stopserve.client import EventRecorder
from stopserve.features import LOOP_PATTERNS
from stopserve.safety import LoopConfig
from stopserve.trace import Event

__all__ = [
    "LOOP_STEPS",
    "LOOP_TURNS",
    "MUST_STOP",
    "PRODUCTIVE",
    "SCENARIOS",
    "SOLVED_AT",
    "SOLVED_WITHIN",
    "TEXT_LOOP_TURNS",
    "TOKENS_PER_TURN",
    "Scenario",
    "Service",
    "assert_loop_stop",
    "check",
    "drive",
    "summary",
]

#: A loop must be stopped at or before this step.
LOOP_STEPS: Final = 8
LOOP_TURNS: Final = LOOP_STEPS  # the integrations' name for it
#: A text-only team stuck in one exchange (two agents repeating their messages) is stopped after the
#: exchange's sixth repeat and its two nudges: two messages a repeat, one exchange for the frameworks'
#: first turn.
TEXT_LOOP_TURNS: Final = 2 * (LoopConfig().repeated_reply + LoopConfig().nudge + 1)
#: The step whose reward reaches 1.0 in ``solved``.
SOLVED_AT: Final = 3
#: Decision points a stop may lag behind the reward reaching 1.0.
SOLVED_WITHIN: Final = 2
#: Tokens one step costs (a moderate agent step).
TOKENS_PER_TURN: Final = 1500

Step = list[Event]


@dataclass(frozen=True)
class Service:
    """Where a client or integration is pointed: the live default server, or nowhere (down)."""

    url: str
    down: bool


@dataclass(frozen=True)
class Scenario:
    """A scripted run and what must happen to it.

    ``steps`` yields one step's events at a time. ``done_at``: the step at which a
    productive run has done its work (nothing may stop it earlier; with ``then_quality``
    its reward is 1.0 there and ``quality_met`` must stop it within ``SOLVED_WITHIN``
    decision points; without, the run is driven to ``done_at`` and must not be stopped at
    all). ``stop_within``: a run that must be stopped by that step, for one of ``reasons``.
    """

    name: str
    steps: Callable[[], Iterator[Step]]
    done_at: int | None = None
    then_quality: bool = False
    stop_within: int | None = None
    reasons: tuple[str, ...] = ()

    @property
    def limit(self) -> int:
        """Steps to drive the run for."""
        if self.stop_within is not None:
            return self.stop_within + 30  # a missed stop shows as a run that went on
        assert self.done_at is not None
        return self.done_at + (SOLVED_WITHIN + 1 if self.then_quality else 0)


def _recorder(name: str) -> EventRecorder:
    return EventRecorder(agent="coder", id_prefix=f"{name}-")


def fix_and_retest() -> Iterator[Step]:
    rec = _recorder("fix")
    for attempt in range(1, 1000):
        rec.tool_use("edit", content=f"edit src/parse.py: attempt {attempt}", tokens=TOKENS_PER_TURN)
        rec.returned("edit", content=f"src/parse.py updated ({attempt})")
        yield rec.drain()
        rec.tool_use("bash", content="pytest tests/test_parse.py -x", tokens=TOKENS_PER_TURN)
        passed = attempt >= 6
        rec.returned(
            "bash",
            content="1 passed" if passed else "FAILED tests/test_parse.py::test_roundtrip - AssertionError",
            error=not passed,
        )
        yield rec.drain()


def rising_reward(step_gain: float) -> Callable[[], Iterator[Step]]:
    def run() -> Iterator[Step]:
        rec = _recorder(f"rise{step_gain}")
        for step in range(1, 1000):
            rec.tool_use("bash", content=f"refine the query, version {step}", tokens=TOKENS_PER_TURN)
            rec.returned("bash", content=f"result set {step}")
            rec.reward(min(1.0, round(0.1 + step_gain * (step - 1), 4)), channel="quality")
            yield rec.drain()

    return run


def _steps_to_one(step_gain: float) -> int:
    step = 1
    while min(1.0, round(0.1 + step_gain * (step - 1), 4)) < 1.0:
        step += 1
    return step


_DIP: Final = (0.2, 0.35, 0.5, 0.4, 0.3, 0.35, 0.6, 0.8, 1.0)


def reward_dip() -> Iterator[Step]:
    rec = _recorder("dip")
    for step in range(1, 1000):
        rec.tool_use("bash", content=f"try approach {step}", tokens=TOKENS_PER_TURN)
        rec.returned("bash", content=f"outcome {step}")
        rec.reward(_DIP[min(step, len(_DIP)) - 1], channel="quality")
        yield rec.drain()


def no_reward_100() -> Iterator[Step]:
    rec = _recorder("long")
    for step in range(1, 1000):
        rec.tool_use("bash", content=f"implement part {step}: edit module_{step}.py", tokens=TOKENS_PER_TURN)
        rec.returned("bash", content=f"module_{step}.py written; {step} tests pass")
        yield rec.drain()


def distinct_errors() -> Iterator[Step]:
    rec = _recorder("errors")
    for step in range(1, 1000):
        rec.tool_use("bash", content=f"python scripts/probe_{step}.py", tokens=TOKENS_PER_TURN)
        rec.returned("bash", content=f"Traceback ... KeyError: 'field_{step}'", error=True)
        yield rec.drain()


def retry_until_success() -> Iterator[Step]:
    rec = _recorder("retry")
    for attempt in range(1, 1000):
        ok = attempt >= 7
        rec.tool_use("solve", content=f"attempt {attempt}: plan {attempt}", tokens=TOKENS_PER_TURN)
        rec.returned(
            "solve",
            content="solved" if ok else f"attempt {attempt} failed: {attempt} checks off",
            error=not ok,
        )
        yield rec.drain()


def support_chat() -> Iterator[Step]:
    rec = EventRecorder(agent="support", id_prefix="chat-")
    for turn in range(1, 1000):
        if turn % 4 == 0:
            rec.tool_use("lookup_order", content=f"order {1000 + turn}", tokens=400)
            rec.returned("lookup_order", content=f"order {1000 + turn}: shipped on day {turn}")
        else:
            rec.communicate(content=f"user message {turn}", agent="user", tokens=200)
            rec.returned(content=f"agent reply {turn}", tokens=600)
        yield rec.drain()


def polling_progress() -> Iterator[Step]:
    rec = _recorder("poll")
    for poll in range(1, 1000):
        rec.tool_use("bash", content="sleep 30; tail -n 5 build.log", tokens=300)
        rec.returned("bash", content=f"[{poll * 30}s] compiling unit {poll} of 40")
        yield rec.drain()


def recoverable_bumps() -> Iterator[Step]:
    """Six identical bumps into a wall (a text game's move, cheap and recoverable), then on its way."""
    rec = _recorder("bumps")
    for _ in range(6):
        rec.tool_use("move", content="go north", tokens=200)
        rec.returned("move", content="You bump into a wall. You are in a dark corridor.")
        yield rec.drain()
    rooms = ("kitchen", "cellar", "garden", "library", "attic", "hall", "stairs", "study", "vault", "gate")
    for step, room in enumerate(rooms * 2):
        rec.tool_use(
            "move", content=f"go {('east', 'south', 'west', 'up')[step % 4]} to the {room}", tokens=200
        )
        rec.returned("move", content=f"You enter the {room}. Exits lead on; you pick up item {step}.")
        rec.reward(min(1.0, 0.05 * (step + 1)), channel="progress")
        yield rec.drain()


def traceback_loop() -> Iterator[Step]:
    """The same failing command, the same traceback with another timestamp, temp dir and line each time."""
    rec = _recorder("traceback")
    for step in range(1, 1000):
        rec.tool_use("bash", content="python -m app.main --config conf.yaml", tokens=TOKENS_PER_TURN)
        rec.returned(
            "bash",
            content=f"2026-05-{step % 28 + 1:02d}T10:{step % 60:02d}:07Z ERROR Traceback (most recent call "
            f'last): File "/tmp/tmp{step:08x}/app/main.py", line {40 + step}, in load KeyError: '
            "'database'",
            error=True,
        )
        yield rec.drain()


def rephrased_search() -> Iterator[Step]:
    """A search rephrased only in its numbers, each time with the same empty result: no exact repeat."""
    rec = _recorder("search")
    for step in range(1, 1000):
        rec.tool_use(
            "search", content=f"search the docs for 'retry policy' (attempt {step}, top {10 * step})"
        )
        rec.returned("search", content="No results found for your query.")
        yield rec.drain()


def failing_loop() -> Iterator[Step]:
    rec = _recorder("loop")
    while True:
        rec.tool_use("bash", content="pytest tests/test_utils.py -x", tokens=TOKENS_PER_TURN)
        rec.returned("bash", content="FAILED tests/test_utils.py::test_parse - AssertionError", error=True)
        yield rec.drain()


def succeeding_loop() -> Iterator[Step]:
    rec = _recorder("same")
    while True:
        rec.tool_use("bash", content="cat config.yaml", tokens=TOKENS_PER_TURN)
        rec.returned("bash", content="debug: false\nworkers: 4")
        yield rec.drain()


def solved(channel: str | None = "quality") -> Callable[[], Iterator[Step]]:
    def run() -> Iterator[Step]:
        rec = _recorder(f"solved{channel}")
        for step in range(1, 1000):
            rec.tool_use("bash", content=f"edit and test, attempt {step}", tokens=TOKENS_PER_TURN)
            rec.returned("bash", content=f"{step} of 3 checks pass")
            rec.reward(1.0 if step >= SOLVED_AT else 0.1 * step, channel=channel)
            yield rec.drain()

    return run


PRODUCTIVE: Final[tuple[Scenario, ...]] = (
    Scenario("fix_and_retest", fix_and_retest, done_at=12),
    Scenario("rising_reward_03", rising_reward(0.03), done_at=_steps_to_one(0.03), then_quality=True),
    Scenario("rising_reward_08", rising_reward(0.08), done_at=_steps_to_one(0.08), then_quality=True),
    Scenario("reward_dip", reward_dip, done_at=len(_DIP), then_quality=True),
    Scenario("no_reward_100", no_reward_100, done_at=100),
    Scenario("distinct_errors", distinct_errors, done_at=10),
    Scenario("retry_until_success", retry_until_success, done_at=7),
    Scenario("support_chat", support_chat, done_at=40),
    Scenario("polling_progress", polling_progress, done_at=40),
    Scenario("recoverable_bumps", recoverable_bumps, done_at=26),
)
MUST_STOP: Final[tuple[Scenario, ...]] = (
    Scenario("failing_loop", failing_loop, stop_within=LOOP_STEPS, reasons=("loop_detected", "no_progress")),
    Scenario(
        "succeeding_loop", succeeding_loop, stop_within=LOOP_STEPS, reasons=("loop_detected", "no_progress")
    ),
    Scenario(
        "traceback_loop", traceback_loop, stop_within=LOOP_STEPS, reasons=("loop_detected", "no_progress")
    ),
    Scenario(
        "rephrased_search", rephrased_search, stop_within=LOOP_STEPS, reasons=("loop_detected", "no_progress")
    ),
    Scenario("solved", solved(), stop_within=SOLVED_AT, reasons=("quality_met",)),
    Scenario("solved_primary_channel", solved(None), stop_within=SOLVED_AT, reasons=("quality_met",)),
)
SCENARIOS: Final[dict[str, Scenario]] = {s.name: s for s in (*PRODUCTIVE, *MUST_STOP)}


Decide = Callable[[Sequence[Event]], Any]


def drive(steps: Iterator[Step], decide: Decide, max_steps: int) -> list[Any]:
    """Feed one step at a time to ``decide`` until it says stop or ``max_steps`` passed.

    Returns every answer (objects or dicts with ``action``); the last is the stop, if any.
    """
    answers: list[Any] = []
    for _ in range(max_steps):
        answer = decide(next(steps))
        answers.append(answer)
        if _d(answer)["action"] == "stop":
            break
    return answers


def _d(answer: Any) -> dict[str, Any]:
    return answer if isinstance(answer, dict) else answer.model_dump()


def summary(answers: Sequence[Any]) -> str:
    """One line per answer, for assertion messages: what was decided where."""
    rows = []
    for i, a in enumerate(answers, 1):
        d = _d(a)
        rows.append(
            f"step {i}: {d['action']} (turn {d['turn']}, reason {d.get('reason')}, "
            f"net {d.get('safety_net')}, pattern {d.get('pattern')}, rule {d.get('rule')}, "
            f"v {d.get('v_stop')}, degraded {d.get('degraded')}; {d.get('message')})"
        )
    return "\n".join(rows)


def assert_loop_stop(answers: Sequence[Any]) -> dict[str, Any]:
    """A loop was stopped within ``LOOP_STEPS`` steps, and the answer names the loop.

    By the loop detector (``loop_detected``), or earlier by the model (``no_progress``)
    while the loop was in progress: then ``pattern`` names what the run was repeating.
    """
    last = _d(answers[-1])
    assert last["action"] == "stop", f"the loop was never stopped:\n{summary(answers)}"
    assert len(answers) <= LOOP_STEPS, summary(answers)
    assert last["reason"] in ("loop_detected", "no_progress"), (
        f"stopped, but not for the loop:\n{summary(answers)}"
    )
    assert last["pattern"] in LOOP_PATTERNS, f"the answer does not name the loop:\n{summary(answers)}"
    return last


def check(scenario: Scenario, answers: Sequence[Any]) -> None:
    """What must happen to ``scenario``, given the answers ``drive`` collected."""
    last = _d(answers[-1])
    if scenario.stop_within is not None:
        if "loop_detected" in scenario.reasons:
            assert_loop_stop(answers)
        else:
            assert last["action"] == "stop" and last["reason"] in scenario.reasons, summary(answers)
            assert scenario.stop_within <= len(answers), f"stopped before it was done:\n{summary(answers)}"
            # the reward came with step SOLVED_AT; a stop may lag it by SOLVED_WITHIN decision points
            assert len(answers) <= scenario.stop_within + SOLVED_WITHIN - 1, summary(answers)
        return
    assert scenario.done_at is not None
    early = [i for i, a in enumerate(answers, 1) if _d(a)["action"] == "stop" and i < scenario.done_at]
    assert not early, (
        f"{scenario.name}: stopped at step {early[0]}, before its work was done:\n{summary(answers)}"
    )
    if scenario.then_quality:
        assert last["action"] == "stop" and last["reason"] == "quality_met", summary(answers)
        assert len(answers) <= scenario.done_at + SOLVED_WITHIN - 1, summary(answers)
    else:
        assert len(answers) == scenario.done_at, summary(answers)
