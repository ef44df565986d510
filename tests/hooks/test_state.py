"""The state directory: atomic saves, a lock that gives up at the deadline, bounded logs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stopserve.hooks import state as state_mod
from stopserve.hooks.state import StateDir


def test_save_load_and_no_temp_files_left(tmp_path: Path) -> None:
    sd = StateDir(tmp_path)
    assert sd.load("s:1") is None
    sd.save("s:1", {"offset": 10, "pending": [{"id": "e1"}]})
    sd.save("s:1", {"offset": 20, "pending": []})
    assert sd.load("s:1") == {"offset": 20, "pending": []}
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["s+1.json"]
    (tmp_path / "runs" / "s+1.json").write_text("{half")
    assert sd.load("s:1") is None and "unreadable" in (tmp_path / "hook.log").read_text()


def test_the_lock_gives_up_at_the_deadline(tmp_path: Path) -> None:
    sd = StateDir(tmp_path)
    with sd.lock("run", time.monotonic() + 1):
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="locked by another hook call"), sd.lock("run", start + 0.05):
            pass
    with sd.lock("run", time.monotonic()):  # free again once released
        pass


def test_logs_rotate_and_records_skip_bad_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_mod, "LOG_MAX_BYTES", 100)
    sd = StateDir(tmp_path)
    for i in range(10):
        sd.append("decisions.jsonl", {"i": i, "pad": "x" * 20})
    with (tmp_path / "decisions.jsonl").open("a") as fh:
        fh.write("not json\n")
    assert (tmp_path / "decisions.jsonl.1").exists()
    seen = [r["i"] for r in sd.records("decisions.jsonl")]
    assert seen == sorted(seen) and seen[-1] == 9 and len(seen) < 10  # older ones rotated away


def test_the_default_state_dir_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STOPSERVE_HOOK_STATE", str(tmp_path / "here"))
    assert StateDir().root == tmp_path / "here"
    monkeypatch.delenv("STOPSERVE_HOOK_STATE")
    assert StateDir().root.parts[-2:] == ("stopserve", "hooks")
