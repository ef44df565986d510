"""The stop policy: safety nets, a base rule, and the learned value of going on.

:meth:`Policy.decide` answers continue or stop after the events folded into a
:class:`~stopserve.features.RunState`, in this order:

1. **Nets** (the budgets of the :class:`~stopserve.safety.SafetyConfig` in force, and the
   run's own budget) fire first and always win.
2. **Rules**: the config's loop detector, the orchestrator's own verdict (its progress
   ledger) and ``quality_met`` (the quality target), the
   policy's **base rule** (a tuned heuristic: turn cap, cost cap, reward threshold, stated
   as a ``SafetyConfig``) and a proposed stop from the orchestrator (unless the policy
   refuses proposals) say stop. A learned model overrules a rule whose kind its manifest
   lists in ``overrules`` (``loop``, ``quality_met``, ``rule``, ``proposed``, ``ledger``) where it
   expects continuing to pay by more than the ``continue`` margin. Before the config's
   ``min_turns`` only budgets, the loop detector and the ledger rule may stop a run.
3. **The model** stops a run no rule stops where the value of continuing is below minus
   the ``stop`` margin (and the run is past the model's ``min_turns``; for a model whose
   manifest says ``"stop_on": "evidence"``, only where the run itself shows a stall:
   :func:`stopserve.evidence.stall`).

With both margins infinite the policy IS its rules: the policy class contains every
heuristic the trainer tunes, so a learned policy can always fall back to the rule it
could have been (``docs/training.md``).

The value of continuing is ``V = G − w``: G ≈ E[q_T − q_t | s] is the quality the run
still gains if it goes on (model ``g``) and ``w`` what the rest of the run costs in
quality units. The cost still to come is predicted in *turn-equivalents* (model ``k``,
the cost to go divided by the run's own mean cost per decision point so far), so it
transfers between systems whose runs cost 1k and 1M tokens:

* ``lam`` given (absolute, per cost unit): ``w = λ · (c_t / turn) · K``;
* ``cost_share`` s given ("a whole run costs s of what a success is worth"): with a
  model trained on one system, λ = s / its mean behavior-run cost; with a model trained
  across systems (``cost_scale: per_run``), ``w = s · K / (turn + K)``: s times the
  share of this run's expected total cost still to come.

``w`` rises with λ and with s, so a stop never moves later when cost weighs more
(tested over random runs). ``method: optimal`` models carry C (the value realised by
the fitted backward-induction rule at their training λ) and S (the quality handed back
now): ``V = C − S − (w − w₀)`` with ``w₀`` the weight at the training λ.

>>> policy = Policy.safety_only()
>>> policy.kind
'none'
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from stopserve.artifacts import ModelArtifact, load_model_dir
from stopserve.errors import ConfigError, ModelIntegrityError
from stopserve.evidence import Evidence, stall
from stopserve.features import FEATURE_NAMES, RunState
from stopserve.inference import Forest
from stopserve.safety import BUDGET_NETS, DEFAULT_SAFETY, LEDGER_RULE, SafetyConfig, SafetyStop

__all__ = ["Policy", "StopDecision", "cost_so_far", "cost_weight"]

FloatArray = npt.NDArray[np.float64]

#: The reason a model stop carries: the expected gain of continuing is below its cost.
MODEL_STOP_REASON: Final = "no_progress"
#: The reason when the orchestrator proposed the stop and the policy accepted it.
PROPOSED_STOP_REASON: Final = "information_complete"
#: Kinds of rule a learned model may overrule (manifest ``overrules``): the safety config's
#: loop detector and ``quality_met``, the policy's base rule, the orchestrator's proposed stop, and the
#: orchestrator's own verdict (``ledger``: the ``orchestrator_ledger`` rule).
RULE_KINDS: Final[tuple[str, ...]] = ("loop", "quality_met", "rule", "proposed", "ledger")
#: What a manifest without ``overrules`` may overrule (models trained before the nets/rules
#: split: their loop detector and ``quality_met`` always won).
LEGACY_OVERRULES: Final = frozenset({"rule", "proposed"})
#: Boosters each method reads (only these are evaluated per decision).
METHOD_MODELS: Final[dict[str, tuple[str, ...]]] = {"behavior": ("g", "k"), "optimal": ("c", "s", "k")}


@dataclass(frozen=True, slots=True)
class StopDecision:
    """One continue-or-stop answer.

    ``propensity`` is the probability with which ``action`` was chosen (below 1 only
    under ε-exploration; ``explored``: exploration made a stop this continue),
    ``safety_net`` names the part of the safety config that
    fired (a budget, the loop detector, ``quality_met``; its ``limit``/``pattern`` when
    relevant), ``rule`` the policy's base rule that stopped the run, ``message`` says in
    words what fired (or what a model overruled), ``proposal`` what became of a proposed stop
    (``accepted``: the run stops; ``overruled``: a model keeps it going, its value of going on
    clearing its margin; ``vetoed``: before ``min_turns``; ``refused``: this policy does not
    take proposed stops, its rules and its value decide), ``degraded`` is True when the model
    could not be evaluated and only the nets and the rules decided. ``v_stop`` is the
    value of continuing V (quality units), ``cost_to_go`` the expected cost still to
    come (cost units).
    """

    action: Literal["continue", "stop"]
    reason: str | None
    v_stop: float | None
    q_continue: float | None
    q_stop: float | None
    cost_to_go: float | None
    turn: int
    safety_net: str | None = None
    limit: str | None = None
    pattern: str | None = None
    finalize: bool = False
    model_version: str | None = None
    propensity: float = 1.0
    degraded: bool = False
    rule: str | None = None
    message: str | None = None
    proposal: Literal["accepted", "overruled", "vetoed", "refused"] | None = None
    explored: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return asdict(self)


# --------------------------------------------------------------------------- value of continuing


def cost_so_far(state: RunState, unit: str) -> float:
    """The run's cost so far in a cost unit (``ktokens``, ``usd`` or ``seconds``)."""
    if unit == "usd":
        return state.usd
    if unit == "seconds":
        return state.elapsed
    return state.tokens / 1000.0


def _at_least(x: Any, lo: float) -> Any:
    """``np.maximum(x, lo)``: on arrays through numpy, on one row's numbers through ``max``.

    Numpy's ufuncs cost about a microsecond on a Python float; the decide path calls a few
    per decision. Both keep NaN.
    """
    return np.maximum(x, lo) if isinstance(x, np.ndarray) else max(x, lo)


def _logistic(z: Any) -> Any:
    """``1 / (1 + exp(-z))``, on arrays through numpy, on one number through ``math``."""
    if isinstance(z, np.ndarray):
        return 1.0 / (1.0 + np.exp(-z))
    try:
        return 1.0 / (1.0 + math.exp(-z))
    except OverflowError:  # exp(-z) is inf: numpy's answer
        return 0.0


def cost_weight(
    k_turns: Any,
    turn: Any,
    cost: Any,
    *,
    lam: float | None,
    cost_share: float | None,
    mean_cost: float | None,
) -> tuple[Any, Any]:
    """``(w, cost_to_go)``: the rest of the run's cost in quality units, and in cost units.

    ``k_turns`` is the predicted cost to go in turn-equivalents (model ``k``), ``turn``
    the decision points so far and ``cost`` the cost so far. Works on floats and on
    numpy arrays alike: the decide path and the trainer's replays share this one
    definition. See the module docstring for the three modes.
    """
    turns = _at_least(turn, 1)
    per_turn = cost / turns
    cost_to_go = per_turn * k_turns
    if lam is not None:
        return lam * cost_to_go, cost_to_go
    share = 0.0 if cost_share is None else cost_share
    if mean_cost is not None:
        return share / mean_cost * cost_to_go if mean_cost > 0 else 0.0 * cost_to_go, cost_to_go
    return share * k_turns / (turns + k_turns), cost_to_go


# --------------------------------------------------------------------------- policy


class Policy:
    """A stop policy: safety nets, a base rule, margins and (optionally) learned boosters.

    Build it with :meth:`load`, :meth:`from_artifact`, :meth:`from_manifest` or
    :meth:`safety_only`; the constructor is internal.
    """

    kind: Literal["model", "heuristic", "none"]
    model_version: str | None
    safety: SafetyConfig
    rule: SafetyConfig | None
    manifest: dict[str, Any]

    def __init__(
        self,
        *,
        kind: Literal["model", "heuristic", "none"],
        safety: SafetyConfig,
        manifest: dict[str, Any] | None = None,
        rule: SafetyConfig | None = None,
        boosters: Mapping[str, Any] | None = None,
        texts: Mapping[str, str] | None = None,
        engine: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        manifest = manifest or {}
        self.kind = kind
        self.safety = safety
        self.rule = rule
        self.manifest = manifest
        self.model_version = manifest.get("model_version")
        self.rule_name: str | None = manifest.get("rule_name")
        self.cost_unit: str = str(manifest.get("cost_unit") or "ktokens")
        self.method: str = str(manifest.get("method") or "none")
        self.default_lambda = _number(manifest, "default_lambda", minimum=0.0)
        self.default_cost_share = _number(manifest, "default_cost_share", minimum=0.0)
        self.mean_behavior_cost = _number(
            _section(manifest, "cost_scale"), "mean_behavior_cost", "cost_scale."
        )
        objective = _section(manifest, "objective")
        self._lam0 = _number(objective, "lambda", "objective.")
        self._share0 = _number(objective, "cost_share", "objective.")
        # how each model's raw score becomes its value: "sigmoid" for a probability-like target
        # (cross-entropy objective), "identity" for a regression
        entries = _section(manifest, "models")
        self._sigmoid: frozenset[str] = frozenset(
            n for n, e in entries.items() if isinstance(e, Mapping) and e.get("transform") == "sigmoid"
        )
        margins = _section(manifest, "margins")
        self.margin_stop = _margin(_number(margins, "stop", "margins."))
        self.margin_continue = _margin(_number(margins, "continue", "margins."))
        min_turns = _number(manifest, "min_turns", minimum=0.0)
        self.min_turns = 0 if min_turns is None else int(min_turns)
        self.overrules: frozenset[str] = _overrules(manifest)
        self.accepts_proposals: bool = _proposals(manifest)
        self.stop_on_evidence: bool = _stop_on(manifest) == "evidence"
        try:
            self.evidence = Evidence.from_dict(manifest.get("evidence"))
        except ValueError as exc:
            raise ModelIntegrityError(f"manifest.json: {exc}") from None
        self._forest: Forest | None = None
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
            self._forest = Forest(
                {n: boosters[n] for n in needed},
                len(FEATURE_NAMES),
                texts=texts,
                engine=engine,
                cache_dir=cache_dir,
            )
            self._index = {n: i for i, n in enumerate(self._forest.names)}
            # every booster the model carries (e.g. S for a run's value), for offline readers
            self.boosters = dict(boosters)
            # how decisions are computed, served with the manifest (GET /v1/model); not in the file
            self.manifest = {**manifest, "inference": self._forest.info.to_dict()}

    # ----------------------------------------------------------------- construction

    @classmethod
    def load(
        cls,
        model_dir: str | os.PathLike[str],
        *,
        engine: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> Policy:
        """Load and verify a model directory (sha256 of every file, feature names).

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
        manifest: Mapping[str, Any],
        models: Mapping[str, str] | None = None,
        *,
        source: str = "model",
        engine: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> Policy:
        """A policy from a manifest and LightGBM model texts (what a model directory holds)."""
        import lightgbm as lgb

        manifest = dict(manifest)
        safety = _nets_from(manifest, source)
        rule = _rule_from(manifest.get("rule"), source)
        kind = str(manifest.get("kind", "model"))
        if kind != "model":
            return cls(
                kind="heuristic" if kind == "heuristic" else "none",
                safety=safety,
                manifest=manifest,
                rule=rule,
            )
        boosters: dict[str, Any] = {}
        for name, text in (models or {}).items():
            try:
                booster = lgb.Booster(model_str=text)
            except Exception as exc:  # LightGBM raises its own error class on a bad text model
                raise ModelIntegrityError(f"{source}/{name}.txt: not a LightGBM model: {exc}") from None
            if list(booster.feature_name()) != list(FEATURE_NAMES):
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
                manifest=manifest,
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

    def resolve(self, lam: float | None, cost_share: float | None) -> tuple[float | None, float | None]:
        """The (λ, cost share) a decision uses: the request's, else the model's defaults."""
        if lam is not None:
            return lam, None
        if cost_share is not None:
            return None, cost_share
        if self.default_cost_share is not None:
            return None, self.default_cost_share
        return (self.default_lambda if self.default_lambda is not None else 0.0), None

    def values(
        self,
        raw: Mapping[str, Any],
        turn: Any,
        cost: Any,
        *,
        lam: float | None = None,
        cost_share: float | None = None,
    ) -> tuple[Any, Any, Any]:
        """``(V, cost_to_go, q_stop)`` from raw booster scores (floats or arrays).

        The one definition of V: :meth:`decide` calls it on one row, the trainer's
        replays on many (``raw`` maps a model name to its raw score(s)).
        """
        k_turns = _at_least(raw["k"], 0.0)
        w, ctg = cost_weight(
            k_turns, turn, cost, lam=lam, cost_share=cost_share, mean_cost=self.mean_behavior_cost
        )
        if self.method == "optimal":
            w0, _ = cost_weight(
                k_turns,
                turn,
                cost,
                lam=self._lam0,
                cost_share=self._share0,
                mean_cost=self.mean_behavior_cost,
            )
            s = self._post("s", raw["s"])
            return raw["c"] - s - (w - w0), ctg, s
        return raw["g"] - w, ctg, None

    def _post(self, name: str, raw: Any) -> Any:
        return _logistic(raw) if name in self._sigmoid else raw

    @property
    def inference(self) -> dict[str, Any] | None:
        """How decisions evaluate the boosters (engine, cache, why a fallback), or None without a model."""
        return None if self._forest is None else self._forest.info.to_dict()

    def raw_batch(self, X: FloatArray) -> dict[str, FloatArray]:  # noqa: N803
        """Raw scores of the boosters the method reads, for many feature rows."""
        out = self.raw_rows(X)
        return {name: out[:, i] for name, i in self._index.items()}

    def raw_rows(self, X: FloatArray) -> FloatArray:  # noqa: N803
        """Raw scores, shape (rows, boosters), in the order :meth:`decide`'s ``raw`` takes them.

        One batch predict for many rows: the trainer's replays pass row ``r`` of it to
        ``decide(raw=...)`` at the decision point whose features are ``X[r]``.
        """
        if self._forest is None:
            raise ModelIntegrityError(f"raw_rows needs a learned model; this policy is {self.kind!r}")
        return self._forest.raw_batch(X)

    # ----------------------------------------------------------------- decide

    def decide(
        self,
        state: RunState,
        *,
        lam: float | None = None,
        cost_share: float | None = None,
        safety: SafetyConfig | None = None,
        proposed_stop: bool = False,
        epsilon: float = 0.0,
        rng: random.Random | None = None,
        raw: Sequence[float] | FloatArray | None = None,
    ) -> StopDecision:
        """Continue or stop after the events folded into ``state`` (see the module docstring).

        ``lam`` (per cost unit) or ``cost_share`` sets what cost is worth (default: the
        model's); ``safety`` replaces the policy's nets for this call. With probability
        ``epsilon`` a stop becomes a continue (``explored``): a model stop, or a rule's (the
        loop detector, ``quality_met``, the base rule, an accepted proposal: each one a
        retrained model may overrule); ``propensity`` is the chosen action's probability.
        A budget's stop (a safety net) is never explored away. ``raw``: the
        boosters' raw scores of ``state.features()`` when the caller has them already (a
        row of :meth:`raw_rows`; the trainer's replays), else they are computed here.
        """
        cfg = self.safety if safety is None else safety
        turn = state.turn
        version = self.model_version
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
            try:
                if raw is None:
                    raw = self._forest.raw_one(state.features())
                named = {n: float(raw[i]) for n, i in self._index.items()}
                lam_, share_ = self.resolve(lam, cost_share)
                v_, ctg_, s_ = self.values(
                    named, turn, cost_so_far(state, self.cost_unit), lam=lam_, cost_share=share_
                )
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
            if action == "stop" and pattern is None:
                pattern = cfg.loop.closest(state)  # what the run was repeating, if anything
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

        # the rules that fire now, in order: the config's (loop detector, then quality_met), the
        # base rule, a proposed stop; each with the kind a manifest's ``overrules`` names
        fired: list[tuple[str, SafetyStop | None, str]] = []
        by_config = cfg.check_rules(state)
        if by_config is not None:
            kind = (
                "ledger"
                if LEDGER_RULE in by_config.name.split("&")
                else "loop"
                if by_config.reason == "loop_detected"
                else "quality_met"
            )
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
            hard = [f for f in fired if f[0] not in self.overrules]
            if not hard and v is not None and v > self.margin_continue:
                names = ", ".join(f[2] for f in fired)
                return answer(
                    "continue",
                    None,
                    message=f"{names} overruled: the value of going on {v:.3g} > the continue margin "
                    f"{self.margin_continue:.3g}",
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
        if v is not None and turn >= self.min_turns and v < -self.margin_stop:
            evidence = stall(state, self.evidence) if self.stop_on_evidence else "—"
            if evidence is None:
                return answer("continue", None, proposal="refused")
            why = f"the value of going on {v:.3g} < minus the stop margin {self.margin_stop:.3g}"
            if self.stop_on_evidence:
                why += f"; the run shows a stall: {evidence}"
            return stop(MODEL_STOP_REASON, why, proposal="refused")
        return answer("continue", None, proposal="refused")


def _margin(value: float | None) -> float:
    """A margin from the manifest; ``null`` (JSON has no infinity) means "never deviate"."""
    return math.inf if value is None else value


def _section(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """An object-valued manifest field (absent: empty), or a clear error naming the field."""
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ModelIntegrityError(f"manifest.json: {key}: expected an object, got {type(value).__name__}")
    return value


def _number(
    data: Mapping[str, Any], key: str, prefix: str = "", *, minimum: float | None = None
) -> float | None:
    """A finite number from the manifest (absent or null: None), or a clear error naming the field."""
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ModelIntegrityError(f"manifest.json: {prefix}{key}: expected a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ModelIntegrityError(f"manifest.json: {prefix}{key}: must be >= {minimum:g}, got {value!r}")
    return float(value)


def _nets_from(manifest: Mapping[str, Any], source: str) -> SafetyConfig:
    """The safety config a policy serves with when the caller gives none.

    A manifest that states what its model overrules (``overrules``: trained with the
    nets/rules split) states its whole config: its rules as tuned (the loop detector or
    ``quality_met`` may be off), its budgets never looser than the defaults. An older
    manifest's ``safety`` can only add to :data:`DEFAULT_SAFETY`.
    """
    data = manifest.get("safety")
    if data is None:
        return DEFAULT_SAFETY
    try:
        own = SafetyConfig.from_dict(data, source=f"{source}/manifest.json: safety")
    except ConfigError as exc:
        raise ModelIntegrityError(str(exc), exc.issues) from None
    if "overrules" not in manifest:
        return DEFAULT_SAFETY.tightened_by(own)
    caps = {
        key: min(v for v in (getattr(own, key), getattr(DEFAULT_SAFETY, key)) if v is not None)
        for key in BUDGET_NETS
        if getattr(own, key) is not None or getattr(DEFAULT_SAFETY, key) is not None
    }
    return own.replace(**caps)


def _rule_from(data: Any, source: str) -> SafetyConfig | None:
    if data is None:
        return None
    if isinstance(data, Mapping):
        # a base rule has no budgets of its own unless it states them (a tuned turn or cost cap)
        data = {**dict.fromkeys(BUDGET_NETS), **data}
    try:
        return SafetyConfig.from_dict(data, source=f"{source}/manifest.json: rule")
    except ConfigError as exc:
        raise ModelIntegrityError(str(exc), exc.issues) from None


def _overrules(manifest: Mapping[str, Any]) -> frozenset[str]:
    value = manifest.get("overrules")
    if value is None:
        return LEGACY_OVERRULES
    if not isinstance(value, list) or not all(isinstance(k, str) and k in RULE_KINDS for k in value):
        raise ModelIntegrityError(
            f"manifest.json: overrules: expected a list of {', '.join(RULE_KINDS)}, got {value!r}"
        )
    return frozenset(value)


def _proposals(manifest: Mapping[str, Any]) -> bool:
    value = manifest.get("proposals", "accept")
    if value not in ("accept", "refuse"):
        raise ModelIntegrityError(f"manifest.json: proposals: expected 'accept' or 'refuse', got {value!r}")
    return bool(value == "accept")


def _stop_on(manifest: Mapping[str, Any]) -> str:
    value = manifest.get("stop_on", "value")
    if value not in ("value", "evidence"):
        raise ModelIntegrityError(f"manifest.json: stop_on: expected 'value' or 'evidence', got {value!r}")
    return str(value)
