"""Without its framework, each integration says which extra to install."""

from __future__ import annotations

import importlib
import sys

import pytest

CASES = [
    ("stopserve.integrations.autogen", "autogen_agentchat.base", "autogen-agentchat"),
    ("stopserve.integrations.langgraph", "langchain_core.messages", "langgraph"),
    ("stopserve.integrations.openai_agents", "agents", "openai-agents"),
]


@pytest.mark.parametrize(("module", "hidden", "package"), CASES)
def test_missing_framework_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, hidden: str, package: str
) -> None:
    monkeypatch.setitem(sys.modules, hidden, None)  # None in sys.modules: "not installed"
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError) as err:
        importlib.import_module(module)
    assert "pip install -e '.[integrations]'" in str(err.value)
    assert package in str(err.value)
