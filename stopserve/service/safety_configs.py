"""The safety-net configs requests ask for: ``safety`` and ``quality_target`` over the one in force.

The service's default config is ``STOPSERVE_SAFETY`` (with ``STOPSERVE_QUALITY_TARGET``),
else the served model's own. A request's ``safety`` keys are merged over it, checked
(numbers, strings and nesting within the service's bounds; every problem a 422 naming
``safety.<key>``) and cached by their JSON text, so a client sending the same config on
every call pays for its parse once; a reload clears the cache.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

import orjson

from stopserve.api import MAX_ID_CHARS, MAX_INT, MAX_NUMBER, DecideRequest, StatelessDecideRequest
from stopserve.errors import ConfigError, Issue
from stopserve.policy import Policy
from stopserve.safety import DEFAULT_SAFETY, SafetyConfig
from stopserve.settings import Settings

__all__ = ["RequestSafety", "parse_safety"]

_SAFETY_CACHE: Final = 64
#: Bounds of a safety config sent in a request (beyond them: 422 naming the field).
_SAFETY_DEPTH: Final = 8
_SAFETY_ITEMS: Final = 64


class RequestSafety:
    """The service's default config and the configs requests ask for, merged onto it (cached)."""

    def __init__(self, settings: Settings, policy: Callable[[], Policy]) -> None:
        self._policy = policy  # the served policy, read when a config is merged onto its own
        default = parse_safety(settings.safety, "STOPSERVE_SAFETY")
        if settings.quality_target is not None:  # the quality target of the default config
            default = (default or DEFAULT_SAFETY).replace(quality_met=settings.quality_target)
        self.default: SafetyConfig | None = default
        self._cache: OrderedDict[bytes, SafetyConfig] = OrderedDict()
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Forget the merged configs (a reload swapped the model they were merged onto)."""
        with self._lock:
            self._cache.clear()

    def for_request(
        self, req: DecideRequest | StatelessDecideRequest, held: SafetyConfig | None
    ) -> SafetyConfig | None:
        """The config a request asks for (``safety``, ``quality_target``), or None: keep the one in force.

        ``quality_target`` sets ``quality_met`` of the request's config, else of the run's
        (``held``), else of the service's default, else of the model's own.
        """
        safety = self.merged(req.safety) if req.safety is not None else None
        if req.quality_target is None:
            return safety
        base = safety or held or self.default or self._policy().safety
        if base.quality_met == req.quality_target:
            return base
        return base.replace(quality_met=req.quality_target)

    def merged(self, raw: dict[str, Any]) -> SafetyConfig:
        """A request's config: its keys over the config in force (the service's, else the model's)."""
        issues = _out_of_range(raw, "safety", 0)
        if issues:
            raise ConfigError("invalid safety config in 'safety'", issues)
        policy = self._policy()
        key = orjson.dumps(raw, option=orjson.OPT_SORT_KEYS)  # cleared when a reload swaps the model
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        base = self.default or policy.safety
        cfg = parse_safety({**base.to_dict(), **raw}, "safety")
        assert cfg is not None
        with self._lock:
            self._cache[key] = cfg
            while len(self._cache) > _SAFETY_CACHE:
                self._cache.popitem(last=False)
        return cfg


def parse_safety(raw: dict[str, Any] | None, where: str) -> SafetyConfig | None:
    """``raw`` as a config (None: none given); a bad one is a :class:`ConfigError` naming ``where.<key>``."""
    if raw is None:
        return None
    try:
        return SafetyConfig.from_dict(raw)
    except ConfigError as exc:
        issues = [Issue(i.message, path=f"{where}.{i.path}" if i.path else where) for i in exc.issues]
        raise ConfigError(f"invalid safety config in {where!r}", issues) from None


def _out_of_range(value: Any, path: str, depth: int) -> list[Issue]:
    """Numbers, strings and nesting of a free-form JSON value beyond what the service takes."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        ok = -MAX_INT <= value <= MAX_INT
        return [] if ok else [Issue(f"integer out of range (at most {MAX_INT} in size)", path=path)]
    if isinstance(value, float):
        ok = math.isfinite(value) and abs(value) <= MAX_NUMBER
        return [] if ok else [Issue(f"number out of range (at most {MAX_NUMBER:g} in size)", path=path)]
    if isinstance(value, str):
        ok = len(value) <= MAX_ID_CHARS
        return [] if ok else [Issue(f"string longer than {MAX_ID_CHARS} characters", path=path)]
    if depth >= _SAFETY_DEPTH:
        return [Issue(f"nested deeper than {_SAFETY_DEPTH} levels", path=path)]
    if isinstance(value, dict | list) and len(value) > _SAFETY_ITEMS:
        return [Issue(f"more than {_SAFETY_ITEMS} entries", path=path)]
    issues: list[Issue] = []
    if isinstance(value, dict):
        for key, item in value.items():
            issues += _out_of_range(item, f"{path}.{key}", depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            issues += _out_of_range(item, f"{path}[{i}]", depth + 1)
    return issues
