"""What a unit of cost is worth: :class:`Objective`, the one place a cost weight is defined.

A stop policy trades quality (a success is worth 1) against cost. The trade is one of two,
never both:

* **λ** (``lam``, on the wire ``lambda``): quality units per cost unit, e.g. 0.2 per
  thousand tokens;
* **a cost share** s (``cost_share``): "a whole run costs s of what a success is worth".
  A model trained on one system resolves it to λ = s / its mean logged run cost; a model
  trained across systems (``cost_scale`` ``per_run``) weighs the share of *this* run's
  expected total cost still to come, so one share fits a 1k-token and a 1M-token system.

Costs are counted in one **unit** (:data:`COST_UNITS`): ``ktokens`` (tokens / 1000),
``usd`` or ``seconds`` (time elapsed). An objective may name its unit; one without says
"in the unit of the model (or data) it is applied to". :data:`DEFAULT_OBJECTIVE` (a cost
share of :data:`DEFAULT_COST_SHARE`) is what the trainer fits for when told nothing.

>>> Objective(cost_share=0.3).describe()
'cost share 0.3'
>>> Objective(lam=0.2, unit="usd").to_dict()
{'lambda': 0.2, 'unit': 'usd'}
>>> Objective.of(None, None) is None
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, Literal

import numpy as np

from stopserve.errors import ConfigError, Issue

if TYPE_CHECKING:
    from stopserve.features import RunState

__all__ = [
    "COST_UNITS",
    "DEFAULT_COST_SHARE",
    "DEFAULT_OBJECTIVE",
    "CostUnit",
    "Objective",
    "cost_budget",
    "cost_so_far",
    "event_cost",
]

#: A cost unit: thousands of tokens, US dollars, or seconds elapsed.
CostUnit = Literal["usd", "ktokens", "seconds"]
#: Every cost unit (this order indexes the trainer's per-unit cost columns).
COST_UNITS: Final[tuple[CostUnit, ...]] = ("usd", "ktokens", "seconds")
#: "A whole run costs 30% of what a success is worth": the default objective's share.
DEFAULT_COST_SHARE: Final = 0.3


@dataclass(frozen=True, slots=True)
class Objective:
    """What a unit of cost is worth: ``lam`` per cost unit, or a ``cost_share`` of a success.

    Exactly one of the two, finite and >= 0; ``unit`` is the cost unit (None: the model's,
    or the data's). Frozen and hashable; a bad one raises
    :class:`~stopserve.errors.ConfigError` naming the field (``lambda``, ``cost_share``,
    ``unit``).
    """

    lam: float | None = None
    cost_share: float | None = None
    unit: CostUnit | None = None

    def __post_init__(self) -> None:
        issues: list[Issue] = []
        for name, value in (("lambda", self.lam), ("cost_share", self.cost_share)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                issues.append(Issue(f"expected a number, got {value!r}", path=name))
            elif not (math.isfinite(value) and value >= 0):
                issues.append(Issue(f"must be a finite number >= 0, got {value!r}", path=name))
        if self.lam is not None and self.cost_share is not None:
            issues.append(Issue("give lambda or a cost share, not both", path="lambda"))
        elif self.lam is None and self.cost_share is None:
            issues.append(Issue("give lambda or a cost share", path="lambda"))
        if self.unit is not None and self.unit not in COST_UNITS:
            issues.append(Issue(f"{self.unit!r} is not one of {', '.join(COST_UNITS)}", path="unit"))
        if issues:
            raise ConfigError(
                f"invalid objective (what cost is worth): {issues[0].path}: {issues[0].message}", issues
            )
        # a whole number is a float here: equal objectives compare and hash equal
        for name in ("lam", "cost_share"):
            value = getattr(self, name)
            if isinstance(value, int):
                object.__setattr__(self, name, float(value))

    # ------------------------------------------------------------------ construction

    @classmethod
    def of(
        cls, lam: float | None = None, cost_share: float | None = None, unit: CostUnit | None = None
    ) -> Objective | None:
        """The objective of an optional ``lam`` and ``cost_share`` (a request's, a command's):
        None when neither is given (the default applies), an error when both are."""
        if lam is None and cost_share is None:
            return None
        return cls(lam=lam, cost_share=cost_share, unit=unit)

    @classmethod
    def from_dict(cls, data: Any, *, source: str | None = None) -> Objective:
        """Read ``{"lambda": x}`` or ``{"cost_share": s}`` (and an optional ``unit``)."""
        where = f"{source}: " if source else ""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}an objective is an object, got {type(data).__name__}")
        unknown = sorted(set(data) - {"lambda", "cost_share", "unit"})
        if unknown:
            raise ConfigError(
                f"{where}{unknown[0]}: unknown field (an objective holds lambda, cost_share, unit)",
                [Issue("unknown field", file=source, path=unknown[0])],
            )
        try:
            return cls(lam=data.get("lambda"), cost_share=data.get("cost_share"), unit=data.get("unit"))
        except ConfigError as exc:
            if source is None:
                raise
            issues = [Issue(i.message, file=source, path=i.path) for i in exc.issues]
            raise ConfigError(f"{where}{exc.message}", issues) from None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form :meth:`from_dict` reads back (``lambda`` or ``cost_share``, and ``unit``)."""
        out: dict[str, Any] = (
            {"lambda": self.lam} if self.lam is not None else {"cost_share": self.cost_share}
        )
        if self.unit is not None:
            out["unit"] = self.unit
        return out

    def to_wire(self) -> dict[str, float]:
        """The request fields of the HTTP API: ``{"lambda": x}`` or ``{"cost_share": s}`` (λ is per
        the served model's cost unit: the wire names no unit)."""
        if self.lam is not None:
            return {"lambda": self.lam}
        assert self.cost_share is not None
        return {"cost_share": self.cost_share}

    def in_unit(self, unit: CostUnit) -> Objective:
        """This objective for costs counted in ``unit``: its own unit must be that one (or unset)."""
        if self.unit == unit:
            return self
        if self.unit is not None:
            raise ConfigError(
                f"what cost is worth is given per {self.unit}, but the costs are counted in {unit}",
                [Issue(f"expected {unit} (the model's cost unit), got {self.unit}", path="unit")],
            )
        return replace(self, unit=unit)

    # ------------------------------------------------------------------ the weight of cost

    @property
    def is_share(self) -> bool:
        """Whether this is a cost share (else a λ)."""
        return self.cost_share is not None

    def lam_at(self, mean_cost: float) -> float:
        """λ per cost unit, a share resolved against ``mean_cost`` (a mean run's cost; 0 if it is 0)."""
        if self.lam is not None:
            return self.lam
        assert self.cost_share is not None
        return self.cost_share / mean_cost if mean_cost > 0 else 0.0

    def weight(self, k_turns: Any, turn: Any, cost: Any, *, mean_cost: float | None) -> tuple[Any, Any]:
        """``(w, cost_to_go)``: the rest of the run's cost in quality units, and in cost units.

        ``k_turns`` is the cost still to come in turn-equivalents (a model's ``k``), ``turn``
        the decision points so far, ``cost`` the cost so far; ``mean_cost`` the mean logged run
        cost of a model trained on one system, None for one trained across systems (per run).
        Floats or numpy arrays alike: the one-row decision and the trainer's replays share it.

        * λ: ``w = λ · (cost / turn) · K``;
        * a share s with ``mean_cost``: ``w = s / mean_cost · (cost / turn) · K``;
        * a share s per run: ``w = s · K / (turn + K)``, the share of this run's expected
          total cost still to come.
        """
        turns = np.maximum(turn, 1) if isinstance(turn, np.ndarray) else max(turn, 1)
        per_turn = cost / turns
        cost_to_go = per_turn * k_turns
        if self.lam is not None:
            return self.lam * cost_to_go, cost_to_go
        share = self.cost_share
        assert share is not None
        if mean_cost is not None:
            return share / mean_cost * cost_to_go if mean_cost > 0 else 0.0 * cost_to_go, cost_to_go
        return share * k_turns / (turns + k_turns), cost_to_go

    def describe(self) -> str:
        """In words: ``cost share 0.3`` or ``lambda 0.2 per ktokens``."""
        if self.lam is not None:
            return f"lambda {self.lam:g}" + (f" per {self.unit}" if self.unit else "")
        return f"cost share {self.cost_share:g}"


#: What cost is worth when nothing says otherwise: a whole run costs 30% of a success.
DEFAULT_OBJECTIVE: Final = Objective(cost_share=DEFAULT_COST_SHARE)


# --------------------------------------------------------------------------- costs by unit


def cost_so_far(state: RunState, unit: CostUnit | str) -> float:
    """A run's cost so far in ``unit``: thousands of tokens, dollars, or seconds elapsed."""
    if unit == "usd":
        return state.usd
    if unit == "seconds":
        return state.elapsed
    if unit == "ktokens":
        return state.tokens / 1000.0
    raise ConfigError(f"cost unit {unit!r} is not one of {', '.join(COST_UNITS)}")


def event_cost(unit: CostUnit | str, *, tokens: float, usd: float, seconds: float) -> float:
    """One event's cost in ``unit``, from its tokens, its dollars and the seconds it took."""
    if unit == "usd":
        return usd
    if unit == "seconds":
        return seconds
    if unit == "ktokens":
        return tokens / 1000.0
    raise ConfigError(f"cost unit {unit!r} is not one of {', '.join(COST_UNITS)}")


def cost_budget(unit: CostUnit | str, cap: float) -> tuple[str, float]:
    """A cost cap in ``unit`` as a safety-config budget: ``(key, value)``, e.g. ``("max_tokens", 1500)``.

    A cap in thousands of tokens becomes whole tokens, rounded up (a cap fires at ``>=``).
    """
    if unit == "usd":
        return "max_usd", cap
    if unit == "seconds":
        return "max_seconds", cap
    if unit == "ktokens":
        return "max_tokens", math.ceil(cap * 1000.0 - 1e-9)
    raise ConfigError(f"cost unit {unit!r} has no safety-net budget")
