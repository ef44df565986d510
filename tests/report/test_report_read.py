"""Bad input: empty, truncated, torn or foreign logs give one clear line and a report of the rest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from stopserve.report.commands import summarize_dirs
from stopserve.report.read import read_records


def _stopserve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stopserve", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_a_truncated_last_line_is_named_and_every_whole_line_is_read(logs: Path) -> None:
    path = logs / "decisions.jsonl"
    whole = path.read_bytes().splitlines()
    path.write_bytes(b"\n".join(whole) + b"\n" + whole[0][:40])  # a write cut short
    s = summarize_dirs([logs])
    assert s.n_decisions == len(whole)
    assert s.n_problems == 1
    assert str(s.problems[0]) == f"{path}:{len(whole) + 1}: the last line is cut short (no newline): skipped"


def test_a_torn_line_in_the_middle_names_its_line_and_the_rest_is_read(logs: Path) -> None:
    path = logs / "decisions.jsonl"
    lines = path.read_bytes().splitlines()
    lines[3] = lines[3][:25]  # a crash tore it; later lines are whole
    path.write_bytes(b"\n".join(lines) + b"\n")
    s = summarize_dirs([logs])
    assert s.n_decisions == len(lines) - 1
    assert [str(p) for p in s.problems] == [f"{path}:4: not JSON (a torn or foreign line): skipped"]


def test_a_whole_record_without_its_newline_is_read_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    path.write_bytes(orjson.dumps({"kind": "decision", "run_id": "r", "action": "continue"}))
    got: list[object] = []
    chunk = read_records(path, lambda kind, rec: got.append(kind))
    assert got == ["decision"] and not chunk.problems and chunk.end == path.stat().st_size


def test_a_line_left_unfinished_is_left_for_the_next_read(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    line = orjson.dumps({"kind": "decision", "run_id": "r", "action": "continue"})
    path.write_bytes(line + b"\n" + line[:10])
    got: list[object] = []
    chunk = read_records(path, lambda kind, rec: got.append(kind), partial="leave")
    assert got == ["decision"] and chunk.partial and chunk.end == len(line) + 1 and not chunk.problems


def test_an_empty_directory_says_so_in_one_line_and_still_writes_a_report(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "r.html"
    done = _stopserve("report", str(empty), "--html", str(out))
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"stopserve report: {empty}: no stopserve log found (decisions.jsonl, traces.jsonl, a hook's "
        "decisions.jsonl or models/promotions.jsonl)"
    ]
    assert "Traceback" not in done.stderr
    html = out.read_text()
    assert "No runs in these logs yet." in html and "no stopserve log found" in html


def test_a_foreign_directory_names_the_first_problem_and_how_many_more(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "decisions.jsonl").write_text('{"level": "info", "msg": "hello"}\n[1, 2]\nnot json at all\n')
    (foreign / "traces.jsonl").write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00binary\x00\x00\n")
    done = _stopserve("report", str(foreign))
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"stopserve report: {foreign / 'decisions.jsonl'}:1: not a stopserve log record "
        "(its keys: level, msg): skipped (and 3 more problems, 2 files with nothing readable); "
        "the rest was read"
    ]
    assert "Traceback" not in done.stderr
    assert done.stdout.startswith(f"{foreign}: 0 runs, 0 decisions")


def test_a_truncated_directory_reports_what_could_be_read(logs: Path, tmp_path: Path) -> None:
    path = logs / "traces.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 300])  # the last trace cut short
    out = tmp_path / "r.html"
    done = _stopserve("report", str(logs), "--html", str(out))
    assert done.returncode == 0
    n = data.count(b"\n")
    assert done.stderr.strip() == (
        f"stopserve report: {path}:{n}: the last line is cut short (no newline): skipped; the rest was read"
    )
    html = out.read_text()
    assert "1 line could not be read" in html and f"{path}:{n}" in html
    assert 'id="n-runs">6<' in html  # the run is still known from its decisions


def test_a_missing_directory_or_a_file_is_a_one_line_error(tmp_path: Path) -> None:
    done = _stopserve("report", str(tmp_path / "nope"))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"stopserve report: error: {tmp_path / 'nope'}: no such directory (give the service's log directory, "
        "e.g. stopserve-logs)"
    )
    f = tmp_path / "traces.jsonl"
    f.write_text("")
    done = _stopserve("report", str(f))
    assert done.returncode == 2 and "a file, not a directory" in done.stderr
    assert "Traceback" not in done.stderr
