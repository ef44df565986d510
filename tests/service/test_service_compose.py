"""docker-compose.yml (no Docker here): its stopserve settings load, and its replicas share a Redis."""

from __future__ import annotations

from pathlib import Path

import pytest

from stopserve.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


def test_compose_runs_two_replicas_on_the_redis_service(monkeypatch: pytest.MonkeyPatch) -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML reads docker-compose.yml")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    stopserve = services["stopserve"]
    assert stopserve["deploy"]["replicas"] >= 2
    env = {k: str(v) for k, v in stopserve["environment"].items()}
    assert env["STOPSERVE_STORE"].startswith("redis://redis:")
    assert stopserve["depends_on"]["redis"]["condition"] == "service_healthy"
    # every STOPSERVE_ variable there is a setting with a valid value (as the container reads them)
    for name, value in env.items():
        if "${" not in value:
            monkeypatch.setenv(name, value)
    settings = load_settings()
    assert settings.shared_store and settings.safety is not None
    redis_cmd = " ".join(services["redis"]["command"])
    assert "--maxmemory-policy volatile-ttl" in redis_cmd and "--appendonly yes" in redis_cmd
    assert services["orchestrator"]["environment"]["STOPSERVE_URL"] == "http://stopserve:8080"
