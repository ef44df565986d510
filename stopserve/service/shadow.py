"""Shadow challengers: models that decide on every live call beside the champion, never acted on.

Each challenger is a loaded :class:`~stopserve.policy.Policy` with its counts. On every
decide call the engine asks each challenger what it would answer on the same run state
(same λ, safety config and proposal, no exploration), logs that next to the champion's
decision (``challengers`` in ``decisions.jsonl``) and counts:

* per decision, whether its action is the champion's (``agreement``);
* per run, once the champion stops it: whether the challenger had stopped it at an earlier
  turn (and how many turns earlier), stops it at the same turn, or would have gone on
  (``stopped_later``: the run ends here, so how much later is not known).

The answer a client gets is the champion's alone: nothing a challenger says reaches it.
The counts are this process's (each replica counts the calls it serves); ``/metrics``
has them as ``stopserve_challenger_*``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stopserve.api import ChallengerInfo
from stopserve.errors import ConfigError, Issue, ModelNotFoundError
from stopserve.policy import Policy, StopDecision

__all__ = ["Challenger", "Challengers", "ShadowCall", "challenger_dirs"]


@dataclass
class Challenger:
    """One shadow model and its counts."""

    name: str
    policy: Policy
    path: Path
    decisions: int = 0
    agreed: int = 0
    runs: int = 0
    earlier: int = 0
    same: int = 0
    later: int = 0
    turns_earlier: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, mine: StopDecision, champion: StopDecision) -> None:
        """Count one decision made beside the champion's."""
        with self._lock:
            self.decisions += 1
            self.agreed += mine.action == champion.action

    def compare_stop(self, first_stop: int | None, mine: StopDecision, turn: int) -> int | None:
        """Count a run the champion stops at ``turn``: how many turns earlier this one stops (None: later)."""
        with self._lock:
            self.runs += 1
            if first_stop is None and mine.action == "stop":
                first_stop = turn
            if first_stop is None:
                self.later += 1
                return None
            ahead = max(0, turn - first_stop)
            if ahead:
                self.earlier += 1
                self.turns_earlier += ahead
            else:
                self.same += 1
            return ahead

    def info(self) -> ChallengerInfo:
        """What ``GET /v1/model`` shows of it."""
        with self._lock:
            return ChallengerInfo(
                name=self.name,
                model_version=self.policy.model_version,
                kind=self.policy.kind,
                path=str(self.path),
                decisions=self.decisions,
                agreement=self.agreed / self.decisions if self.decisions else None,
                runs=self.runs,
                stopped_earlier=self.earlier,
                stopped_same=self.same,
                stopped_later=self.later,
                mean_turns_earlier=self.turns_earlier / self.earlier if self.earlier else None,
            )


@dataclass(frozen=True, slots=True)
class ShadowCall:
    """What one challenger answered on one call, counted once the call's answer is committed."""

    challenger: Challenger
    decision: StopDecision
    #: the champion stopped the run at this call: where the challenger stops it is compared
    compared: bool = False
    #: the challenger's first stop turn in the run, if it stopped it before (or now)
    first_stop: int | None = None


class Challengers:
    """The challengers of one service process, by name; replaced whole on a change (a call reads it once)."""

    def __init__(self) -> None:
        self._by_name: dict[str, Challenger] = {}
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[Challenger]:
        return iter(list(self._by_name.values()))

    def __len__(self) -> int:
        return len(self._by_name)

    def __bool__(self) -> bool:
        return bool(self._by_name)

    def add(self, name: str, policy: Policy, path: Path) -> Challenger:
        """Add (or replace) a challenger; its counts start at zero."""
        challenger = Challenger(name, policy, path)
        with self._lock:
            self._by_name = {**self._by_name, name: challenger}
        return challenger

    def remove(self, name: str) -> None:
        """Drop a challenger; an unknown name is a :class:`ModelNotFoundError` (404) naming the others."""
        with self._lock:
            if name not in self._by_name:
                known = ", ".join(sorted(self._by_name)) or "none"
                raise ModelNotFoundError(
                    f"no challenger named {name!r} (challengers: {known})",
                    [Issue("unknown name", path="name")],
                )
            self._by_name = {k: v for k, v in self._by_name.items() if k != name}

    def infos(self) -> list[ChallengerInfo]:
        """Every challenger's :meth:`Challenger.info`, by name."""
        return [c.info() for c in sorted(self, key=lambda c: c.name)]

    @staticmethod
    def record(calls: list[ShadowCall]) -> dict[str, Any]:
        """The challengers' decisions as logged next to the champion's."""
        return {
            c.challenger.name: {
                "action": c.decision.action,
                "reason": c.decision.reason,
                "v_stop": c.decision.v_stop,
                "model_version": c.decision.model_version,
            }
            for c in calls
        }


def challenger_dirs(root: Path) -> list[Path]:
    """The model directories under ``root`` (each a challenger, named by its directory), sorted."""
    if not root.is_dir():
        raise ConfigError(
            f"STOPSERVE_CHALLENGERS: {root} is not a directory of model directories",
            [Issue("not a directory", path="STOPSERVE_CHALLENGERS")],
        )
    return sorted(p for p in root.iterdir() if (p / "manifest.json").is_file())
