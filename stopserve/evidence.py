"""Evidence of a stall: what a run must show before a model that stops on evidence may stop it.

A model trained on other systems' runs knows base rates, not this run: a low success
rate learned elsewhere is no evidence that this run is failing. A model whose manifest
says ``"stop_on": "evidence"`` (the shipped default) may therefore stop a run on its own
value only where the run itself shows that it stalls (:func:`stall`):

* **repetition**: a loop pattern is in progress (the same action with the same result,
  the same action failing, the same reply... at least twice in a row), below the loop
  detector's thresholds;
* **nothing new**: no event with new content (a new command, a new output, a new
  message) for :attr:`Evidence.quiet_steps` agent steps;
* **no better reward**: the run's quality reward has not improved on its best for
  :attr:`Evidence.reward_steps` agent steps.

A run that keeps doing new things and reports no reward shows none of these, so it is
never stopped by the model (the nets and the rules still apply). Each check is O(1).

>>> from stopserve.features import RunState
>>> stall(RunState(), Evidence()) is None
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from stopserve.features import LOOP_PATTERNS, RunState

__all__ = ["DEFAULT_EVIDENCE", "Evidence", "stall"]


@dataclass(frozen=True, slots=True)
class Evidence:
    """The thresholds of :func:`stall` (agent steps); 0 turns a check off."""

    #: a loop pattern at least this long (in its own unit: pairs, replies, repeats)
    repeat: int = 2
    #: agent steps with no new content
    quiet_steps: int = 3
    #: agent steps since the best quality reward
    reward_steps: int = 4

    def to_dict(self) -> dict[str, int]:
        """JSON-ready form (a manifest's ``evidence``)."""
        return {"repeat": self.repeat, "quiet_steps": self.quiet_steps, "reward_steps": self.reward_steps}

    @classmethod
    def from_dict(cls, data: Any) -> Evidence:
        """Read a manifest's ``evidence``; ``ValueError`` naming the field on a bad one."""
        if data is None:
            return DEFAULT_EVIDENCE
        if not isinstance(data, dict):
            raise ValueError(f"evidence: expected an object, got {type(data).__name__}")
        unknown = sorted(set(data) - {"repeat", "quiet_steps", "reward_steps"})
        if unknown:
            raise ValueError(f"evidence: unknown field {unknown[0]!r}")
        out: dict[str, int] = {}
        for key, value in data.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"evidence.{key}: expected a whole number >= 0, got {value!r}")
            out[key] = value
        return cls(**out)


#: The thresholds the shipped default model was judged with (docs/training.md).
DEFAULT_EVIDENCE: Final = Evidence()


def stall(state: RunState, evidence: Evidence) -> str | None:
    """What shows that the run stalls, in words, or ``None`` when it shows nothing.

    Every loop pattern counts (:data:`~stopserve.features.LOOP_PATTERNS`), whether or not
    the loop detector is on: this is evidence for a model stop, not a rule.
    """
    if evidence.repeat:
        for pattern in LOOP_PATTERNS:
            run = state.loop_run(pattern)
            if run >= evidence.repeat:
                return f"{pattern} x{run}"
    if evidence.quiet_steps:
        quiet = state.steps_since_new_content
        if quiet >= evidence.quiet_steps:
            return f"nothing new for {quiet} steps"
    if evidence.reward_steps:
        since = state.steps_since_best_reward
        if since is not None and since >= evidence.reward_steps:
            return f"no better reward for {since} steps"
    return None
