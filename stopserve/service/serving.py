"""The model the service serves: loading it, swapping it, following the model store, readiness.

:class:`Models` holds the one :class:`Serving` reference (replaced whole by a reload,
read once by each decision), the shadow challengers beside it, and follows the model
store's champion and its last refused candidate (:mod:`stopserve.service.learning`).
Every load goes through :func:`load_serving`: files verified, the manifest's feature
names checked against this featurizer's, every failure a :class:`ModelError` (422 on a
reload; the old model keeps serving).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from stopserve.api import ChallengerInfo, ModelInfo, ReadyResponse, ReloadResponse
from stopserve.artifacts import ModelArtifact, load_model_dir, reads_features
from stopserve.errors import ModelError, ModelIntegrityError, ModelNotFoundError, StopServeError
from stopserve.features import FEATURE_NAMES
from stopserve.policy import Policy
from stopserve.safety import SafetyConfig
from stopserve.service.learning import LearningLoop
from stopserve.service.metrics import Metrics
from stopserve.service.safety_configs import RequestSafety
from stopserve.service.shadow import Challengers, challenger_dirs
from stopserve.service.store import RunStore, StoreUnavailableError
from stopserve.settings import Settings

__all__ = [
    "STORE_CANDIDATE",
    "Models",
    "Serving",
    "load_artifact",
    "load_policy",
    "load_serving",
    "policy_from",
    "readiness",
]

_log = logging.getLogger("stopserve.service")

_MAX_CARD_BYTES: Final = 64 * 1024
#: The challenger name of the model store's last refused candidate.
STORE_CANDIDATE: Final = "candidate"


@dataclass(frozen=True, slots=True)
class Serving:
    """The model being served; replaced whole by a reload."""

    policy: Policy
    path: Path | None
    loaded_at: float
    model_card: str | None


def load_artifact(path: Path) -> ModelArtifact:
    """The verified model directory (every listed file read once, sha256 checked, no link out of it)."""
    try:
        return load_model_dir(path)
    except OSError as exc:
        raise ModelNotFoundError(f"{path}: cannot read the model: {exc}") from None


def policy_from(artifact: ModelArtifact) -> Policy:
    """``Policy.from_artifact``, with every failure a model error (422 on reload), never a crash.

    A manifest value of the wrong type or form (a string for a number, a number for a
    map) breaks the policy's constructor with a plain Python error: that is the
    manifest's fault, reported as such.
    """
    path = artifact.path
    try:
        return Policy.from_artifact(artifact)
    except StopServeError:
        raise
    except (ImportError, OSError) as exc:
        raise ModelError(
            f"{path}: cannot load LightGBM to use this model ({exc}); "
            "on slim Linux images install the OpenMP runtime (libgomp1)"
        ) from None
    except (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError) as exc:
        raise ModelIntegrityError(
            f"{path}/manifest.json: a value has the wrong type or form ({type(exc).__name__}: {exc})"
        ) from None


def load_policy(path: Path) -> Policy:
    """Load and verify a model directory as a policy; every failure is a :class:`ModelError`."""
    return policy_from(load_artifact(path))


def load_serving(path: Path | None, default_safety: SafetyConfig | None) -> Serving:
    """The model directory ``path`` ready to serve (None: the safety nets alone, on ``default_safety``)."""
    if path is None:
        policy = Policy.safety_only(default_safety)
        return Serving(policy, None, time.time(), None)
    if not path.exists():
        raise ModelNotFoundError(f"{path}: no such model directory")
    artifact = load_artifact(path)
    policy = policy_from(artifact)
    names = policy.manifest.feature_names
    if names is not None and not reads_features(names, FEATURE_NAMES):
        raise ModelIntegrityError(f"{path}/manifest.json: feature_names differ from this featurizer's")
    # only the card the manifest lists and hashes, read once with the other files
    card = artifact.card
    text = card[:_MAX_CARD_BYTES] if card is not None else None
    return Serving(policy, path, time.time(), text)


class Models:
    """The champion served and its shadow challengers; follows the model store's pointers."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        learning: LearningLoop,
        safety: RequestSafety,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.learning = learning
        self.safety = safety
        self.challengers = Challengers()
        self._serving: Serving | None = None
        self._reload_lock = threading.Lock()

    @property
    def serving(self) -> Serving:
        """The model being served."""
        if self._serving is None:
            raise RuntimeError("engine not started")
        return self._serving

    @property
    def started(self) -> Serving | None:
        """The model being served, or None before :meth:`start`."""
        return self._serving

    def start(self) -> None:
        """Load the model store's champion if there is one and it loads, else the configured model.

        Refuses to start on a bad configured model; then the challengers of
        ``STOPSERVE_CHALLENGERS`` and the store's refused candidate.
        """
        path = self.settings.resolved_model_dir()
        champion = self.learning.champion()
        if champion is not None:
            try:
                self._serving = load_serving(champion.path, self.safety.default)
                self.learning.following = True
                _log.info("serving the model store's champion %s (%s)", champion.version, champion.path)
            except StopServeError as exc:
                _log.error(
                    "the model store's champion %s cannot be served (%s): serving %s",
                    champion.path,
                    exc,
                    path,
                )
        if self._serving is None:
            self._serving = load_serving(path, self.safety.default)
        self.metrics.set_model(self._serving.policy.model_version, self._serving.policy.kind)
        if self._serving.path is None:
            _log.warning("no model: serving on safety nets alone")
        if self.settings.challengers is not None:
            for where in challenger_dirs(self.settings.challengers):
                self.add_challenger(str(where), where.name)
        self.follow_candidate()

    def reload(self, model_dir: str | None, *, following: bool = False) -> ReloadResponse:
        """Load a model and swap it in; on any failure the old one keeps serving.

        A reload by hand (``following`` False) stops following the model store's champion
        until the next promotion or rollback.
        """
        with self._reload_lock:
            old = self.serving
            path = Path(model_dir) if model_dir else (self.settings.resolved_model_dir() or old.path)
            if path is None:
                self.metrics.reloads.labels(result="refused").inc()
                raise ModelNotFoundError("no model directory configured: give 'model_dir'")
            try:
                new = load_serving(path, self.safety.default)
            except StopServeError:
                self.metrics.reloads.labels(result="refused").inc()
                raise
            self._serving = new
            self.learning.following = following
            self.safety.clear()  # requests' configs were merged onto the old model's own
            self.metrics.set_model(new.policy.model_version, new.policy.kind)
            self.metrics.reloads.labels(result="ok").inc()
            _log.info("reloaded model %s -> %s", old.policy.model_version, new.policy.model_version)
            return ReloadResponse(
                previous_version=old.policy.model_version,
                model_version=new.policy.model_version,
                kind=new.policy.kind,
                path=str(path),
            )

    def follow_champion(self) -> ReloadResponse | None:
        """Serve the model store's champion if a promotion or a rollback changed it since last seen."""
        champion = self.learning.changed()
        if champion is None:
            return None
        served = self.serving.path
        if served is not None and served.resolve() == champion.path.resolve():
            self.learning.following = True
            return None
        try:
            done = self.reload(str(champion.path), following=True)
        except StopServeError as exc:
            _log.error(
                "the model store's champion %s cannot be served (%s): keeping %s", champion.path, exc, served
            )
            return None
        self.metrics.champion_reloads.inc()
        return done

    def follow_candidate(self) -> None:
        """With exploration on, shadow the model store's last refused candidate (challenger ``candidate``)."""
        changed, path = self.learning.candidate_changed()
        if not changed:
            return
        if path is None:
            try:
                self.challengers.remove(STORE_CANDIDATE)
            except ModelNotFoundError:  # never shadowed, or removed by hand already
                return
            _log.info("challenger %s removed: a promotion replaced it", STORE_CANDIDATE)
            return
        try:
            self.add_challenger(str(path), STORE_CANDIDATE)
        except StopServeError as exc:  # a candidate half replaced, or broken: the next one is tried
            _log.warning("the model store's refused candidate %s cannot be shadowed: %s", path, exc)

    def add_challenger(self, model_dir: str, name: str | None = None) -> ChallengerInfo:
        """Load a model directory as a shadow challenger (replacing one of the same name)."""
        path = Path(model_dir)
        if not path.exists():
            raise ModelNotFoundError(f"{path}: no such model directory")
        served = load_serving(path, self.safety.default)
        challenger = self.challengers.add(name or path.resolve().name, served.policy, path)
        _log.info("challenger %s: %s (%s)", challenger.name, served.policy.model_version, path)
        return challenger.info()

    def remove_challenger(self, name: str) -> None:
        """Stop a challenger deciding in the shadow."""
        self.challengers.remove(name)

    def info(self) -> ModelInfo:
        """Summary of the model served."""
        s = self.serving
        p = s.policy
        return ModelInfo(
            kind=p.kind,
            model_version=p.model_version,
            default_lambda=None if p.objective is None else p.objective.lam,
            default_cost_share=None if p.objective is None else p.objective.cost_share,
            rule=None if p.manifest.base_rule is None else p.manifest.base_rule.text,
            path=str(s.path) if s.path else None,
            safety_only=p.kind == "none",
            feature_names=list(FEATURE_NAMES),
            safety=(self.safety.default or p.safety).to_dict(),
            manifest=_manifest_info(p),
            model_card=s.model_card,
            loaded_at=s.loaded_at,
            challengers=self.challengers.infos(),
            champion=self.learning.info(),
        )


def readiness(serving: Serving | None, store: RunStore, log_ok: bool) -> ReadyResponse:
    """Readiness: a policy is loaded, the log writes and a shared run store answers."""
    store_ok = True
    if store.shared:
        try:
            store.ping()
        except StoreUnavailableError as exc:
            _log.error("%s", exc)
            store_ok = False
    return ReadyResponse(
        ready=serving is not None and log_ok and store_ok,
        model_version=serving.policy.model_version if serving else None,
        kind=serving.policy.kind if serving else "none",
        safety_only=serving is None or serving.policy.kind == "none",
        live_runs=len(store),
        log_ok=log_ok,
    )


def _manifest_info(policy: Policy) -> dict[str, Any]:
    """The served manifest as ``GET /v1/model`` shows it: its JSON, and how decisions are computed."""
    data = policy.manifest.to_dict()
    if policy.inference is not None:
        data["inference"] = policy.inference
    return data
