"""Safety nets and rules: the stops a policy applies before (and beside) its model.

Two kinds, by how they relate to a learned model:

* **Nets** are budgets and always win: ``max_turns``, ``max_seconds``, ``max_tokens``,
  ``max_usd`` (stop with ``budget_exhausted`` and the ``limit``), and the run's own
  :class:`~stopserve.trace.Budget` (given to its :class:`~stopserve.features.RunState`),
  enforced as if its caps were ``max_*`` keys here. The defaults are generous
  (:data:`DEFAULT_MAX_TURNS` agent steps, :data:`DEFAULT_MAX_SECONDS` seconds: no
  productive run in our real corpora comes near them) so that no run is ever unbounded.
* **Rules** are the loop detector (``loop_detected`` with the pattern), the orchestrator's own
  verdict (``orchestrator_ledger``: its progress ledger says it is in a loop, or not making
  progress, several turns in a row; :class:`LedgerConfig`) and ``quality_met`` (the latest
  reward on a channel reached the quality target). On by default for every
  policy; a learned model whose manifest says so (``overrules``) may overrule them where
  its value of going on clears its continue margin (``stopserve.policy``).

``min_turns`` is a veto, not a stop: before it, model stops, proposed stops and
``quality_met`` are refused (verification gets its chance); budget and loop stops are not.
Turns count agent steps (``RunState.turn``), never reward events.

A config is JSON; flat keys are any-of; ``{"any": [...]}`` and ``{"all": [...]}``
compose, and so do the ``|`` and ``&`` operators (as AutoGen's termination
conditions do):

>>> cfg = SafetyConfig.loads('{"max_turns": 50, "quality_met": 0.9}')
>>> both = SafetyConfig(max_tokens=10_000) & SafetyConfig(quality_met=0.8)
>>> SafetyConfig.loads(both.dumps()) == both
True

:data:`DEFAULT_SAFETY` (``SafetyConfig()``) is the one default, used by the service, the
client's local fallback and every integration when nothing else is given: the generous
budgets, the loop detector on with the thresholds tuned on real runs (``docs/safety.md``), the
orchestrator-ledger rule on (in a loop 3 ledger turns in a row, stalled 4),
``quality_met`` at 1.0 on the ``quality`` channel (a run whose quality reward reaches the
top of the format's [0, 1] scale is done; below 1.0 no reward stops a run unless a quality
target is given), ``min_turns`` 1. Turning one off takes an explicit config
(``{"loop": false}``, ``{"ledger": false}``, ``{"quality_met": null}``, ``{"max_seconds": null}``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Final, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from stopserve.errors import ConfigError, pydantic_issues
from stopserve.features import LOOP_PATTERNS, RunState
from stopserve.trace import Limit, StopReason, Trace, is_decision_point

__all__ = [
    "BUDGET_NETS",
    "DEFAULT_MAX_SECONDS",
    "DEFAULT_MAX_TURNS",
    "DEFAULT_SAFETY",
    "LEDGER_RULE",
    "LedgerConfig",
    "LoopConfig",
    "SafetyConfig",
    "SafetyStop",
]

#: The default turn limit: agent steps. The longest run in our real corpora took 144 (a failed
#: SWE-bench run; the longest resolved one 94), MINT and InterCode cap at 5 and 10 (docs/safety.md).
DEFAULT_MAX_TURNS: Final = 500
#: The default time budget, seconds: 4 hours. The longest real run took 1,171 s (SWE-bench).
DEFAULT_MAX_SECONDS: Final = 14_400.0


@dataclass(frozen=True, slots=True)
class SafetyStop:
    """A safety net fired: which one, the format-v1 stop reason, and why."""

    name: str
    reason: StopReason
    limit: Limit | None = None
    pattern: str | None = None
    events: list[str] = field(default_factory=list)
    message: str = ""
    #: ``net``: a budget, always wins; ``rule``: the loop detector or quality_met (or a part of
    #: ``all`` mixing them with a budget), which a learned model may overrule
    kind: Literal["net", "rule"] = "rule"

    @property
    def is_budget(self) -> bool:
        """A net (a budget: always wins), not a rule."""
        return self.kind == "net"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "name": self.name,
            "reason": self.reason,
            "limit": self.limit,
            "pattern": self.pattern,
            "events": list(self.events),
            "message": self.message,
        }


#: The order patterns are checked in: a failing action's repeats are named as failures first
#: (the same failing command with the same output is both, at the same count by default).
_CHECK_ORDER: Final = ("repeated_action_error", *(p for p in LOOP_PATTERNS if p != "repeated_action_error"))


class LoopConfig(BaseModel):
    """Loop-detector thresholds (after OpenHands' stuck detector); 0 (or ``null``) turns one off.

    * ``repeated_action_observation``: the same action with the same result this many
      times in a row;
    * ``repeated_action_error``: the same action failing this many times in a row;
    * ``monologue``: the same message by one agent this many times, nothing between;
    * ``alternating_actions``: this many actions alternating A-B-A-B... (with results);
    * ``repeated_reply``: one agent gives the same reply this many times in a row, other
      agents speaking between (a text-only team stuck on one answer);
    * ``repeated_cycle``: the latest stretch of at most 24 events (any types, one holding a
      content ref) repeated this many times in full, e.g. a debate round whose messages,
      answer and score come back unchanged;
    * ``near_repeat``: the same action with the same result this many times in a row, where
      "the same" is also a text as alike as ``NEAR_SIMILARITY`` by its sketch (the same
      traceback with another timestamp or path) and no step showed progress (fewer failing
      tests, a file changed: ``Event.progress``). Without sketches it is the exact pattern.

    **An exact repeat is evidence, not a verdict** (issue 37): a pattern at its threshold
    first *nudges* for ``nudge`` more repeats (the answer goes on, with ``nudge``: what was
    repeated, for the integrations to tell the agent), and stops the run only if the
    pattern is still going after them. A run that bumps into a wall six times and then
    moves on is not cut; one that does not, is, two steps later. ``nudge: 0``: stop at the
    threshold, as before.

    An action is a ``tool_use`` event, identified by (agent, tool, content_ref); its
    result is the first ``return`` event after it (before the next ``tool_use``),
    identified by its content_ref; it failed when either event has ``error: true``.
    Events without a content_ref never count as repeats. ``"loop": false`` (or
    ``null``) in a config turns the whole detector off.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    # above OpenHands' (4, 3, 3, 6): a loop must show itself six times before the rule ends a run
    # (docs/safety.md: on held-out systems the lower ones cut runs that came back); the default
    # model stops a loop in progress earlier where its value says so (stopserve.evidence)
    repeated_action_observation: int = Field(default=6, ge=0)
    repeated_action_error: int = Field(default=6, ge=0)
    monologue: int = Field(default=4, ge=0)
    alternating_actions: int = Field(default=8, ge=0)
    repeated_cycle: int = Field(default=6, ge=0)
    repeated_reply: int = Field(default=6, ge=0)
    near_repeat: int = Field(default=6, ge=0)
    nudge: int = Field(default=2, ge=0)

    @field_validator("*", mode="before")
    @classmethod
    def _null_is_off(cls, value: Any) -> Any:
        return 0 if value is None else value

    @field_validator(
        "repeated_action_observation",
        "repeated_action_error",
        "monologue",
        "repeated_cycle",
        "repeated_reply",
        "near_repeat",
    )
    @classmethod
    def _at_least_two(cls, value: int) -> int:
        if value == 1:
            raise ValueError("a threshold must be 0 (off) or at least 2: one event is no loop")
        return value

    @field_validator("alternating_actions")
    @classmethod
    def _at_least_four(cls, value: int) -> int:
        if 0 < value < 4:
            raise ValueError("must be 0 (off) or at least 4: A-B-A-B is the shortest alternation")
        return value

    @cached_property
    def _active(self) -> tuple[tuple[str, int], ...]:
        # (pattern, threshold) of the patterns switched on: read once per config, not per decision
        # (a cached_property lives in the instance dict: as cheap to read as a field; the config is frozen)
        if not self.enabled:
            return ()
        return tuple((p, int(getattr(self, p))) for p in _CHECK_ORDER if getattr(self, p))

    @property
    def patterns(self) -> tuple[str, ...]:
        """The patterns switched on, in :data:`~stopserve.features.LOOP_PATTERNS` order."""
        return tuple(p for p, _ in self._active)

    def closest(self, state: RunState) -> str | None:
        """The loop pattern nearest its threshold among those seen at least twice in a row, or ``None``.

        Not a stop: a pattern in progress, named on a model stop so the answer says what
        the run was repeating.
        """
        best: tuple[float, str] | None = None
        for pattern in LOOP_PATTERNS:
            threshold: int = getattr(self, pattern)
            run = state.loop_run(pattern)
            if threshold and run >= 2 and (best is None or run / threshold > best[0]):
                best = (run / threshold, pattern)
        return None if best is None else best[1]

    def check(self, state: RunState) -> SafetyStop | None:
        """The first loop pattern past its threshold and its nudges, or ``None``."""
        nudge = self.nudge
        for pattern, threshold in self._active:
            run = state.loop_run(pattern)
            if run >= threshold + nudge:
                after = f", still repeated after {nudge} nudge{'s' * (nudge != 1)}" if nudge else ""
                return SafetyStop(
                    name="loop_detector",
                    reason="loop_detected",
                    pattern=pattern,
                    events=state.loop_events(pattern),
                    message=f"loop detected: {pattern} x{run} (threshold {threshold}{after})",
                )
        return None

    def nudging(self, state: RunState) -> str | None:
        """The nudge for a pattern at its threshold but not yet past its nudges, or ``None``.

        Words for the agent ("you have repeated ... ; try something else"): the answer
        goes on with them (``DecideResponse.nudge``).
        """
        nudge = self.nudge
        if not nudge:
            return None
        for pattern, threshold in self._active:
            run = state.loop_run(pattern)
            if threshold <= run < threshold + nudge:
                left = threshold + nudge - run
                return (
                    f"you have repeated the same step {run} times in a row ({_NUDGE_WORDS[pattern]}): "
                    f"it is not working; try something different. The run is stopped if it "
                    f"repeats {left} more time{'s' * (left != 1)}"
                )
        return None


#: What each pattern repeats, in a nudge's words.
_NUDGE_WORDS: Final = {
    "repeated_action_observation": "the same action with the same result",
    "repeated_action_error": "the same action, failing each time",
    "monologue": "the same message",
    "alternating_actions": "two actions in turn, the same results",
    "repeated_cycle": "the same round of messages",
    "repeated_reply": "the same reply",
    "near_repeat": "nearly the same action and result, no progress",
}


#: The name a stop by :class:`LedgerConfig` carries (``safety_net`` in the answer).
LEDGER_RULE: Final = "orchestrator_ledger"


class LedgerConfig(BaseModel):
    """The orchestrator's own verdict as a rule: stop a run its orchestrator says is stuck, turn after turn.

    Reads what an orchestrator reports about its own run, each turn (``Event.progress``
    ``in_loop`` / ``made_progress``: Magentic-One's progress ledger, through the AutoGen
    integration), never the content:

    * ``in_loop``: the orchestrator said ``in_loop: true`` this many ledger turns in a row
      (stop: ``loop_detected``, pattern ``in_loop``);
    * ``stalled``: it said it stalled (``made_progress: false`` or ``in_loop: true``, what
      Magentic-One itself counts as a stall) this many ledger turns in a row (stop:
      ``no_progress``, pattern ``stalled``).

    A turn the orchestrator says progresses starts the count again: a run its ledger says is
    getting somewhere is never stopped by this rule. 0 (or ``null``) turns one off;
    ``"ledger": false`` (or ``null``) in a config turns the rule off. Runs whose events carry
    no verdict are untouched.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    # is_in_loop three times in a row marks ~30% of failed Magentic-One runs' cost (issue 37);
    # a stall (no progress, or a loop) a fourth time: Magentic-One re-plans at its third (max_stalls
    # 3), so the fourth is the re-plan not helping
    in_loop: int = Field(default=3, ge=0)
    stalled: int = Field(default=4, ge=0)

    @field_validator("in_loop", "stalled", mode="before")
    @classmethod
    def _null_is_off(cls, value: Any) -> Any:
        return 0 if value is None else value

    @field_validator("in_loop", "stalled")
    @classmethod
    def _at_least_two(cls, value: int) -> int:
        if value == 1:
            raise ValueError("a threshold must be 0 (off) or at least 2: one verdict is no streak")
        return value

    def check(self, state: RunState) -> SafetyStop | None:
        """The orchestrator's verdict that ends the run now, or ``None``."""
        if not self.enabled or not state.ledger_turns:
            return None
        run = state.ledger_loop_run
        if self.in_loop and run >= self.in_loop:
            return SafetyStop(
                name=LEDGER_RULE,
                reason="loop_detected",
                pattern="in_loop",
                message=(
                    f"the orchestrator's own progress ledger: in a loop {run} ledger turns in a row "
                    f"(is_in_loop: true; threshold {self.in_loop})"
                ),
            )
        run = state.ledger_stall_run
        if self.stalled and run >= self.stalled:
            return SafetyStop(
                name=LEDGER_RULE,
                reason="no_progress",
                pattern="stalled",
                message=(
                    f"the orchestrator's own progress ledger: no progress {run} ledger turns in a row "
                    f"(is_progress_being_made: false or is_in_loop: true; threshold {self.stalled})"
                ),
            )
        return None


_BUDGETS: tuple[tuple[str, Limit], ...] = (
    ("max_turns", "turns"),
    ("max_seconds", "seconds"),
    ("max_tokens", "tokens"),
    ("max_usd", "usd"),
)
#: The config keys that are nets (budgets): a stop by one of them always wins.
BUDGET_NETS: Final[tuple[str, ...]] = tuple(key for key, _ in _BUDGETS)
_UNITS = {"turns": "turns", "seconds": "s", "tokens": "tokens", "usd": "USD"}


def _used(state: RunState, limit: Limit) -> float:
    if limit == "turns":
        return state.turn
    if limit == "seconds":
        return state.elapsed
    if limit == "tokens":
        return state.tokens
    return state.usd


class SafetyConfig(BaseModel):
    """Safety nets and rules as data: load and dump JSON, compose with ``|`` and ``&``.

    Flat keys are any-of: the config fires when any of its own conditions fires,
    when any config in ``any`` fires, or when every config in ``all`` fires.
    :meth:`check` returns the first stop found (budgets, then loops, then quality);
    :meth:`check_budgets` only the nets, :meth:`check_rules` only the rules. A part of
    ``all`` that mixes a budget with a rule is a rule (it is not a budget alone).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_turns: int | None = Field(default=DEFAULT_MAX_TURNS, ge=0)
    max_seconds: float | None = Field(default=DEFAULT_MAX_SECONDS, ge=0)
    max_tokens: int | None = Field(default=None, ge=0)
    max_usd: float | None = Field(default=None, ge=0)
    min_turns: int = Field(default=1, ge=0)
    quality_met: float | None = 1.0
    quality_channel: str | None = "quality"
    loop: LoopConfig = Field(default_factory=LoopConfig)
    ledger: LedgerConfig = Field(default_factory=LedgerConfig)
    any: list[SafetyConfig] | None = None
    all: list[SafetyConfig] | None = None

    @model_validator(mode="before")
    @classmethod
    def _loop_switch(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("loop", "ledger"):
                if key in data and data[key] in (None, False, True):
                    data = dict(data)
                    data[key] = {"enabled": bool(data[key])}
        return data

    # ------------------------------------------------------------------ composing

    def __or__(self, other: SafetyConfig) -> SafetyConfig:
        """Stop when either config would."""
        if not isinstance(other, SafetyConfig):
            return NotImplemented
        return SafetyConfig.model_validate({**_EMPTY_NODE, "any": [self, other]})

    def __and__(self, other: SafetyConfig) -> SafetyConfig:
        """Stop only when both configs would (at the same decision point)."""
        if not isinstance(other, SafetyConfig):
            return NotImplemented
        return SafetyConfig.model_validate({**_EMPTY_NODE, "all": [self, other]})

    # ------------------------------------------------------------------ deciding

    @cached_property
    def effective_min_turns(self) -> int:
        """The largest ``min_turns`` anywhere in the config."""
        # a cached_property, not a private attribute: pydantic private-attribute reads cost
        # microseconds, the instance dict a few nanoseconds (the config is frozen)
        if not self.any and not self.all:
            return self.min_turns
        children = [*(self.any or ()), *(self.all or ())]
        deepest: int = max([self.min_turns, *(int(c.effective_min_turns) for c in children)])
        return deepest

    @cached_property
    def _caps(self) -> tuple[tuple[str, Limit, float], ...]:
        # the caps this config sets: the decide path walks these, not all four
        return tuple(
            (key, limit, getattr(self, key)) for key, limit in _BUDGETS if getattr(self, key) is not None
        )

    def allows_stop(self, state: RunState) -> bool:
        """Whether a model, proposed or quality stop may happen now (``min_turns`` reached)."""
        return state.turn >= self.effective_min_turns

    def check(self, state: RunState) -> SafetyStop | None:
        """The stop that applies to ``state`` now (a net or a rule), or ``None`` to go on.

        The run's budget (``state.budget``) is enforced as well as this config's caps.
        """
        return self.check_budgets(state) or self._check(state, self.allows_stop(state), _RULES_ONLY)

    def check_budgets(self, state: RunState) -> SafetyStop | None:
        """The net (a budget: the run's own or this config's) that fires now, or ``None``."""
        budget = state.budget
        if budget is not None:
            for key, limit in _BUDGETS:
                cap = getattr(budget, key)
                if cap is not None and _used(state, limit) >= cap:
                    return self._budget_stop(state, key, limit, cap, "the run's budget")
        return self._check(state, False, _NETS)

    def check_rules(self, state: RunState) -> SafetyStop | None:
        """The rule that fires now (the loop detector, or quality_met once min_turns allows), or ``None``."""
        return self._check(state, self.allows_stop(state), _RULES_ONLY)

    def _budget_stop(self, state: RunState, key: str, limit: Limit, cap: float, whose: str) -> SafetyStop:
        used = _used(state, limit)
        unit = _UNITS[limit]
        return SafetyStop(
            name=key,
            reason="budget_exhausted",
            limit=limit,
            message=f"{key}: {used:g} {unit} used, {whose} allows {cap:g}",
            kind="net",
        )

    def _check(self, state: RunState, allowed: bool, kinds: int) -> SafetyStop | None:
        """The first stop of the ``kinds`` asked for (``_NETS``, ``_RULES_ONLY`` or both)."""
        if kinds & _NETS:
            for key, limit, cap in self._caps:
                if _used(state, limit) >= cap:
                    return self._budget_stop(state, key, limit, cap, "the safety config")
        if kinds & _RULES_ONLY:
            fired = self.loop.check(state) or self.ledger.check(state)
            if fired is not None:
                return fired
            if allowed and self.quality_met is not None:
                value = state.latest_reward_on(self.quality_channel)
                if value is not None and value >= self.quality_met:
                    channel = self.quality_channel or "primary"
                    return SafetyStop(
                        name="quality_met",
                        reason="quality_met",
                        message=(
                            f"quality_met: reward {value:g} on the {channel} channel >= the quality "
                            f"target {self.quality_met:g}"
                        ),
                    )
        for child in self.any or ():
            fired = child._check(state, allowed, kinds)
            if fired is not None:
                return fired
        if self.all:
            # every part must fire, nets or rules alike; the whole is a net only if every part is one
            stops: list[SafetyStop] = []
            for child in self.all:
                fired = child._check(state, allowed, _RULES)
                if fired is None:
                    return None
                stops.append(fired)
            is_net = all(st.is_budget for st in stops)
            if not kinds & (_NETS if is_net else _RULES_ONLY):
                return None
            first = stops[0]
            names = list(dict.fromkeys(st.name for st in stops))
            events = list(dict.fromkeys(e for st in stops for e in st.events))
            return SafetyStop(
                name="&".join(names),
                reason=first.reason,
                limit=first.limit,
                pattern=first.pattern,
                events=events,
                message=" and ".join(st.message for st in stops),
                kind="net" if is_net else "rule",
            )
        return None

    # ------------------------------------------------------------------ JSON

    @classmethod
    def from_dict(cls, data: Any, *, source: str | None = None) -> SafetyConfig:
        """Validate config data; a bad one raises :class:`ConfigError` naming each field."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            issues = pydantic_issues(exc.errors(), file=source, skip=_UNION_TAGS)
            where = f"{source}: " if source else ""
            raise ConfigError(f"{where}invalid safety config ({len(issues)} problems)", issues) from None

    @classmethod
    def loads(cls, text: str | bytes, *, source: str | None = None) -> SafetyConfig:
        """Parse a JSON config."""
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            where = f"{source}: " if source else ""
            raise ConfigError(f"{where}safety config is not valid JSON: {exc}") from None
        return cls.from_dict(data, source=source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SafetyConfig:
        """Read a JSON config file."""
        p = Path(path)
        try:
            text = p.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read safety config: {exc.strerror or exc}") from None
        return cls.loads(text, source=str(p))

    def first_stop(self, trace: Trace) -> tuple[int, int, SafetyStop] | None:
        """Replay a logged run: the first decision point where a net fires, or ``None``.

        Returns ``(turn, index of the event it follows, stop)``; the trace's own
        budget applies, as it would have live.
        """
        state = RunState(trace.topology, trace.budget)
        for i, event in enumerate(trace.events):
            state.fold(event)
            if is_decision_point(event):
                fired = self.check(state)
                if fired is not None:
                    return state.turn, i, fired
        return None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data that :meth:`from_dict` reads back to an equal config.

        Nets or rules switched off are written as ``null`` where the default is on (an
        omitted key would mean the default).
        """
        data = self.model_dump(mode="json", exclude_none=True)
        for key in _ON_BY_DEFAULT:
            if getattr(self, key) is None:
                data[key] = None
        for key in ("any", "all"):
            if key in data:
                data[key] = [c.to_dict() for c in getattr(self, key)]
        return data

    def switched_off(self) -> list[str]:
        """Default nets this config turns off (``loop``, ``loop.<pattern>``, ``quality_met``).

        Used to refuse a model manifest that would silently weaken :data:`DEFAULT_SAFETY`.
        """
        off: list[str] = []
        if not self.loop.enabled:
            off.append("loop")
        else:
            default = LoopConfig()
            off += [f"loop.{p}" for p in LOOP_PATTERNS if getattr(default, p) and not getattr(self.loop, p)]
        if self.quality_met is None:
            off.append("quality_met")
        if not self.ledger.enabled:
            off.append("ledger")
        else:
            off += [f"ledger.{k}" for k in ("in_loop", "stalled") if not getattr(self.ledger, k)]
        return off

    def tightened_by(self, extra: SafetyConfig | None) -> SafetyConfig:
        """These nets plus ``extra``'s (any-of): ``extra`` can add stops, never remove one."""
        if extra is None or extra == self:
            return self
        return self | extra

    def replace(self, **changes: Any) -> SafetyConfig:
        """A copy with ``changes`` (field values or their JSON data), validated anew.

        Not ``model_copy``: that would carry over the cached views (``_caps``, ``_active``)
        of the original, so a copy with the loop detector switched off would still fire it.
        """
        return type(self).model_validate({**self.model_dump(), **changes})

    def dumps(self) -> str:
        """The config as JSON text."""
        return orjson.dumps(self.to_dict()).decode()


#: Fields whose default is on: written as ``null`` when off (see :meth:`SafetyConfig.to_dict`).
_ON_BY_DEFAULT: Final = ("max_turns", "max_seconds", "quality_met", "quality_channel")
#: A composing node (``|``, ``&``) has no nets or rules of its own.
_EMPTY_NODE: Final[dict[str, Any]] = {
    "max_turns": None,
    "max_seconds": None,
    "min_turns": 0,
    "quality_met": None,
    "loop": False,
    "ledger": False,
}
#: What :meth:`SafetyConfig._check` looks for: nets (budgets), rules, or both.
_NETS: Final = 1
_RULES_ONLY: Final = 2
_RULES: Final = _NETS | _RULES_ONLY

_UNION_TAGS = frozenset(
    {"int", "float", "bool", "str", "list[SafetyConfig]", "LoopConfig", "LedgerConfig", "SafetyConfig"}
)


#: The one default set of safety nets (see the module docstring and docs/safety.md).
DEFAULT_SAFETY: Final[SafetyConfig] = SafetyConfig()
