"""The trainer → server contract: :class:`Manifest`, what a model directory's ``manifest.json`` says.

Everything a served policy reads from a model directory is a typed field here, under one
name per setting; a key the format does not know is an error naming it (``margin:
unknown field (did you mean 'margins'?)``), so a mistyped key can never silently change
what is served. Format ``stopserve.model/2`` (:data:`MODEL_FORMAT`) is written; format
``stopserve.model/1`` is read and converted (:meth:`Manifest.from_data`), deciding as it
did.

What a policy serves, by field (``docs/training.md``, "The manifest"):

* ``kind`` (``model``, ``heuristic``, ``none``), ``method`` (``behavior``, ``optimal``: which
  boosters V reads), ``models`` (each booster's file, target and ``transform``);
* ``cost_unit`` (``ktokens``, ``usd``, ``seconds``): what the model's costs are counted in;
  ``objective``: what cost is worth when a request names nothing
  (:class:`~stopserve.objective.Objective`, per ``cost_unit``; for ``optimal``, also what
  booster ``c`` was fitted at); ``cost_scale``: ``fixed`` (a share resolved with the mean
  logged run cost ``mean_behavior_cost``) or ``per_run`` (a share of each run's own
  expected cost);
* ``safety``: the nets and rules served when a request gives none (budgets never looser
  than :data:`~stopserve.safety.DEFAULT_SAFETY`'s); ``base_rule``: the tuned heuristic the
  policy starts from (``name``, ``text``, ``config``); ``proposals``: whether a proposed
  stop is a rule; ``overrules``: the rule kinds the model may overrule;
* ``gates``, one name each for what ``min_turns`` meant three times in format 1:
  ``veto_min_turns`` (before it only a budget or the loop detector may stop a run: the
  served safety config's ``min_turns``), ``model_min_turns`` (the model stops a run on its
  own from this turn), ``reward_rule_min_turns`` (the base rule's reward threshold fires
  from this turn);
* ``margins`` (``stop``, ``continue``; ``null``: never deviate from the base rule),
  ``stop_on`` (``value``, or ``evidence``: only where the run shows a stall, with the
  ``evidence`` thresholds);
* ``feature_names`` (checked against this featurizer), ``files`` (sha256 of every file).

Report-only sections (``guard``, ``cv``, ``training_data``, ``feature_importance``,
``params``, ``notes``, ``heuristic``, ...) are any JSON; no decision reads them.

>>> m = Manifest.from_data({"format": "stopserve.model/2", "kind": "none"})
>>> m.gates.veto_min_turns, m.cost_unit
(1, 'ktokens')
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    model_validator,
)

from stopserve.errors import ConfigError, Issue, ModelIntegrityError, pydantic_issues
from stopserve.evidence import DEFAULT_EVIDENCE, Evidence
from stopserve.objective import CostUnit, Objective
from stopserve.safety import BUDGET_NETS, DEFAULT_SAFETY, SafetyConfig

__all__ = [
    "LEGACY_OVERRULES",
    "MAX_VERSION_CHARS",
    "MODEL_FORMAT",
    "MODEL_FORMAT_V1",
    "RULE_KINDS",
    "BaseRule",
    "CostScale",
    "Gates",
    "Manifest",
    "Margins",
    "ModelEntry",
]

#: The format written.
MODEL_FORMAT: Final = "stopserve.model/2"
#: The previous format, read and converted.
MODEL_FORMAT_V1: Final = "stopserve.model/1"
#: Characters of a model version: it is written into every decision line.
MAX_VERSION_CHARS: Final = 256
#: Kinds of rule a learned model may overrule: the safety config's loop detector and
#: ``quality_met``, the policy's base rule, the orchestrator's proposed stop.
RULE_KINDS: Final[tuple[str, ...]] = ("loop", "quality_met", "rule", "proposed")
#: What a format-1 manifest without ``overrules`` may overrule (models trained before the
#: nets/rules split: their loop detector and ``quality_met`` always won).
LEGACY_OVERRULES: Final = ("proposed", "rule")

Kind = Literal["model", "heuristic", "none"]
Method = Literal["behavior", "optimal", "heuristic", "none"]
RuleKind = Literal["loop", "quality_met", "rule", "proposed"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True)


def _objective(value: Any) -> Any:
    if value is None or isinstance(value, Objective):
        return value
    try:
        return Objective.from_dict(value)
    except ConfigError as exc:
        first = exc.issues[0] if exc.issues else None
        raise ValueError(exc.message if first is None else f"{first.path}: {first.message}") from None


def _evidence(value: Any) -> Any:
    return value if value is None or isinstance(value, Evidence) else Evidence.from_dict(value)


#: An objective as a manifest field: ``{"cost_share": 0.3, "unit": "ktokens"}``.
ObjectiveField = Annotated[
    Objective, BeforeValidator(_objective), PlainSerializer(lambda o: o.to_dict(), return_type=dict)
]
#: The stall evidence a model that stops on evidence needs: ``{"repeat": 3, ...}``.
EvidenceField = Annotated[
    Evidence, BeforeValidator(_evidence), PlainSerializer(lambda e: e.to_dict(), return_type=dict)
]


class CostScale(_Strict):
    """How a cost share becomes a weight: ``fixed`` (λ = share / ``mean_behavior_cost``, the mean
    logged run cost of the one system trained on) or ``per_run`` (a share of each run's own
    expected total cost: for systems not seen in training)."""

    kind: Literal["fixed", "per_run"]
    mean_behavior_cost: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _mean_iff_fixed(self) -> CostScale:
        if self.kind == "fixed" and self.mean_behavior_cost is None:
            raise ValueError("a fixed cost scale states its mean_behavior_cost")
        if self.kind == "per_run" and self.mean_behavior_cost is not None:
            raise ValueError("a per_run cost scale has no mean_behavior_cost")
        return self


class Margins(_Strict):
    """How far V must go before a learned policy leaves its base rule; ``null``: never."""

    stop: float | None = None
    continue_: float | None = Field(default=None, alias="continue")

    @property
    def stop_at(self) -> float:
        """The stop margin (``inf``: the model never stops a run on its own)."""
        return math.inf if self.stop is None else self.stop

    @property
    def continue_at(self) -> float:
        """The continue margin (``inf``: the model never overrules a rule)."""
        return math.inf if self.continue_ is None else self.continue_


class Gates(_Strict):
    """The turn gates of a policy, one name each (format 1 called all three ``min_turns``)."""

    #: before this turn only a budget or the loop detector may stop a run (model, proposed and
    #: quality stops are vetoed): the served safety config's ``min_turns``
    veto_min_turns: int = Field(default=1, ge=0)
    #: the model stops a run on its own from this turn on
    model_min_turns: int = Field(default=0, ge=0)
    #: the base rule's reward threshold fires from this turn on (its config's ``min_turns``)
    reward_rule_min_turns: int = Field(default=1, ge=0)


class BaseRule(_Strict):
    """The tuned heuristic a policy starts from: its caps and reward threshold as a safety config.

    A cap the config does not state is off (unlike a safety config, whose budgets default on).
    """

    name: str | None = None
    text: str | None = None
    config: SafetyConfig


class ModelEntry(_Strict):
    """One booster of a model directory."""

    file: str | None = None
    target: str | None = None
    #: the LightGBM objective it was fitted with (report only)
    objective: str | None = None
    #: how its raw score is read: ``sigmoid`` for a probability-like target, else ``identity``
    transform: Literal["identity", "sigmoid"] = "identity"
    rounds: int | None = Field(default=None, ge=0)


_Json = dict[str, Any] | None
_M = TypeVar("_M", bound=BaseModel)


class _Report(_Strict):
    """The sections no decision reads (both formats): figures, provenance, notes; loosely typed."""

    guard: _Json = None
    training_data: _Json = None
    cv: _Json = None
    feature_importance: _Json = None
    params: _Json = None
    heuristic: _Json = None
    labels_from_rewards: bool | None = None
    group_by: str | None = None
    censored: str | None = None
    notes: list[str] | None = None
    promoted_by: str | None = None
    libraries: dict[str, str] | None = None
    files: dict[str, str] = Field(default_factory=dict)


#: The report fields, in the order they are written (after every served one).
_REPORT_FIELDS: Final = tuple(_Report.model_fields)


class Manifest(_Report):
    """A model directory's manifest (format ``stopserve.model/2``); see the module docstring.

    Build one with :meth:`from_data` (JSON data of either format) or the constructor;
    :meth:`to_dict` is the JSON written. Frozen: :meth:`updated` gives a changed copy.
    """

    format: Literal["stopserve.model/2"] = MODEL_FORMAT
    kind: Kind = "model"
    method: Method = "none"
    model_version: str | None = Field(default=None, max_length=MAX_VERSION_CHARS)
    created: str | None = None
    cost_unit: CostUnit = "ktokens"
    objective: ObjectiveField | None = None
    cost_scale: CostScale = CostScale(kind="per_run")
    gates: Gates = Gates()
    safety: SafetyConfig | None = None
    base_rule: BaseRule | None = None
    proposals: Literal["accept", "refuse"] = "accept"
    overrules: tuple[RuleKind, ...] = ()
    stop_on: Literal["value", "evidence"] = "value"
    evidence: EvidenceField | None = None
    margins: Margins = Margins()
    models: dict[str, ModelEntry] = Field(default_factory=dict)
    feature_names: list[str] | None = None
    features_used: list[str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _gates_into_configs(cls, data: Any) -> Any:
        # the file holds each gate once, under gates; the configs it belongs to get it here
        if not isinstance(data, dict):
            return data
        raw_gates = data.get("gates")
        gates: dict[str, Any] = raw_gates if isinstance(raw_gates, dict) else {}
        data = dict(data)
        # the objective is per the model's cost unit (written once, as cost_unit)
        unit = data.get("cost_unit", "ktokens")
        objective = data.get("objective")
        if isinstance(objective, dict) and "unit" not in objective:
            data["objective"] = {**objective, "unit": unit}
        elif isinstance(objective, Objective) and objective.unit is None and isinstance(unit, str):
            data["objective"] = Objective(lam=objective.lam, cost_share=objective.cost_share, unit=unit)  # type: ignore[arg-type]
        safety = data.get("safety")
        if isinstance(safety, dict):
            if "min_turns" in safety:
                raise ValueError("safety.min_turns: format /2 holds it once, as gates.veto_min_turns")
            data["safety"] = {**safety, "min_turns": gates.get("veto_min_turns", 1)}
        rule = data.get("base_rule")
        if isinstance(rule, dict) and isinstance(rule.get("config"), dict):
            config = rule["config"]
            if "min_turns" in config:
                raise ValueError(
                    "base_rule.config.min_turns: format /2 holds it once, as gates.reward_rule_min_turns"
                )
            config = {
                **dict.fromkeys(BUDGET_NETS),
                **config,
                "min_turns": gates.get("reward_rule_min_turns", 1),
            }
            data["base_rule"] = {**rule, "config": config}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        if self.kind == "model" and self.method not in ("behavior", "optimal"):
            raise ValueError(f"method: expected behavior or optimal for a learned model, got {self.method!r}")
        if self.safety is not None and self.safety.min_turns != self.gates.veto_min_turns:
            raise ValueError(
                f"gates.veto_min_turns ({self.gates.veto_min_turns}) differs from the safety config's "
                f"min_turns ({self.safety.min_turns}): they are one setting"
            )
        if self.base_rule is not None and self.base_rule.config.min_turns != self.gates.reward_rule_min_turns:
            raise ValueError(
                f"gates.reward_rule_min_turns ({self.gates.reward_rule_min_turns}) differs from the base "
                f"rule's min_turns ({self.base_rule.config.min_turns}): they are one setting"
            )
        if self.objective is not None and self.objective.unit != self.cost_unit:
            raise ValueError(
                f"objective.unit: {self.objective.unit} differs from the model's cost_unit {self.cost_unit}"
            )
        return self

    # ------------------------------------------------------------------ reading

    @classmethod
    def from_data(cls, data: Any, *, source: str = "manifest.json") -> Manifest:
        """A manifest from JSON data of format 2, or format 1 (converted: it decides as it did).

        ``source`` names the file in errors: :class:`~stopserve.errors.ModelIntegrityError`
        with one located issue per problem (``manifest.json: margins.stop: ...``).
        """
        if isinstance(data, Manifest):
            return data
        if not isinstance(data, Mapping):
            raise ModelIntegrityError(f"{source}: must hold a JSON object")
        fmt = data.get("format")
        if fmt == MODEL_FORMAT_V1:
            return _from_v1(dict(data), source)
        if fmt != MODEL_FORMAT:
            raise ModelIntegrityError(
                f"{source}: format: expected {MODEL_FORMAT!r} (or {MODEL_FORMAT_V1!r}), got {fmt!r}",
                [Issue(f"expected {MODEL_FORMAT!r}, got {fmt!r}", file=source, path="format")],
            )
        return _validate(cls, dict(data), source)

    def updated(self, **changes: Any) -> Manifest:
        """A copy with ``changes`` (field values), validated anew."""
        data = {name: getattr(self, name) for name in type(self).model_fields}
        data.update(changes)
        return type(self).model_validate(data)

    # ------------------------------------------------------------------ what a policy reads

    @property
    def served_evidence(self) -> Evidence:
        """The stall thresholds a model that stops on evidence applies."""
        return DEFAULT_EVIDENCE if self.evidence is None else self.evidence

    def nets(self) -> SafetyConfig:
        """The safety config served when a request gives none: this manifest's, budgets never
        looser than :data:`~stopserve.safety.DEFAULT_SAFETY`'s (its rules as tuned)."""
        own = self.safety
        if own is None:
            return DEFAULT_SAFETY
        caps = {
            key: min(v for v in (getattr(own, key), getattr(DEFAULT_SAFETY, key)) if v is not None)
            for key in BUDGET_NETS
            if getattr(own, key) is not None or getattr(DEFAULT_SAFETY, key) is not None
        }
        return own.replace(**caps)

    # ------------------------------------------------------------------ writing

    def to_dict(self) -> dict[str, Any]:
        """The JSON written to ``manifest.json`` (each gate once, under ``gates``)."""
        out: dict[str, Any] = {}
        served = [n for n in type(self).model_fields if n not in _REPORT_FIELDS]
        for name in (*served, *_REPORT_FIELDS):
            value = getattr(self, name)
            if name == "margins":
                out[name] = {"stop": value.stop, "continue": value.continue_}
            elif value is None:
                continue
            elif name == "safety":
                out[name] = _without_min_turns(value.to_dict())
            elif name == "base_rule":
                rule = {
                    "name": value.name,
                    "text": value.text,
                    "config": _without_min_turns(value.config.to_dict()),
                }
                out[name] = {k: v for k, v in rule.items() if v is not None}
            elif name == "overrules":
                out[name] = list(value)
            elif isinstance(value, BaseModel):
                out[name] = value.model_dump(mode="json", by_alias=True, exclude_none=True)
            elif name == "models":
                out[name] = {k: e.model_dump(mode="json", exclude_none=True) for k, e in value.items()}
            elif name == "objective":
                out[name] = {k: v for k, v in value.to_dict().items() if k != "unit"}
            elif name == "evidence":
                out[name] = value.to_dict()
            else:
                out[name] = value
        return out


def _without_min_turns(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != "min_turns"}


# --------------------------------------------------------------------------- validation


def _validate(model: type[_M], data: dict[str, Any], source: str) -> _M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        issues = _issues(model, exc, source)
        raise _integrity(source, issues) from None


def _integrity(source: str, issues: list[Issue]) -> ModelIntegrityError:
    n = len(issues)
    return ModelIntegrityError(f"{source}: invalid manifest ({n} problem{'s' if n != 1 else ''})", issues)


_UNION_TAGS: Final = frozenset(
    {"SafetyConfig", "LoopConfig", "list[SafetyConfig]", "int", "float", "str", "bool"}
)


def _issues(model: type[BaseModel], exc: ValidationError, source: str) -> list[Issue]:
    """Pydantic's errors as located issues; an unknown key names the known one it likely misspells."""
    errors = exc.errors(include_url=False)
    issues = pydantic_issues(errors, file=source, skip=_UNION_TAGS)
    out: list[Issue] = []
    for err, issue in zip(errors, issues, strict=True):
        loc = err.get("loc", ())
        near = None
        if err.get("type") == "extra_forbidden" and loc:
            near = difflib.get_close_matches(str(loc[-1]), _known_keys(model, loc[:-1]), n=1, cutoff=0.75)
        hint = f"unknown field (did you mean {near[0]!r}?)" if near else None
        out.append(issue if hint is None else Issue(hint, file=source, path=issue.path))
    return out


def _known_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names (by alias) of the model at ``loc`` under ``model``, as far as it can be followed."""
    current: Any = model
    for part in loc:
        fields = getattr(current, "model_fields", None)
        if fields is None or part not in fields:
            return []
        annotation = fields[part].annotation
        current = next(
            (
                a
                for a in getattr(annotation, "__args__", (annotation,))
                if isinstance(a, type) and issubclass(a, BaseModel)
            ),
            None,
        )
    fields = getattr(current, "model_fields", None) or {}
    return [f.alias or name for name, f in fields.items()]


# --------------------------------------------------------------------------- format 1


class _V1Objective(_Strict):
    lam: float | None = Field(default=None, alias="lambda")
    cost_share: float | None = None


class _V1CostScale(_Strict):
    kind: str | None = None
    mean_behavior_cost: float | None = None


def _whole(value: Any) -> Any:
    # format 1 read min_turns as int(number): a whole float is fine, a fraction is not
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class _ManifestV1(_Report):
    """Format ``stopserve.model/1`` as it was read: every field a served decision used, typed."""

    format: Literal["stopserve.model/1"]
    kind: Kind = "model"
    method: Method = "none"
    cost_unit: CostUnit | None = None
    cost_scale: _V1CostScale | None = None
    default_lambda: float | None = Field(default=None, ge=0)
    default_cost_share: float | None = Field(default=None, ge=0)
    objective: _V1Objective | None = None
    safety: dict[str, Any] | None = None
    rule: dict[str, Any] | None = None
    rule_name: str | None = None
    rule_text: str | None = None
    proposals: Literal["accept", "refuse"] = "accept"
    overrules: list[RuleKind] | None = None
    stop_on: Literal["value", "evidence"] = "value"
    evidence: EvidenceField | None = None
    margins: Margins | None = None
    min_turns: Annotated[int, BeforeValidator(_whole), Field(ge=0)] | None = None
    models: dict[str, ModelEntry] = Field(default_factory=dict)
    feature_names: list[str] | None = None
    features_used: list[str] | None = None
    model_version: str | None = Field(default=None, max_length=MAX_VERSION_CHARS)
    created: str | None = None
    #: how decisions were computed (a served policy's copy, never read)
    inference: _Json = None


def _from_v1(data: dict[str, Any], source: str) -> Manifest:
    """A format-1 manifest as format 2: the same decisions, each setting under one name."""
    v1: _ManifestV1 = _validate(_ManifestV1, data, source)
    unit: CostUnit = v1.cost_unit or "ktokens"
    default: Objective | None = None
    if v1.default_cost_share is not None:
        default = Objective(cost_share=v1.default_cost_share, unit=unit)
    elif v1.default_lambda is not None:
        default = Objective(lam=v1.default_lambda, unit=unit)
    mean = None if v1.cost_scale is None else v1.cost_scale.mean_behavior_cost
    trained = v1.objective
    if v1.method == "optimal" and not _same_weight(trained, default, mean):
        raise _integrity(
            source,
            [
                Issue(
                    "differs from default_lambda / default_cost_share: booster c of method optimal is read "
                    "at the objective it was fitted for, which format /2 holds once",
                    file=source,
                    path="objective",
                )
            ],
        )
    safety: SafetyConfig | None = None
    try:
        if v1.safety is not None:
            safety = SafetyConfig.from_dict(v1.safety, source=f"{source}: safety")
            if v1.overrules is None:
                # before the nets/rules split a manifest's safety could only add to the defaults
                safety = DEFAULT_SAFETY.tightened_by(safety)
        base: BaseRule | None = None
        if v1.rule is not None:
            config = SafetyConfig.from_dict(
                {**dict.fromkeys(BUDGET_NETS), **v1.rule}, source=f"{source}: rule"
            )
            base = BaseRule(name=v1.rule_name, text=v1.rule_text, config=config)
    except ConfigError as exc:
        raise ModelIntegrityError(str(exc), exc.issues) from None
    scale = CostScale(kind="per_run") if mean is None else CostScale(kind="fixed", mean_behavior_cost=mean)
    kept = (*_REPORT_FIELDS, "model_version", "created", "feature_names", "features_used", "models")
    report = {k: getattr(v1, k) for k in kept}
    fields: dict[str, Any] = {
        "kind": v1.kind,
        "method": v1.method,
        "cost_unit": unit,
        "objective": default,
        "cost_scale": scale,
        "gates": Gates(
            veto_min_turns=1 if safety is None else safety.min_turns,
            model_min_turns=v1.min_turns or 0,
            reward_rule_min_turns=1 if base is None else base.config.min_turns,
        ),
        "safety": safety,
        "base_rule": base,
        "proposals": v1.proposals,
        "overrules": tuple(LEGACY_OVERRULES if v1.overrules is None else sorted(set(v1.overrules))),
        "stop_on": v1.stop_on,
        "evidence": v1.evidence,
        "margins": v1.margins or Margins(),
        **report,
    }
    return _validate(Manifest, fields, source)


def _same_weight(trained: _V1Objective | None, default: Objective | None, mean: float | None) -> bool:
    """Whether format 1's training objective and its default weigh cost alike (w = w0)."""
    lam0 = None if trained is None else trained.lam
    share0 = None if trained is None else trained.cost_share
    lam1 = None if default is None else default.lam
    share1 = None if default is None else default.cost_share
    if (lam0, share0) == (lam1, share1):
        return True
    if lam0 is None and share0 is None:
        return False
    if mean is None:  # per run: a share weighs differently from any λ
        return lam0 == lam1 and share0 == share1

    def per_unit(lam: float | None, share: float | None) -> float:
        return lam if lam is not None else (share or 0.0) / mean if mean > 0 else 0.0

    a, b = per_unit(lam0, share0), per_unit(lam1, share1)
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
