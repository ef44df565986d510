"""What the integration tests check of a run that repeats one tool call past the loop
detector's threshold (the defaults: six repeats, then two nudges, then a stop)."""

from __future__ import annotations

from stopserve.api import DecideResponse

__all__ = [
    "NUDGE_START",
    "Plan",
    "assert_each_nudge_sent_once",
    "assert_nudge_texts",
    "assert_stopped_after_nudges",
]

#: How every nudge begins (``stopserve.safety.LoopConfig.nudging``).
NUDGE_START = "you have repeated the same step"
#: The path a scripted agent runs its tests on again and again.
SAME_PATH = "tests"
#: The paths an agent that heeds a nudge tries instead, one each, before it answers.
OTHER_PATHS = ("src", "lib", "docs")


class Plan:
    """A scripted agent's next step: ``run_tests`` on :data:`SAME_PATH` every time, or, once
    it heeds a nudge (``heeds``), on each of :data:`OTHER_PATHS`, then an answer."""

    def __init__(self, heeds: bool) -> None:
        self.heeds = heeds
        self.other: list[str] | None = None

    def next_path(self, nudged: bool) -> str | None:
        """The path to run the tests on next (``None``: answer); ``nudged``: the request ends with a nudge."""
        if self.heeds and nudged and self.other is None:
            self.other = list(OTHER_PATHS)
        if self.other is None:
            return SAME_PATH
        return self.other.pop(0) if self.other else None


def assert_stopped_after_nudges(d: DecideResponse | None) -> None:
    """``d`` stopped the run at the eighth identical result, after two nudges."""
    assert d is not None and d.action == "stop" and d.reason == "loop_detected"
    assert d.pattern == "repeated_action_observation" and d.turn == 8
    assert "still repeated after 2 nudges" in (d.message or "")


def assert_nudge_texts(first: str, second: str) -> None:
    """The two nudges' words: after the sixth result, then after the seventh."""
    assert first.startswith(f"{NUDGE_START} 6 times in a row (the same action with the same result)")
    assert first.endswith("repeats 2 more times")
    assert second.startswith(f"{NUDGE_START} 7 times") and second.endswith("repeats 1 more time")


def assert_each_nudge_sent_once(in_request: list[list[str]], last: list[list[str]]) -> None:
    """The nudges in each model request (``in_request``) and as its last message (``last``):
    none in the first six, then each nudge once, the last message of the request after it
    (a framework whose nudges are only in the request, not in the conversation)."""
    assert len(in_request) == len(last) == 8
    assert in_request == last and [len(n) for n in in_request] == [0] * 6 + [1, 1]
    assert_nudge_texts(in_request[6][0], in_request[7][0])
