"""``stopserve validate`` and ``stopserve import``: output format and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stopserve.cli import IMPORT_FORMATS, main


def _trace(trace_id: str, **ev: Any) -> dict[str, Any]:
    event = {"id": "e1", "t": 0, "type": "return", "agent": "a", **ev}
    return {"trace_id": trace_id, "task_id": "t", "events": [event]}


def _jsonl(path: Path, *items: Any) -> str:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in items))
    return str(path)


def test_validate_all_valid_exits_0(tmp_path: Path, capsys) -> None:
    good = _jsonl(tmp_path / "good.jsonl", _trace("a"), _trace("b"))
    assert main(["validate", good]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["valid: all 2 traces in 1 file(s)"]


def test_validate_lists_every_error_then_a_summary(tmp_path: Path, capsys) -> None:
    runs = _jsonl(
        tmp_path / "runs.jsonl",
        _trace("ok"),
        _trace("abc", type="spwan", tokens=-1),
        "{not json",
    )
    empty = tmp_path / "empty.json"
    empty.write_text("")
    rc = main(["validate", runs, str(empty)])
    lines = capsys.readouterr().out.splitlines()
    assert rc == 1
    assert lines[0].startswith(
        f"{runs}:2: trace 'abc': events[0].type: 'spwan' is not one of spawn, delegate,"
    )
    assert (
        lines[1]
        == f"{runs}:2: trace 'abc': events[0].tokens: Input should be greater than or equal to 0 (got -1)"
    )
    assert lines[2].startswith(f"{runs}:3: not valid JSON")
    assert lines[3] == f"{empty}: file is empty: no traces"
    assert lines[-1] == "invalid: 1 of 2 traces invalid, 2 unreadable input(s) (4 problems) in 2 file(s)"
    assert len(lines) == 5


def test_validate_max_errors_and_strict(tmp_path: Path, capsys) -> None:
    bad = [_trace(f"r{i}", usd=-1.0) for i in range(5)]
    path = _jsonl(tmp_path / "bad.jsonl", *bad)
    assert main(["validate", path, "--max-errors", "2"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "... 3 more problems not shown (--max-errors 2)"
    extra = _jsonl(tmp_path / "extra.jsonl", {**_trace("x"), "note": "hi"})
    assert main(["validate", extra]) == 0
    assert main(["validate", "--strict", extra]) == 1
    assert f"{extra}:1: trace 'x': note: unknown top-level field (--strict)" in capsys.readouterr().out


def test_validate_missing_file_is_reported_not_raised(tmp_path: Path, capsys) -> None:
    assert main(["validate", str(tmp_path / "nope.jsonl")]) == 1
    out = capsys.readouterr().out
    assert "nope.jsonl: cannot open" in out and "Traceback" not in out


def test_validate_in_a_real_process(tmp_path: Path) -> None:
    bad = _jsonl(tmp_path / "bad.jsonl", _trace("abc", type="spwan"))
    binary = tmp_path / "blob.json"
    binary.write_bytes(b"\x00\x01\x02" * 100)
    proc = subprocess.run(
        [sys.executable, "-m", "stopserve.cli", "validate", bad, str(binary)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr + proc.stdout
    assert f"{bad}:1: trace 'abc': events[0].type: 'spwan' is not one of" in proc.stdout
    assert f"{binary}: binary content (NUL byte): not a JSON trace file" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("invalid: 1 of 1 traces invalid, 1 unreadable input(s)")


def test_validate_stays_light(tmp_path: Path) -> None:
    # the CLI imports a command's module only when it runs: validate needs no model, no server
    good = _jsonl(tmp_path / "good.jsonl", _trace("abc"))
    code = (
        "import sys; from stopserve.cli import main; rc = main(['validate', sys.argv[1]]); "
        "heavy = {'lightgbm', 'numpy', 'fastapi', 'starlette', 'uvicorn', 'tqdm', 'httpx'}; "
        "print(sorted({n.split('.')[0] for n in sys.modules} & heavy), rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code, good], capture_output=True, text=True, check=True)
    assert proc.stdout.splitlines()[-1] == "[] 0", proc.stdout + proc.stderr


def test_training_commands_name_their_extra_when_it_is_missing(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # None in sys.modules: "not installed"
    traces = _jsonl(tmp_path / "t.jsonl", _trace("abc"))
    assert main(["train", traces, "-o", str(tmp_path / "model")]) == 2
    err = capsys.readouterr().err
    assert "stopserve train: error: this command needs the [train] extra (tqdm is not installed)" in err
    assert "pip install -e '.[train]'" in err and "Traceback" not in err
    assert not (tmp_path / "model").exists()


def test_import_needs_no_progress_bar(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # a service install: no [train] extra
    src = _jsonl(tmp_path / "in.jsonl", _trace("abc"))
    out = tmp_path / "out.jsonl"
    assert main(["import", "survey", src, "-o", str(out)]) == 0
    assert "imported 1 traces" in capsys.readouterr().out and out.exists()


def test_version_and_help_on_every_command(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.startswith("stopserve ")
    for command in ("validate", "import", "features", "train", "evaluate", "simulate", "serve"):
        with pytest.raises(SystemExit) as info:
            main([command, "--help"])
        assert info.value.code == 0
        assert f"usage: stopserve {command}" in capsys.readouterr().out


def test_import_rejects_options_of_other_formats(tmp_path: Path, capsys) -> None:
    src = _jsonl(tmp_path / "s.jsonl", _trace("a"))
    rc = main(["import", "survey", src, "-o", str(tmp_path / "o.jsonl"), "--reward", "1"])
    assert rc == 2 and "--reward applies to openai-chat only" in capsys.readouterr().err


def test_import_every_format_name_is_registered() -> None:
    from stopserve.importers import IMPORTERS

    assert set(IMPORTERS) == set(IMPORT_FORMATS)


def test_import_nothing_readable_writes_nothing(tmp_path: Path, capsys) -> None:
    src = tmp_path / "junk.jsonl"
    src.write_text("{oops\n")
    out = tmp_path / "o.jsonl"
    assert main(["import", "survey", str(src), "-o", str(out), "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert "imported 0 traces" in captured.out and "skipped 1 (1x not valid JSON" in captured.out
    assert f"skipped: {src}:1: not valid JSON" in captured.err
    assert not out.exists() and list(tmp_path.iterdir()) == [src]


@pytest.mark.parametrize("fmt", IMPORT_FORMATS)
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x00\x01\x02\xff" * 64, "binary content (NUL byte)"),
        (b"", "file is empty"),
        (b'{"a": [1, 2', "not valid JSON"),
    ],
)
def test_import_bad_files_in_every_format(
    tmp_path: Path, capsys, fmt: str, content: bytes, message: str
) -> None:
    src = tmp_path / "bad.traj.json"
    src.write_bytes(content)
    rc = main(["import", fmt, str(src), "-o", str(tmp_path / "o.jsonl"), "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 2
    assert f"skipped: {src}" in captured.err and message in captured.err
    assert "Traceback" not in captured.err + captured.out


def test_import_to_a_folder_or_missing_folder_is_a_clear_error(tmp_path: Path, capsys) -> None:
    src = _jsonl(tmp_path / "s.jsonl", _trace("a"))
    assert main(["import", "survey", src, "-o", str(tmp_path), "--no-progress"]) == 2
    assert "is a folder; give the output file" in capsys.readouterr().err
    assert main(["import", "survey", src, "-o", str(tmp_path / "no" / "o.jsonl"), "--no-progress"]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_a_misspelt_field_is_a_warning_and_an_error_with_strict(tmp_path: Path, capsys) -> None:
    runs = _jsonl(tmp_path / "runs.jsonl", _trace("abc", tokns=12, trusted=True, cache_write_tokens=3))
    assert main(["validate", runs]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"warning: {runs}:1: trace 'abc': events[0].tokns: unknown field 'tokns' (did you mean 'tokens'?); "
        "kept as an extra field"
    )
    assert (
        len(out) == 2 and "1 warning(s)" in out[-1]
    )  # the survey's `trusted`, an importer's extra: no warning
    assert main(["validate", "--strict", runs]) == 1
    out = capsys.readouterr().out
    assert "events[0].tokns: unknown field 'tokns' (did you mean 'tokens'?) (--strict)" in out


def test_train_lists_every_bad_trace_as_validate_does(tmp_path: Path, capsys) -> None:
    good = [{**_trace(f"ok{i}"), "task_id": f"t{i}", "rewards": {"team": 1.0}} for i in range(3)]
    runs = _jsonl(
        tmp_path / "runs.jsonl", good[0], _trace("bad1", type="spwan"), good[1], _trace("bad2", t=-1), good[2]
    )
    assert main(["train", runs, "-o", str(tmp_path / "model"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "2 of 5 traces invalid" in err
    assert f"{runs}:2: trace 'bad1': events[0].type" in err and f"{runs}:4: trace 'bad2': events[0].t" in err
    assert not (tmp_path / "model").exists()
