"""The stop policy: the one-row decision and its vectorised twin, side by side.

:meth:`Policy.decide` answers continue or stop after the events folded into a
:class:`~stopserve.features.RunState`; :func:`stop_mask` says where the same policy stops
on many decision points at once (the trainer's searches and replays). Both follow one rule
order, and both read a learned model's part of it from one :class:`Deviation`:

1. **Nets** (the budgets of the :class:`~stopserve.safety.SafetyConfig` in force, and the
   run's own budget) fire first and always win.
2. **Rules**: the config's loop detector, the orchestrator's own verdict (its progress
   ledger, a rule of kind ``loop``) and ``quality_met`` (the quality target), the
   policy's **base rule** (a tuned heuristic: turn cap, cost cap, reward threshold,
   stated as a ``SafetyConfig``) and a proposed stop from the orchestrator (unless the policy
   refuses proposals) say stop. A learned model overrules a rule whose kind its manifest
   lists in ``overrules`` (``loop``, ``quality_met``, ``rule``, ``proposed``) where it
   expects continuing to pay by more than the ``continue`` margin. Before the config's
   ``min_turns`` (the manifest's ``gates.veto_min_turns``) only budgets and the loop rules
   (the detector, the ledger) may stop a run.
3. **The model** stops a run no rule stops where the value of continuing is below minus
   the ``stop`` margin (from ``gates.model_min_turns`` on; for a model whose manifest says
   ``"stop_on": "evidence"``, only where the run itself shows a stall:
   :func:`stopserve.evidence.stall`).

With both margins infinite the policy IS its rules: the policy class contains every
heuristic the trainer tunes, so a learned policy can always fall back to the rule it
could have been (``docs/training.md``).

The value of continuing is ``V = G − w``: G ≈ E[q_T − q_t | s] is the quality the run
still gains if it goes on (model ``g``) and ``w`` what the rest of the run costs in
quality units, by the :class:`~stopserve.objective.Objective` in force
(:meth:`~stopserve.objective.Objective.weight`): the cost still to come is predicted in
*turn-equivalents* (model ``k``), so it transfers between systems whose runs cost 1k and
1M tokens. ``w`` rises with λ and with the cost share, so a stop never moves later when
cost weighs more (tested over random runs). ``method: optimal`` models carry C (the value
realised by the fitted backward-induction rule at their training objective) and S (the
quality handed back now): ``V = C − S − (w − w₀)`` with ``w₀`` the weight at the
manifest's objective.

>>> policy = Policy.safety_only()
>>> policy.kind
'none'
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

import numpy as np
import numpy.typing as npt

from stopserve.artifacts import ModelArtifact, load_model_dir, reads_features
from stopserve.decision import StopDecision
from stopserve.errors import ModelIntegrityError
from stopserve.evidence import DEFAULT_EVIDENCE, Evidence, stall
from stopserve.features import FEATURE_NAMES, RunState
from stopserve.inference import Forest
from stopserve.manifest import MODEL_FORMAT, Manifest
from stopserve.objective import Objective, cost_so_far
from stopserve.safety import DEFAULT_SAFETY, SafetyConfig, SafetyStop

__all__ = [
    "METHOD_MODELS",
    "Deviation",
    "Policy",
    "Rows",
    "RuleFires",
    "StopDecision",
    "split_fires",
    "stop_mask",
]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

#: The reason a model stop carries: the expected gain of continuing is below its cost.
MODEL_STOP_REASON: Final = "no_progress"
#: The reason when the orchestrator proposed the stop and the policy accepted it.
PROPOSED_STOP_REASON: Final = "information_complete"
#: Boosters each method reads (only these are evaluated per decision).
METHOD_MODELS: Final[dict[str, tuple[str, ...]]] = {"behavior": ("g", "k"), "optimal": ("c", "s", "k")}
#: What cost is worth when neither the request nor the model says: nothing.
_FREE: Final = Objective(lam=0.0)


# --------------------------------------------------------------------------- the rule order, shared


@dataclass(frozen=True, slots=True)
class Deviation:
    """Where a learned model departs from its rules: read alike by ``Policy.decide`` and :func:`stop_mask`.

    It keeps a run going through rules of the kinds in ``overrules`` (and only where every
    rule that fired is one) where ``V > margin_continue``; it stops a run no rule stops from
    turn ``min_turns`` on where ``V < −margin_stop`` (``on_evidence``: only where the run
    shows a stall). Infinite margins: the policy is its rules.
    """

    margin_stop: float = math.inf
    margin_continue: float = math.inf
    min_turns: int = 0
    overrules: frozenset[str] = frozenset()
    on_evidence: bool = False

    @classmethod
    def of(cls, manifest: Manifest) -> Deviation:
        """The deviation a manifest states: margins, ``gates.model_min_turns``, overrules, ``stop_on``."""
        return cls(
            margin_stop=manifest.margins.stop_at,
            margin_continue=manifest.margins.continue_at,
            min_turns=manifest.gates.model_min_turns,
            overrules=frozenset(manifest.overrules),
            on_evidence=manifest.stop_on == "evidence",
        )

    def keeps_going(self, v: Any) -> Any:
        """Where V clears the continue margin (a float or an array of them)."""
        return v > self.margin_continue

    def may_stop(self, v: Any, turn: Any) -> Any:
        """Where the model may stop a run on its value: past its gate, V below minus the stop margin."""
        return (turn >= self.min_turns) & (v < -self.margin_stop)


@dataclass(frozen=True)
class RuleFires:
    """Where each kind of rule of a policy fires, per row: the batch form of ``decide``'s rules.

    ``loop`` (the config's loop detector, never vetoed by ``min_turns``), ``quality`` (its
    ``quality_met``), ``rule`` (the base rule: caps, reward threshold) and ``proposed`` (a
    proposed stop the policy accepts); the last three only where ``min_turns`` allows a stop.
    """

    loop: BoolArray
    quality: BoolArray
    rule: BoolArray
    proposed: BoolArray

    def any(self, kinds: Sequence[str] = ("loop", "quality", "rule", "proposed")) -> BoolArray:
        """Where any of ``kinds`` fires."""
        out = np.zeros(self.loop.shape, dtype=bool)
        for kind in kinds:
            out |= getattr(self, kind)
        return out

    def by_kind(self) -> dict[str, BoolArray]:
        """Each rule kind (:data:`~stopserve.manifest.RULE_KINDS`) where it is the one ``decide`` names.

        As ``decide`` reads them: the config's ``quality_met`` counts only where its loop
        detector did not fire first.
        """
        return {
            "loop": self.loop,
            "quality_met": self.quality & ~self.loop,
            "rule": self.rule,
            "proposed": self.proposed,
        }


class Rows(Protocol):
    """What :func:`stop_mask` reads of the decision points (``training.labels.DecisionPoints`` has it)."""

    @property
    def net_stop(self) -> BoolArray:
        """Where a budget (a net) stops the run."""

    @property
    def allowed(self) -> BoolArray:
        """Where the veto's ``min_turns`` allows a stop."""

    @property
    def turn(self) -> IntArray:
        """The agent steps so far."""


def split_fires(fires: RuleFires, overrules: frozenset[str]) -> tuple[BoolArray, BoolArray]:
    """``(hard, soft)``: where a rule the model may not overrule fires, and where only rules it may."""
    n = fires.loop.shape[0]
    hard = np.zeros(n, dtype=bool)
    soft = np.zeros(n, dtype=bool)
    for kind, where in fires.by_kind().items():
        if kind in overrules:
            soft |= where
        else:
            hard |= where
    return hard, soft


def stop_mask(
    rows: Rows,
    v: FloatArray,
    fires: RuleFires,
    deviation: Deviation,
    *,
    stall: BoolArray | None = None,
) -> BoolArray:
    """Where the policy stops, every row at once: :meth:`Policy.decide`'s rule order in numpy.

    ``fires`` says where each of the policy's rules fires, ``v`` is the value of
    continuing, ``stall`` (needed for a deviation ``on_evidence``) where the run shows a
    stall. A row's flag is ``decide(...).action == "stop"`` at that decision point (tested
    over every rule order).
    """
    hard, soft = split_fires(fires, deviation.overrules)
    model = ~(hard | soft) & rows.allowed & deviation.may_stop(v, rows.turn)
    if deviation.on_evidence:
        if stall is None:
            raise ValueError("a deviation that stops on evidence needs where the runs stall")
        model &= stall
    return np.asarray(rows.net_stop | hard | (soft & ~deviation.keeps_going(v)) | model, dtype=bool)


def _logistic(z: Any) -> Any:
    """``1 / (1 + exp(-z))``, on arrays through numpy, on one number through ``math``."""
    if isinstance(z, np.ndarray):
        return 1.0 / (1.0 + np.exp(-z))
    try:
        return 1.0 / (1.0 + math.exp(-z))
    except OverflowError:  # exp(-z) is inf: numpy's answer
        return 0.0


# --------------------------------------------------------------------------- policy


class Policy:
    """A stop policy: safety nets, a base rule, a deviation and (optionally) learned boosters.

    Build it with :meth:`load`, :meth:`from_artifact`, :meth:`from_manifest` or
    :meth:`safety_only`; the constructor is internal.
    """

    kind: Literal["model", "heuristic", "none"]
    model_version: str | None
    safety: SafetyConfig
    rule: SafetyConfig | None
    manifest: Manifest

    def __init__(
        self,
        *,
        kind: Literal["model", "heuristic", "none"],
        safety: SafetyConfig,
        manifest: Manifest | None = None,
        rule: SafetyConfig | None = None,
        boosters: Mapping[str, Any] | None = None,
        texts: Mapping[str, str] | None = None,
        engine: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        m = manifest if manifest is not None else Manifest(kind="none")
        self.kind = kind
        self.safety = safety
        self.rule = rule
        self.manifest = m
        self.model_version = m.model_version
        self.rule_name: str | None = None if m.base_rule is None else m.base_rule.name
        self.cost_unit = m.cost_unit
        self.method: str = m.method
        #: what cost is worth when a request names nothing (None: nothing)
        self.objective: Objective | None = m.objective
        self.mean_behavior_cost = m.cost_scale.mean_behavior_cost
        # how each model's raw score becomes its value: "sigmoid" for a probability-like target
        # (cross-entropy objective), "identity" for a regression
        self._sigmoid: frozenset[str] = frozenset(n for n, e in m.models.items() if e.transform == "sigmoid")
        self.deviation = Deviation.of(m)
        self.accepts_proposals: bool = m.proposals == "accept"
        self.evidence: Evidence = m.served_evidence if m.stop_on == "evidence" else DEFAULT_EVIDENCE
        self._forest: Forest | None = None
        #: features the boosters read, when fewer than the featurizer's (an older featurizer's model)
        self._width: int | None = None
        self._index: dict[str, int] = {}
        self.boosters: dict[str, Any] = {}
        if kind == "model" and self.method not in METHOD_MODELS:
            raise ModelIntegrityError(
                f"method: expected one of {', '.join(METHOD_MODELS)} for a learned model, got {self.method!r}"
            )
        if boosters:
            needed = METHOD_MODELS[self.method]
            missing = [n for n in needed if n not in boosters]
            if missing:
                raise ModelIntegrityError(
                    f"method {self.method!r} needs models {', '.join(needed)}; missing {', '.join(missing)}"
                )
            # only the boosters the method reads are evaluated per decision
            # a model of an older featurizer reads the start of the vector (features are only appended)
            width = {b.num_feature() for b in boosters.values()}
            if len(width) != 1:
                raise ModelIntegrityError(f"the models read different numbers of features: {sorted(width)}")
            self._width = None if width == {len(FEATURE_NAMES)} else width.pop()
            self._forest = Forest(
                {n: boosters[n] for n in needed},
                len(FEATURE_NAMES) if self._width is None else self._width,
                texts=texts,
                engine=engine,
                cache_dir=cache_dir,
            )
            self._index = {n: i for i, n in enumerate(self._forest.names)}
            # every booster the model carries (e.g. S for a run's value), for offline readers
            self.boosters = dict(boosters)

    # ----------------------------------------------------------------- construction

    @classmethod
    def load(
        cls,
        model_dir: str | os.PathLike[str],
        *,
        engine: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> Policy:
        """Load and verify a model directory (sha256 of every file, feature names, the manifest).

        ``engine`` and ``cache_dir`` choose how single rows are evaluated and where
        compiled code is cached (:class:`stopserve.inference.Forest`; default
        ``$STOPSERVE_INFERENCE``, ``$STOPSERVE_CACHE_DIR``); :attr:`inference` says
        what was used.
        """
        return cls.from_artifact(load_model_dir(model_dir), engine=engine, cache_dir=cache_dir)

    @classmethod
    def from_artifact(
        cls,
        artifact: ModelArtifact,
        *,
        engine: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> Policy:
        """A policy from an already verified :class:`ModelArtifact`."""
        return cls.from_manifest(
            artifact.manifest, artifact.models, source=str(artifact.path), engine=engine, cache_dir=cache_dir
        )

    @classmethod
    def from_manifest(
        cls,
        manifest: Manifest | Mapping[str, Any],
        models: Mapping[str, str] | None = None,
        *,
        source: str = "model",
        engine: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> Policy:
        """A policy from a manifest (a :class:`Manifest`, or its JSON data: format 2 unless its
        ``format`` says ``stopserve.model/1``) and LightGBM model texts."""
        import lightgbm as lgb

        if not isinstance(manifest, Manifest):  # JSON data, format 2 unless it says otherwise
            manifest = {"format": MODEL_FORMAT, **manifest}
        m = Manifest.from_data(manifest, source=f"{source}/manifest.json")
        safety = m.nets()
        rule = None if m.base_rule is None else m.base_rule.config
        if m.kind != "model":
            return cls(kind=m.kind, safety=safety, manifest=m, rule=rule)
        boosters: dict[str, Any] = {}
        for name, text in (models or {}).items():
            try:
                booster = lgb.Booster(model_str=text)
            except Exception as exc:  # LightGBM raises its own error class on a bad text model
                raise ModelIntegrityError(f"{source}/{name}.txt: not a LightGBM model: {exc}") from None
            if not reads_features(booster.feature_name(), FEATURE_NAMES):
                raise ModelIntegrityError(
                    f"{source}/{name}.txt: its feature names differ from this stopserve's featurizer"
                )
            boosters[name] = booster
        if not boosters:
            raise ModelIntegrityError(f"{source}: kind is 'model' but it holds no models")
        try:
            return cls(
                kind="model",
                safety=safety,
                manifest=m,
                rule=rule,
                boosters=boosters,
                texts=models,
                engine=engine,
                cache_dir=cache_dir,
            )
        except ModelIntegrityError as exc:
            raise ModelIntegrityError(f"{source}: {exc}") from None

    @classmethod
    def safety_only(cls, safety: SafetyConfig | None = None) -> Policy:
        """A policy without a model or rule: only the safety nets (and proposed stops) decide."""
        return cls(kind="none", safety=safety if safety is not None else DEFAULT_SAFETY)

    # ----------------------------------------------------------------- the value of continuing

    def resolve(self, objective: Objective | None) -> Objective:
        """The objective a decision uses: the request's (per the model's cost unit), else the model's."""
        if objective is not None:
            # the request's unit is implied (the model's) unless it names another: then an error
            return objective if objective.unit is None else objective.in_unit(self.cost_unit)
        return self.objective if self.objective is not None else _FREE

    def values(
        self, raw: Mapping[str, Any], turn: Any, cost: Any, objective: Objective
    ) -> tuple[Any, Any, Any]:
        """``(V, cost_to_go, q_stop)`` from raw booster scores (floats or arrays) at ``objective``.

        The one definition of V: :meth:`decide` calls it on one row, the trainer's
        replays on many (``raw`` maps a model name to its raw score(s)).
        """
        k_turns = np.maximum(raw["k"], 0.0) if isinstance(raw["k"], np.ndarray) else max(raw["k"], 0.0)
        mean = self.mean_behavior_cost
        w, ctg = objective.weight(k_turns, turn, cost, mean_cost=mean)
        if self.method == "optimal":
            w0, _ = (self.objective or _FREE).weight(k_turns, turn, cost, mean_cost=mean)
            s = self._post("s", raw["s"])
            return raw["c"] - s - (w - w0), ctg, s
        return raw["g"] - w, ctg, None

    def _post(self, name: str, raw: Any) -> Any:
        return _logistic(raw) if name in self._sigmoid else raw

    def transformed(self, name: str, raw: Any) -> Any:
        """A booster's raw score(s) on its target's scale (``sigmoid`` or ``identity``, by the manifest)."""
        return self._post(name, raw)

    @property
    def inference(self) -> dict[str, Any] | None:
        """How decisions evaluate the boosters (engine, cache, why a fallback), or None without a model."""
        return None if self._forest is None else self._forest.info.to_dict()

    def raw_batch(self, X: FloatArray) -> dict[str, FloatArray]:  # noqa: N803
        """Raw scores of the boosters the method reads, for many feature rows."""
        out = self.raw_rows(X)
        return {name: out[:, i] for name, i in self._index.items()}

    def columns(self, X: FloatArray) -> FloatArray:  # noqa: N803
        """Feature rows (or one row) as the boosters read them: all of them, or their first values
        for a model of an older featurizer (features are only appended)."""
        return X if self._width is None else X[..., : self._width]

    def raw_rows(self, X: FloatArray) -> FloatArray:  # noqa: N803
        """Raw scores, shape (rows, boosters), in the order :meth:`decide`'s ``raw`` takes them.

        One batch predict for many rows: the trainer's replays pass row ``r`` of it to
        ``decide(raw=...)`` at the decision point whose features are ``X[r]``.
        """
        if self._forest is None:
            raise ModelIntegrityError(f"raw_rows needs a learned model; this policy is {self.kind!r}")
        return self._forest.raw_batch(self.columns(X))

    # ----------------------------------------------------------------- decide: one row, then many

    def decide(
        self,
        state: RunState,
        *,
        objective: Objective | None = None,
        safety: SafetyConfig | None = None,
        proposed_stop: bool = False,
        epsilon: float = 0.0,
        rng: random.Random | None = None,
        raw: Sequence[float] | FloatArray | None = None,
    ) -> StopDecision:
        """Continue or stop after the events folded into ``state`` (see the module docstring).

        ``objective`` sets what cost is worth (default: the model's); ``safety`` replaces the
        policy's nets for this call. With probability ``epsilon`` a stop becomes a continue
        (``explored``): a model stop, or a rule's (the loop detector, ``quality_met``, the base
        rule, an accepted proposal: each one a retrained model may overrule); ``propensity`` is
        the chosen action's probability. A budget's stop (a safety net) is never explored away.
        ``raw``: the boosters' raw scores of ``state.features()`` when the caller has them
        already (a row of :meth:`raw_rows`; the trainer's replays), else they are computed here.
        """
        cfg = self.safety if safety is None else safety
        turn = state.turn
        version = self.model_version
        dev = self.deviation
        net = cfg.check_budgets(state)
        if net is not None:
            return StopDecision(
                action="stop",
                reason=net.reason,
                v_stop=None,
                q_continue=None,
                q_stop=None,
                cost_to_go=None,
                turn=turn,
                safety_net=net.name,
                limit=net.limit,
                finalize=True,
                model_version=version,
                message=net.message,
                proposal="accepted" if proposed_stop else None,
            )
        v: float | None = None
        s: float | None = None
        ctg: float | None = None
        degraded = False
        if self._forest is not None:
            worth = self.resolve(objective)
            try:
                if raw is None:
                    raw = self._forest.raw_one(self.columns(state.features()))
                named = {n: float(raw[i]) for n, i in self._index.items()}
                v_, ctg_, s_ = self.values(named, turn, cost_so_far(state, self.cost_unit), worth)
                v, ctg = float(v_), float(ctg_)
                s = None if s_ is None else float(s_)
                if not (math.isfinite(v) and math.isfinite(ctg)):
                    raise FloatingPointError("V is not finite")
            except (ValueError, IndexError, FloatingPointError):
                # fail safe: a broken feature row must not take the run down; nets and rules still apply
                v = s = ctg = None
                degraded = True

        def answer(
            action: Literal["continue", "stop"],
            reason: str | None,
            propensity: float = 1.0,
            by: SafetyStop | None = None,
            *,
            net: bool = False,
            message: str | None = None,
            proposal: Literal["overruled", "vetoed", "refused"] | None = None,
            explored: bool = False,
        ) -> StopDecision:
            pattern = None if by is None else by.pattern
            nudge = None
            if action == "stop" and pattern is None:
                pattern = cfg.loop.closest(state)  # what the run was repeating, if anything
            elif action == "continue":
                nudge = cfg.loop.nudging(state)  # a loop at its threshold: tell the agent first
            return StopDecision(
                action=action,
                reason=reason,
                v_stop=v,
                q_continue=None if v is None or s is None else s + v,
                q_stop=s,
                cost_to_go=ctg,
                turn=turn,
                safety_net=by.name if net and by is not None else None,
                limit=None if by is None else by.limit,
                pattern=pattern,
                finalize=action == "stop",
                model_version=version,
                propensity=propensity,
                degraded=degraded,
                rule=None if by is None or net else (self.rule_name or by.name),
                message=message if message is not None else (None if by is None else by.message),
                proposal=None if not proposed_stop else "accepted" if action == "stop" else proposal,
                explored=explored,
                nudge=nudge,
            )

        def stop(
            reason: str | None,
            why: str | None,
            *,
            by: SafetyStop | None = None,
            net: bool = False,
            proposal: Literal["overruled", "refused"] = "overruled",
        ) -> StopDecision:
            """A stop that is not a budget's: with probability ``epsilon``, a continue instead."""
            if epsilon <= 0.0:
                return answer("stop", reason, by=by, net=net, message=why)
            if (rng or random).random() < epsilon:
                said = why if why is not None else (by.message if by is not None else reason)
                return answer(
                    "continue",
                    None,
                    propensity=epsilon,
                    message=f"explored: {said}",
                    proposal=proposal,
                    explored=True,
                )
            return answer("stop", reason, propensity=1.0 - epsilon, by=by, net=net, message=why)

        # the rules that fire now, in RULE_KINDS order: the config's (loop detector, then
        # quality_met), the base rule, a proposed stop (RuleFires.by_kind is the batch form)
        fired: list[tuple[str, SafetyStop | None, str]] = []
        by_config = cfg.check_rules(state)
        if by_config is not None:
            # the loop detector and the orchestrator's own loop verdict (its ledger) are one kind
            kind = "quality_met" if by_config.reason == "quality_met" else "loop"
            fired.append((kind, by_config, by_config.name))
        allowed = cfg.allows_stop(state)
        if allowed:
            base = self.rule.check(state) if self.rule is not None else None
            if base is not None:
                fired.append(("rule", base, f"the base rule ({self.rule_name or base.name})"))
            if proposed_stop and self.accepts_proposals:
                fired.append(("proposed", None, "the proposed stop"))
        if fired:
            # a learned model goes on only where every rule that fired is one it may overrule
            # and going on clears its continue margin
            hard = [f for f in fired if f[0] not in dev.overrules]
            if not hard and v is not None and dev.keeps_going(v):
                names = ", ".join(f[2] for f in fired)
                return answer(
                    "continue",
                    None,
                    message=f"{names} overruled: the value of going on {v:.3g} > the continue margin "
                    f"{dev.margin_continue:.3g}",
                    proposal="overruled",
                )
            # every rule is one a retrained model may overrule: its stop is explorable
            kind, by, _ = (hard or fired)[0]
            if kind == "proposed":
                return stop(PROPOSED_STOP_REASON, "the orchestrator proposed to stop")
            assert by is not None
            return stop(by.reason, None, by=by, net=kind != "rule")
        if not allowed:
            return answer(
                "continue",
                None,
                message=f"before min_turns ({cfg.effective_min_turns}) only a budget or a loop may stop it",
                proposal="vetoed",
            )
        if v is not None and dev.may_stop(v, turn):
            evidence = stall(state, self.evidence) if dev.on_evidence else "—"
            if evidence is None:
                return answer("continue", None, proposal="refused")
            why = f"the value of going on {v:.3g} < minus the stop margin {dev.margin_stop:.3g}"
            if dev.on_evidence:
                why += f"; the run shows a stall: {evidence}"
            return stop(MODEL_STOP_REASON, why, proposal="refused")
        return answer("continue", None, proposal="refused")

    def stop_mask(
        self, rows: Rows, v: FloatArray, fires: RuleFires, *, stall: BoolArray | None = None
    ) -> BoolArray:
        """:func:`stop_mask` with this policy's deviation: where it stops on many rows at once."""
        return stop_mask(rows, v, fires, self.deviation, stall=stall)
