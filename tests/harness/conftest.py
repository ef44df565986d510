"""Fixtures of the real-harness tests: the pinned binaries (skipped with a clear message
when they are not installed), and real stopserve services on loopback.

Every test here is marked ``harness``: ``python -m pytest -m harness`` runs only these,
``-m 'not harness'`` leaves them out; by default they run when the binaries are there
(``.ci/run`` installs them) and skip otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harnesses import PINNED, binary
from servers import LiveServer

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.harness)


def _need(name: str) -> Path:
    path = binary(name)
    if path is None:
        package = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex"}[name]
        pytest.skip(
            f"{name} {PINNED[name]} not installed: `cp tests/harness/package*.json .harness/ && "
            f"npm ci --prefix .harness` ({package}; .ci/run does it), or set STOPSERVE_HARNESS_BIN"
        )
    return path


@pytest.fixture(scope="session")
def claude() -> Path:
    """The Claude Code binary."""
    return _need("claude")


@pytest.fixture(scope="session")
def codex() -> Path:
    """The Codex CLI binary."""
    return _need("codex")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """``stopserve serve --no-model``: the default safety nets alone (the loop detector on),
    HTTP hook state in its own folder."""
    logs = tmp_path_factory.mktemp("service")
    env = {"STOPSERVE_HOOK_STATE_DIR": str(logs / "hook-state")}
    with LiveServer(log_dir=logs, no_model=True, env=env) as live:
        yield live


@pytest.fixture(scope="module")
def strict_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """``--no-model`` with ``min_turns`` 3: a stop after fewer steps is refused (a team that wants
    every change checked before the agent finishes)."""
    logs = tmp_path_factory.mktemp("strict")
    env = {"STOPSERVE_SAFETY": '{"min_turns": 3}', "STOPSERVE_HOOK_STATE_DIR": str(logs / "hook-state")}
    with LiveServer(log_dir=logs, no_model=True, env=env) as live:
        yield live
