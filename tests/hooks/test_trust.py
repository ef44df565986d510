"""Codex hook trust (``stopserve.hooks.trust``) and ``stopserve hook doctor`` without the binary.

The hash below is the one Codex CLI 0.169.0 itself reported (``codex app-server``,
``hooks/list``, ``currentHash``) for a ``PostToolUse`` handler ``{"type": "command",
"command": "/tmp/hx/cap.py"}`` (no timeout: 600); tests/harness checks the live ones."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from stopserve.cli import main
from stopserve.errors import ConfigError
from stopserve.hooks.install import codex_handlers
from stopserve.hooks.trust import hook_hash, hook_key, trust, trust_status

CODEX_0_169 = "sha256:70efc01a3c29896be7a76cf38b624b0e9d7fe288cc160fb72932fa1a1c24eb73"


def test_the_hash_is_codex_s() -> None:
    assert hook_hash("PostToolUse", {"type": "command", "command": "/tmp/hx/cap.py"}) == CODEX_0_169
    assert (
        hook_hash("PostToolUse", {"type": "command", "command": "/tmp/hx/cap.py", "timeout": 600})
        == CODEX_0_169
    )
    assert (
        hook_key(Path("/h/.codex/hooks.json"), "PreToolUse", 1, 0) == "/h/.codex/hooks.json:pre_tool_use:1:0"
    )


def _installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> tuple[Path, Path]:
    home = tmp_path / ".codex"
    monkeypatch.setenv("CODEX_HOME", str(home))
    assert main(["hook", "install", "codex", "--url", "http://127.0.0.1:9", *extra]) == 0
    return home / "hooks.json", home / "config.toml"


def test_trust_writes_codex_s_entries_and_keeps_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / ".codex").mkdir()
    config = tmp_path / ".codex" / "config.toml"
    config.write_text('model = "gpt-5.5"\n\n[projects."/repo"]\ntrust_level = "trusted"\n')
    hooks, config = _installed(tmp_path, monkeypatch)
    out = capsys.readouterr().out
    assert "will not run 4 of these hooks" in out and "--dangerously-bypass-hook-trust" in out
    assert {e.status for e in trust_status(hooks, codex_handlers(hooks), config)} == {"untrusted"}
    _installed(tmp_path, monkeypatch, "--trust")
    assert "trusted 4 stopserve hook(s)" in capsys.readouterr().out
    data = tomllib.loads(config.read_text())
    assert data["model"] == "gpt-5.5" and data["projects"]["/repo"] == {"trust_level": "trusted"}
    assert {e.status for e in trust_status(hooks, codex_handlers(hooks), config)} == {"trusted"}
    assert len(list(config.parent.glob("config.toml.*.stopserve.bak"))) == 1
    # another option: a new command, so Codex's trust no longer holds
    _installed(tmp_path, monkeypatch, "--mode", "shadow")
    assert "trusted again" in capsys.readouterr().out
    entries = trust_status(hooks, codex_handlers(hooks), config)
    assert {e.status for e in entries} == {"modified"}
    assert main(["hook", "doctor", "codex"]) == 1
    assert "changed since it was trusted" in capsys.readouterr().out
    _installed(tmp_path, monkeypatch, "--mode", "shadow", "--trust")  # trusted again, in place
    assert {e.status for e in trust_status(hooks, codex_handlers(hooks), config)} == {"trusted"}
    assert config.read_text().count("[hooks.state.") == 4


def test_a_config_it_cannot_edit_safely_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hooks, config = _installed(tmp_path, monkeypatch)
    config.write_text("model = [unclosed\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        trust(trust_status(hooks, codex_handlers(hooks), config), config)
    assert config.read_text() == "model = [unclosed\n"


def test_doctor_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / ".claude"))
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / ".codex"))
    assert main(["hook", "doctor"]) == 0
    assert "not installed" in capsys.readouterr().out
    # an install by an older stopserve: no PreToolUse, and a command with a bad argument
    (tmp_path / ".claude").mkdir()
    cmd = "python3 -m stopserve hook claude-code --url http://127.0.0.1:9 --max-blocks abc"
    handler = {"hooks": [{"type": "command", "command": cmd, "timeout": 5}]}
    (tmp_path / ".claude" / "settings.json").write_text(
        '{"hooks": {"Stop": [%s], "PostToolUse": [%s]}}' % ((__import__("json").dumps(handler),) * 2)
    )
    assert main(["hook", "doctor", "claude-code", "--state-dir", str(tmp_path / "state")]) == 1
    out = capsys.readouterr().out
    assert "missing on SubagentStop, PreToolUse, PostToolUseFailure" in out
    assert "bad argument" in out and "abc" in out
    assert "the service at http://127.0.0.1:9: unreachable" in out and "never run yet" in out
