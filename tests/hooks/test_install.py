"""``stopserve hook install|uninstall``: merge into existing settings, keep a backup, install
twice adds nothing, uninstall removes only ours; for both harnesses' files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stopserve.cli import main
from stopserve.errors import ConfigError
from stopserve.hooks.install import EVENTS, install, is_ours, settings_path, uninstall

THEIRS = {"type": "command", "command": "python3 .claude/hooks/lint.py", "timeout": 30}


def existing(path: Path) -> dict[str, object]:
    data = {
        "model": "opus",
        "permissions": {"allow": ["Bash(git status)"]},
        "hooks": {
            "Stop": [{"hooks": [THEIRS]}],
            "PreToolUse": [{"matcher": "Bash", "hooks": [THEIRS]}],
        },
    }
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data, indent=2))
    return data


@pytest.mark.parametrize("harness", ["claude-code", "codex"])
def test_install_merges_keeps_a_backup_and_is_idempotent(
    harness: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = settings_path(harness, tmp_path)
    assert path == tmp_path / (".claude/settings.json" if harness == "claude-code" else ".codex/hooks.json")
    before = existing(path)
    assert (
        main(["hook", "install", harness, "--project", str(tmp_path), "--url", "http://127.0.0.1:9000"]) == 0
    )
    out = capsys.readouterr().out
    data = json.loads(path.read_text())
    assert data["model"] == "opus" and data["permissions"] == before["permissions"]  # untouched
    assert data["hooks"]["PreToolUse"][0] == {"matcher": "Bash", "hooks": [THEIRS]}  # theirs kept, first
    for event in EVENTS[harness]:
        ours = [h for g in data["hooks"][event] for h in g["hooks"] if is_ours(h)]
        assert len(ours) == 1 and "--url http://127.0.0.1:9000" in ours[0]["command"]
        assert ours[0]["type"] == "command" and ours[0]["timeout"] == 5
    assert data["hooks"]["Stop"][0] == {"hooks": [THEIRS]}  # theirs first, still there
    (backup,) = path.parent.glob("*.stopserve.bak")
    assert json.loads(backup.read_text()) == before and "backup" in out
    if harness == "codex":  # Codex runs new hooks only once trusted, and `codex exec` never asks
        assert "/hooks" in out and "--dangerously-bypass-hook-trust" in out and "--trust" in out
    text = path.read_text()
    assert (
        main(["hook", "install", harness, "--project", str(tmp_path), "--url", "http://127.0.0.1:9000"]) == 0
    )
    assert "nothing changed" in capsys.readouterr().out
    assert path.read_text() == text and len(list(path.parent.glob("*.stopserve.bak"))) == 1
    # a new URL updates our entries in place: still one each
    install(harness, "stopserve hook " + harness + " --url http://10.0.0.1:1", project=tmp_path)
    data = json.loads(path.read_text())
    assert [h["command"] for g in data["hooks"]["Stop"] for h in g["hooks"] if is_ours(h)] == [
        "stopserve hook " + harness + " --url http://10.0.0.1:1"
    ]
    assert main(["hook", "uninstall", harness, "--project", str(tmp_path)]) == 0
    assert json.loads(path.read_text()) == before  # only ours removed, the rest as it was
    assert uninstall(harness, project=tmp_path).changed is False


def test_install_into_a_new_file_and_the_handler_command(tmp_path: Path) -> None:
    result = install("claude-code", "/venv/bin/python -m stopserve hook claude-code", project=tmp_path)
    assert result.backup is None and result.added == list(EVENTS["claude-code"])
    data = json.loads(result.path.read_text())
    assert set(data) == {"hooks"} and set(data["hooks"]) == set(EVENTS["claude-code"])


def test_a_settings_file_that_is_not_json_is_refused_with_its_line(tmp_path: Path) -> None:
    path = settings_path("claude-code", tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text('{\n  "hooks": {\n    "Stop": [,]\n  }\n}\n')
    with pytest.raises(ConfigError) as info:
        install("claude-code", "stopserve hook claude-code", project=tmp_path)
    assert "settings.json:3" in str(info.value) and "nothing was changed" in str(info.value)
    assert path.read_text().startswith('{\n  "hooks"')  # untouched
    path.write_text('{"hooks": {"Stop": {"not": "a list"}}}')
    with pytest.raises(ConfigError, match=r"hooks\.Stop"):
        install("claude-code", "stopserve hook claude-code", project=tmp_path)


def test_is_ours_knows_our_command_and_nothing_else() -> None:
    assert is_ours({"command": "'/opt/py 3/bin/python' -m stopserve hook codex --mode shadow"})
    assert is_ours({"command": "stopserve hook claude-code"})
    assert not is_ours({"command": "python3 my_stopserve_hook.py"})
    assert not is_ours({"command": "echo stopserve hooked"})
    assert not is_ours("stopserve hook codex")


@pytest.mark.parametrize("harness", ["claude-code", "codex"])
def test_uninstall_into_a_file_of_ours_alone_leaves_no_empty_hooks(harness: str, tmp_path: Path) -> None:
    assert main(["hook", "install", harness, "--project", str(tmp_path)]) == 0
    path = settings_path(harness, tmp_path)
    assert main(["hook", "uninstall", harness, "--project", str(tmp_path)]) == 0
    assert json.loads(path.read_text()) == {}


@pytest.mark.parametrize("url", ["not-a-url", "127.0.0.1:8080", "ftp://host/", "http://", "http://h:99999"])
def test_install_refuses_a_url_that_is_no_service_url(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["hook", "install", "claude-code", "--project", str(tmp_path), "--url", url]) == 2
    err = capsys.readouterr().err
    assert f"--url {url!r}" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not settings_path("claude-code", tmp_path).exists()
