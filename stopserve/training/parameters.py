"""The trainer's settings, each declared once: name, type, default, constraint, help.

:data:`TRAINER_PARAMETERS` is the table (scikit-learn's ``_parameter_constraints``, with
the default and the help beside each constraint). ``stopserve train`` and ``stopserve
retrain`` generate their options from it (:mod:`stopserve.cli.train`), and
:class:`TrainerSettings` checks its values against it, so a flag, its default and what
the library accepts cannot drift apart. The values are spelled as the options spell
them (``min_turns="auto"``, ``rules="fixed"``); :meth:`PolicyLearner.from_settings
<stopserve.training.fit.PolicyLearner.from_settings>` turns them into an estimator.

This module imports nothing heavy: the command line reads it to build its parser.

>>> TrainerSettings(folds=3).folds
3
>>> TrainerSettings(folds=0)
Traceback (most recent call last):
...
stopserve.errors.TrainingError: folds must be a whole number >= 1, got 0
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Final, Literal

from stopserve.errors import TrainingError

if TYPE_CHECKING:
    from stopserve.evidence import Evidence
    from stopserve.objective import Objective

__all__ = [
    "DEFAULT_SUCCESS_FLOOR",
    "GROUP_BY",
    "TRAINER_PARAMETERS",
    "AutoOr",
    "Constraint",
    "Interval",
    "OneOf",
    "Parameter",
    "TrainerSettings",
    "check_parameter",
    "parameter",
]

#: what cross-validation folds never split (``stopserve.training.labels`` groups by these)
GROUP_BY: Final[tuple[str, ...]] = ("task", "repo", "system", "dataset")
#: the success floor on by default: no shipped policy loses more than one point of success
DEFAULT_SUCCESS_FLOOR: Final = 0.01


@dataclass(frozen=True)
class Interval:
    """A number of ``kind`` in ``[low, high]`` (``high`` None: no upper end)."""

    kind: type[int] | type[float]
    low: float
    high: float | None = None

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` (None: nothing)."""
        whole = self.kind is int
        if isinstance(value, bool) or not isinstance(value, int if whole else int | float):
            return f"must be a {'whole ' if whole else ''}number"
        if not (math.isfinite(value) and value >= self.low and (self.high is None or value <= self.high)):
            what = f"a whole number >= {self.low:g}" if whole else f"a number >= {self.low:g}"
            return f"must be {what}" + (f" and <= {self.high:g}" if self.high is not None else "")
        return None


@dataclass(frozen=True)
class OneOf:
    """One of ``options``."""

    options: tuple[str, ...]

    def problem(self, value: Any) -> str | None:
        if value in self.options:
            return None
        *head, last = self.options
        return f"must be {', '.join(head)} or {last}"


@dataclass(frozen=True)
class AutoOr:
    """``"auto"`` or a value ``number`` accepts."""

    number: Interval

    def problem(self, value: Any) -> str | None:
        if value == "auto":
            return None
        wrong = self.number.problem(value)
        return None if wrong is None else f"{wrong.removesuffix('.')} or auto"


Constraint = Interval | OneOf | AutoOr


@dataclass(frozen=True)
class Parameter:
    """One trainer setting: the field of :class:`TrainerSettings` and the option ``flag``."""

    #: the field's name, and the option's destination
    name: str
    #: ``int``, ``float``, ``str``, ``bool`` (an on/off switch) or ``"evidence"`` (three whole numbers)
    type: type[int] | type[float] | type[str] | type[bool] | Literal["evidence"]
    default: Any
    #: what a value must be (None: anything of ``type``; the estimator checks the rest)
    constraint: Constraint | None
    help: str
    flag: str
    metavar: str | None = None
    #: parameters with the same tag exclude each other (at most one is given)
    exclusive: str | None = None

    def problem(self, value: Any) -> str | None:
        """``"folds must be ..., got 0"``, or None when ``value`` is allowed (None always is for
        a parameter whose default is None: it means "not given")."""
        if value is None and self.default is None:
            return None
        if self.type is bool:
            wrong = None if isinstance(value, bool) else "must be True or False"
        elif self.constraint is not None:
            wrong = self.constraint.problem(value)
        elif self.type == "evidence":
            wrong = None if _is_evidence(value) else "must be an Evidence"
        else:
            assert not isinstance(self.type, str)
            wrong = None if isinstance(value, self.type) else f"must be a {self.type.__name__}"
        return None if wrong is None else f"{self.name} {wrong}, got {value!r}"


def _is_evidence(value: Any) -> bool:
    from stopserve.evidence import Evidence

    return isinstance(value, Evidence)


_COST_SCALE_HELP: Final = (
    "fixed: lambda from these traces' mean cost (a model for this system); per-run: costs "
    "normalised per data set and, served, each run's own expected cost (a model for systems it has "
    "not seen, e.g. the shipped default). Default: fixed"
)

#: the settings of ``stopserve train`` and ``stopserve retrain``, in the order ``--help`` lists them
TRAINER_PARAMETERS: Final[tuple[Parameter, ...]] = (
    Parameter(
        "lam",
        float,
        None,
        Interval(float, 0),
        "absolute cost weight: quality units per cost unit (e.g. per thousand tokens)",
        "--lambda",
        exclusive="objective",
    ),
    Parameter(
        "cost_share",
        float,
        None,
        Interval(float, 0, 100),
        "what cost is worth as a share: 0.3 = a whole behavior run costs 30% of a success "
        "(resolved to lambda from the traces' mean cost). Default when neither is given: 0.3",
        "--cost-share",
        exclusive="objective",
    ),
    Parameter("cost_scale", str, "fixed", OneOf(("fixed", "per-run")), _COST_SCALE_HELP, "--cost-scale"),
    Parameter(
        "method",
        str,
        "auto",
        OneOf(("auto", "behavior", "optimal")),
        "value of continuing: behavior (to the logged end), optimal (fitted backward induction) "
        "or auto (chosen in cross-validation). Default: auto",
        "--method",
    ),
    Parameter(
        "min_turns",
        int,
        "auto",
        AutoOr(Interval(int, 1)),
        "no model stop before this decision point; auto tunes 1, 2 or 3 in cross-validation. Default: auto",
        "--min-turns",
    ),
    Parameter(
        "features",
        str,
        "all",
        None,
        "all, scale-free (no absolute sizes or topology: transfers across systems) or a comma "
        "list of names (docs/features.md). Default: all",
        "--features",
    ),
    Parameter("folds", int, 5, Interval(int, 1), "grouped cross-validation folds. Default: 5", "--folds"),
    Parameter(
        "group_by",
        str,
        "task",
        OneOf(GROUP_BY),
        "what cross-validation folds never split: task id, repository (SWE-bench ids), system "
        "(e.g. one model) or data set. Default: task",
        "--group-by",
    ),
    Parameter(
        "min_groups",
        int,
        10,
        Interval(int, 1),
        "fewer groups and the tuned heuristic ships (a guard cannot tell a model from luck). Default: 10",
        "--min-groups",
    ),
    Parameter(
        "rules",
        str,
        "tuned",
        OneOf(("tuned", "fixed")),
        "tuned: the heuristics may switch the loop detector and quality_met off and the model may "
        "overrule them where going on pays; fixed: they always stop a run (the shipped default). "
        "Default: tuned",
        "--rules",
    ),
    Parameter(
        "stop_on",
        str,
        "value",
        OneOf(("value", "evidence")),
        "value: the model stops a run where its value of going on is below the stop margin; "
        "evidence: only where the run also shows a stall (a repeat, nothing new, no better reward: "
        "docs/training.md; the shipped default). Default: value",
        "--stop-on",
    ),
    Parameter(
        "evidence",
        "evidence",
        None,
        None,
        "with --stop-on evidence: what counts as a stall: a loop pattern REPEAT times in a row, "
        "QUIET steps with nothing new, REWARD steps with no better reward (0 turns one off). Default: 2,3,4",
        "--evidence",
        metavar="REPEAT,QUIET,REWARD",
    ),
    Parameter(
        "max_value_loss",
        float,
        0.0,
        Interval(float, 0),
        "tune margins and choose the heuristic family so that, in every data set (--group-by "
        "dataset: every system), the cross-validated mean value falls at most X below the logged "
        "runs', and ship a learned model only if it does too (0: off). Default: off",
        "--max-value-loss",
        metavar="X",
    ),
    Parameter(
        "max_success_loss",
        float,
        DEFAULT_SUCCESS_FLOOR,
        Interval(float, 0),
        "likewise for the mean quality handed back: no policy, learned or heuristic, that loses "
        "more than X of success in cross-validation ships (0.01: one point; 0: off). Default: 0.01",
        "--max-success-loss",
        metavar="X",
    ),
    Parameter(
        "strict_floor",
        bool,
        False,
        None,
        "keep --max-success-loss whatever is saved: without it, a policy losing more ships where "
        "the value it gains pays for the loss twice over (it would still beat the logged runs were "
        "cost worth half as much); for a model meant for systems it has never seen",
        "--strict-floor",
    ),
    Parameter(
        "inner_cv",
        bool,
        False,
        None,
        "tune each fold's margins on all its training groups by nested cross-fitting, not on a "
        "held-out quarter of them (slower; for few groups, e.g. a model across systems)",
        "--inner-cv",
    ),
    Parameter(
        "censored",
        str,
        "auto",
        OneOf(("auto", "horizon", "unknown")),
        "runs that ended at a cap: horizon (the cap is your system's own end) or unknown (what "
        "going on would have gained is unknown: they do not train the gain of going on); auto is "
        "unknown with --cost-scale per-run, else horizon. Default: auto",
        "--censored",
    ),
    Parameter("seed", int, 0, None, "Default: 0", "--seed"),
)
_BY_NAME: Final = {p.name: p for p in TRAINER_PARAMETERS}


def parameter(name: str) -> Parameter:
    """The table's entry ``name`` (a KeyError names an unknown one)."""
    return _BY_NAME[name]


def check_parameter(name: str, value: Any) -> None:
    """Raise :class:`TrainingError` in the parameter's words when ``value`` is not allowed."""
    wrong = _BY_NAME[name].problem(value)
    if wrong is not None:
        raise TrainingError(wrong)


def _default(name: str) -> Any:
    return _BY_NAME[name].default


@dataclass(frozen=True, kw_only=True)
class TrainerSettings:
    """The trainer's settings as the options spell them; each default is the table's.

    Checked against :data:`TRAINER_PARAMETERS` on construction (a :class:`TrainingError`
    names the setting). ``max_value_loss`` / ``max_success_loss`` 0 turn that floor off.
    """

    lam: float | None = _default("lam")
    cost_share: float | None = _default("cost_share")
    cost_scale: str = _default("cost_scale")
    method: str = _default("method")
    min_turns: int | Literal["auto"] = _default("min_turns")
    features: str = _default("features")
    folds: int = _default("folds")
    group_by: str = _default("group_by")
    min_groups: int = _default("min_groups")
    rules: str = _default("rules")
    stop_on: str = _default("stop_on")
    evidence: Evidence | None = _default("evidence")  # noqa: RUF009 - the table's (None), not a call per instance
    max_value_loss: float = _default("max_value_loss")
    max_success_loss: float = _default("max_success_loss")
    strict_floor: bool = _default("strict_floor")
    inner_cv: bool = _default("inner_cv")
    censored: str = _default("censored")
    seed: int = _default("seed")

    def __post_init__(self) -> None:
        for f in fields(self):
            check_parameter(f.name, getattr(self, f.name))
        if self.lam is not None and self.cost_share is not None:
            raise TrainingError("give lam or cost_share, not both")

    def objective(self) -> Objective | None:
        """The objective these settings name (None: the trainer's default)."""
        from stopserve.objective import Objective

        return Objective.of(self.lam, self.cost_share)

    def feature_names(self) -> str | list[str]:
        """``"all"``, ``"scale-free"`` or the listed names."""
        if self.features in ("all", "scale-free"):
            return self.features
        return [f.strip() for f in self.features.split(",") if f.strip()]
