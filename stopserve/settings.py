"""One typed configuration for the service: every field is also a ``STOPSERVE_`` variable.

Build it explicitly and pass it on; nothing reads the environment behind your back
except :class:`Settings` itself when constructed.

>>> Settings(port=9000, max_runs=10).port
9000
>>> import os
>>> os.environ["STOPSERVE_PORT"] = "8181"
>>> Settings().port, Settings(port=9000).port   # the variable, unless given explicitly
(8181, 9000)
>>> del os.environ["STOPSERVE_PORT"]
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from stopserve.errors import ConfigError, Issue, pydantic_message
from stopserve.objective import Objective

__all__ = ["Settings", "default_model_dir", "load_settings"]

_STORE_SCHEMES = ("redis://", "rediss://", "unix://")


class Settings(BaseSettings):
    """Service settings (env prefix ``STOPSERVE_``; CLI options override them)."""

    model_config = SettingsConfigDict(env_prefix="STOPSERVE_", extra="forbid", validate_default=True)

    model_dir: Path | None = Field(
        default=None, description="Model directory; unset: the shipped default model, if any."
    )
    no_model: bool = Field(default=False, description="Serve on safety nets alone.")
    host: str = Field(default="127.0.0.1", description="Bind address.")
    port: int = Field(default=8080, ge=0, le=65535)
    workers: int = Field(
        default=1,
        ge=1,
        description="Worker processes; above 1 only with a shared run store (STOPSERVE_STORE=redis://...).",
    )
    store: str | None = Field(
        default=None,
        description=(
            "Where live runs are kept: unset or 'memory' (this process), or a Redis URL "
            "(redis://host:port/db, rediss://, unix://) shared by several replicas or workers."
        ),
    )
    log_dir: Path | None = Field(
        default=Path("stopserve-logs"), description="Decision and trace logs; empty: no logging."
    )
    fsync: Literal["always", "interval"] = Field(
        default="interval", description="'always': fsync each line; 'interval': every fsync_interval_s."
    )
    fsync_interval_s: float = Field(default=1.0, gt=0)
    log_max_bytes: int = Field(default=256 * 1024 * 1024, ge=4096, description="Rotate log files above this.")
    log_retain_bytes: int = Field(
        default=4 * 1024 * 1024 * 1024,
        ge=4096,
        description="Bytes each log keeps, rotated files included; the oldest rotated files go first.",
    )
    hook_state_dir: Path | None = Field(
        default=None,
        description=(
            "State of the Claude Code HTTP hooks (POST /v1/hooks/claude-code): transcript offsets, "
            "decisions.jsonl for `stopserve hook report`. Unset: the command hook's default "
            "($STOPSERVE_HOOK_STATE, else the user cache dir)."
        ),
    )
    max_runs: int = Field(default=10_000, ge=1, description="Live runs kept; the least recently used go.")
    run_ttl_s: float = Field(default=3600.0, gt=0, description="Idle runs expire after this many seconds.")
    max_events_per_run: int = Field(default=5_000, ge=1)
    max_events_per_request: int = Field(default=2_000, ge=1)
    max_batch_runs: int = Field(default=512, ge=1)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    max_event_bytes: int = Field(default=16 * 1024, ge=256, description="JSON bytes of one event.")
    max_run_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=64 * 1024,
        description="Bytes one live run may retain (events, decisions).",
    )
    max_store_bytes: int = Field(
        default=1024 * 1024 * 1024,
        ge=64 * 1024,
        description="Bytes all live runs may retain; the least recently used are evicted above it.",
    )
    explore: float = Field(
        default=0.0,
        ge=0,
        le=1,
        validation_alias=AliasChoices("explore", "STOPSERVE_EXPLORE", "epsilon", "STOPSERVE_EPSILON"),
        description=(
            "Exploration (STOPSERVE_EXPLORE; STOPSERVE_EPSILON is its former name): the probability that a "
            "stop other than a budget's becomes continue; decisions log the propensity of their action."
        ),
    )
    explore_steps: float = Field(
        default=5.0,
        ge=1,
        description=(
            "Stops an explored run goes on past, on average (geometric; each later one explored with "
            "probability 1 - 1/steps): enough of the run after a stop to judge later stops; 1: one stop."
        ),
    )
    explore_disagree: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description=(
            "With exploration on: the probability that a stop is explored where a shadow challenger (the "
            "last refused candidate, or one you added) would go on: the runs a retrain needs to judge it."
        ),
    )
    explore_follow: float = Field(
        default=0.95,
        ge=0,
        lt=1,
        description=(
            "With exploration on: the probability that an explored run goes on past a later stop where a "
            "shadow challenger would go on: the run follows it, so the log shows what its whole run gets."
        ),
    )
    seed: int | None = Field(default=None, description="Seed of the exploration random stream.")
    challengers: Path | None = Field(
        default=None,
        description="Directory of challenger model directories: shadow decisions, never acted on.",
    )
    model_store: Path | None = Field(
        default=None,
        description=(
            "Where `stopserve retrain` keeps promoted models, the champion pointer and promotions.jsonl; "
            "the service serves its champion and follows promotions. Unset: <log_dir>/models."
        ),
    )
    retrain_every: int | None = Field(
        default=None,
        ge=1,
        description="Retrain in a background process after every N finished runs (all replicas'); unset: no.",
    )
    retrain_args: str = Field(
        default="", description="More `stopserve retrain` options for the background retrain (shell words)."
    )
    lam: float | None = Field(
        default=None, ge=0, description="Default cost weight (λ per cost unit); unset: the model's."
    )
    cost_share: float | None = Field(
        default=None, ge=0, le=100, description="Default cost share (instead of lam); unset: the model's."
    )
    safety: dict[str, Any] | None = Field(
        default=None, description="Default safety-net config (SafetyConfig JSON); unset: the model's."
    )
    quality_target: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="The quality reward that means done (quality_met of the default config); unset: 1.0.",
    )
    admin_token: SecretStr | None = Field(
        default=None, description="Bearer token of /v1/admin/*; unset: admin endpoints disabled."
    )
    cors_origins: list[str] = Field(default_factory=list, description="Allowed CORS origins; empty: off.")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    access_log: bool = Field(
        default=False,
        description="uvicorn's per-request access log; off: every decision is in the decision log already.",
    )

    @field_validator("log_dir", "model_dir", "hook_state_dir", "challengers", "model_store", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        # STOPSERVE_LOG_DIR= (empty) means "no log", not the current folder
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("store", mode="before")
    @classmethod
    def _store_url(cls, value: Any) -> Any:
        if value is None or (isinstance(value, str) and value.strip().lower() in {"", "memory"}):
            return None
        if not isinstance(value, str) or not value.strip().lower().startswith(_STORE_SCHEMES):
            shown = value if not isinstance(value, str) else value.split("@")[-1]
            raise ValueError(
                f"{shown!r} is not a run store: 'memory', or a Redis URL "
                "(redis://host:port/db, rediss://host:port/db, unix:///path/redis.sock)"
            )
        return value.strip()

    @property
    def shared_store(self) -> bool:
        """Live runs are kept outside this process (several replicas or workers may serve them)."""
        return self.store is not None

    @field_validator("safety", mode="before")
    @classmethod
    def _safety_is_json(cls, value: Any) -> Any:
        # pydantic-settings hands over a variable that is not JSON as the raw text
        if not isinstance(value, str | bytes):
            return value
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON: {exc}") from None

    @field_validator("safety")
    @classmethod
    def _safety_is_valid(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        # checked here, so a bad STOPSERVE_SAFETY is one line at start-up, not a lifespan traceback
        if value is not None:
            from stopserve.safety import SafetyConfig

            try:
                SafetyConfig.from_dict(value)
            except ConfigError as exc:
                raise ValueError("; ".join(str(i) for i in exc.issues) or exc.message) from None
        return value

    @model_validator(mode="after")
    def _retention_holds_a_file(self) -> Settings:
        if self.log_retain_bytes < self.log_max_bytes:
            raise ValueError(
                f"log_retain_bytes ({self.log_retain_bytes}) must be at least log_max_bytes "
                f"({self.log_max_bytes}): the current file alone may reach log_max_bytes"
            )
        if self.max_store_bytes < self.max_run_bytes:
            raise ValueError(
                f"max_store_bytes ({self.max_store_bytes}) must be at least "
                f"max_run_bytes ({self.max_run_bytes})"
            )
        if self.lam is not None and self.cost_share is not None:
            Objective.of(self.lam, self.cost_share)  # raises: one of the two
        return self

    @cached_property
    def objective(self) -> Objective | None:
        """What cost is worth when a request names nothing (``lam`` or ``cost_share``); None: the model's."""
        return Objective.of(self.lam, self.cost_share)

    @property
    def exploration(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """The probabilities that a stop is explored: ((a run's first, where a challenger would go on),
        (a later one in an explored run, where a challenger would go on)); none below the one before."""
        if self.explore <= 0:
            return (0.0, 0.0), (0.0, 0.0)
        later = 1.0 - 1.0 / self.explore_steps
        return (self.explore, max(self.explore, self.explore_disagree)), (
            later,
            max(later, self.explore_follow),
        )

    def resolved_model_store(self) -> Path | None:
        """The model store: the configured one, else ``<log_dir>/models``, else None."""
        if self.model_store is not None:
            return self.model_store
        return None if self.log_dir is None else self.log_dir / "models"

    def resolved_model_dir(self) -> Path | None:
        """The model directory to load: the configured one, else the shipped default, else None."""
        if self.no_model:
            return None
        if self.model_dir is not None:
            return self.model_dir
        return default_model_dir()


def default_model_dir() -> Path | None:
    """The shipped default model (repo ``models/default`` or the installed copy), if trained."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "models" / "default", here / "_default_model"):
        if (candidate / "manifest.json").is_file():
            return candidate
    return None


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment plus ``overrides`` (None values are skipped).

    Raises :class:`ConfigError` naming each bad setting and its variable.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**given)
    except SettingsError as exc:  # a variable that is not valid JSON for a structured setting
        named = re.search(r'field "(\w+)"', str(exc))
        where = f"STOPSERVE_{named[1].upper()}" if named else "settings"
        raise ConfigError(
            f"invalid settings: {where} is not valid JSON",
            [Issue(f"not valid JSON: {exc.__cause__ or exc}", path=where)],
        ) from None
    except ValidationError as exc:
        # each issue names the variable to fix (STOPSERVE_MAX_RUNS), or "settings" for a cross-field rule
        issues = [
            Issue(
                pydantic_message(err),
                path=f"STOPSERVE_{str(err['loc'][0]).upper()}" if err["loc"] else "settings",
            )
            for err in exc.errors()
        ]
        raise ConfigError(f"invalid settings ({len(issues)} problems)", issues) from None
