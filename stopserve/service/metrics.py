"""Prometheus metrics of one app (its own registry, so several apps can coexist in tests)."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TURN_BUCKETS = (0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0)
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """Decisions by action and reason, decide latency, live runs and bytes, evictions, model, log errors,
    exploration, shadow challengers and retrains."""

    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # the *_created series only double the scrape size
        self.registry = CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "stopserve_decisions", "Decisions answered", ["action", "reason", "safety_net"], registry=r
        )
        self.latency = Histogram(
            "stopserve_decide_seconds", "Time to decide, log included", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.live_runs = Gauge("stopserve_live_runs", "Runs in the run store", registry=r)
        self.store_bytes = Gauge(
            "stopserve_store_bytes", "Bytes the live runs retain (as the run store charges them)", registry=r
        )
        self.evictions = Counter("stopserve_evictions", "Runs dropped by the store", ["cause"], registry=r)
        self.model = Gauge(
            "stopserve_model_info", "The model served (value 1)", ["version", "kind"], registry=r
        )
        self.log_errors = Counter("stopserve_log_write_errors", "Log lines that failed to write", registry=r)
        self.reloads = Counter("stopserve_reloads", "Admin reloads by result", ["result"], registry=r)
        self.outcomes = Counter("stopserve_outcomes", "Runs closed with an outcome", registry=r)
        self.rejected = Counter(
            "stopserve_rejected_requests",
            "Requests answered with an error, by HTTP status (413 too large, 409 run closed or evicted, ...)",
            ["status"],
            registry=r,
        )
        self.explored = Counter(
            "stopserve_explored_decisions",
            "Stops made continues by exploration (STOPSERVE_EXPLORE)",
            registry=r,
        )
        self.challenger_decisions = Counter(
            "stopserve_challenger_decisions",
            "Shadow decisions of each challenger, by whether its action was the champion's",
            ["challenger", "agree"],
            registry=r,
        )
        self.challenger_runs = Counter(
            "stopserve_challenger_runs",
            "Runs the champion stopped, by where the challenger stops them: earlier, same turn, later",
            ["challenger", "stop"],
            registry=r,
        )
        self.challenger_turns_earlier = Histogram(
            "stopserve_challenger_stop_turns_earlier",
            "Turns before the champion's stop at which the challenger stops (runs it stops no later)",
            ["challenger"],
            buckets=_TURN_BUCKETS,
            registry=r,
        )
        self.retrains = Counter(
            "stopserve_retrains", "Background retrains by what became of them", ["result"], registry=r
        )
        self.champion_reloads = Counter(
            "stopserve_champion_reloads", "Reloads that followed the model store's champion", registry=r
        )
        self._decision_children: dict[tuple[str, str | None, str | None], Counter] = {}

    def count_decision(self, action: str, reason: str | None, safety_net: str | None) -> None:
        """Count one decision (the labelled child is cached: no label lookup per request)."""
        key = (action, reason, safety_net)
        child = self._decision_children.get(key)
        if child is None:
            child = self.decisions.labels(
                action=action, reason=reason or "none", safety_net=safety_net or "none"
            )
            self._decision_children[key] = child
        child.inc()

    def count_rejected(self, status: int) -> None:
        """Count one request answered with status ``status`` (400 or above)."""
        self.rejected.labels(status=str(status)).inc()

    def set_model(self, version: str | None, kind: str) -> None:
        """Point the model gauge at the model now served."""
        self.model.clear()
        self.model.labels(version=version or "none", kind=kind).set(1)

    def render(self) -> bytes:
        """The exposition text."""
        return generate_latest(self.registry)
