"""The live page's follower reads only what was appended: by file offset, across rotations."""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from stopserve.report.live import LiveLogs


def _decision(run: str, seq: int, action: str = "continue") -> bytes:
    rec = {"kind": "decision", "ts": 1_700_000_000.0 + seq, "run_id": run, "seq": seq, "action": action}
    return orjson.dumps(rec) + b"\n"


def test_a_look_reads_only_the_bytes_appended_since_the_last(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    first = b"".join(_decision(f"r{i}", 0) for i in range(100))
    path.write_bytes(first)
    live = LiveLogs(tmp_path, ttl_s=0.0)
    assert live.summary().n_decisions == 100 and live.last_read == len(first)
    more = b"".join(_decision(f"r{i}", 1) for i in range(10))
    with path.open("ab") as fh:
        fh.write(more)
    s = live.summary()
    assert s.n_decisions == 110 and s.n_runs == 100
    assert live.last_read == len(more)  # not the whole file again
    assert live.summary().n_decisions == 110 and live.last_read == 0


def test_a_half_written_line_waits_for_its_end(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    line = _decision("r", 0)
    path.write_bytes(line + line[:20])
    live = LiveLogs(tmp_path, ttl_s=0.0)
    assert live.summary().n_decisions == 1 and live.summary().n_problems == 0
    with path.open("ab") as fh:
        fh.write(line[20:])
    assert live.summary().n_decisions == 2 and live.summary().n_problems == 0


def test_a_rotation_is_followed_without_reading_anything_twice(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    path.write_bytes(_decision("a", 0) + _decision("a", 1))
    live = LiveLogs(tmp_path, ttl_s=0.0)
    assert live.summary().n_decisions == 2
    with path.open("ab") as fh:
        fh.write(_decision("a", 2))
    # the service rotates: the file is renamed (same inode) and a new one starts
    os.rename(path, tmp_path / "decisions.20261203T000000.000000.jsonl")
    path.write_bytes(_decision("b", 0))
    s = live.summary()
    assert s.n_decisions == 4 and s.n_runs == 2


def test_the_first_look_at_a_big_log_reads_its_newest_window_only(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    lines = [_decision(f"r{i}", 0) for i in range(5000)]
    path.write_bytes(b"".join(lines))
    size = path.stat().st_size
    live = LiveLogs(tmp_path, window_bytes=size // 10, ttl_s=0.0)
    s = live.summary()
    assert live.last_read <= size // 10
    assert 0 < s.n_decisions <= 500 + 1 and s.n_problems == 0  # started at a whole line
    assert s.window is not None and f"newest {size // 10 / 1024:.1f} KiB of each log" in s.window
    assert "r4999" in {r.run_id for r in s.runs}  # the newest are there


def test_after_a_long_gap_it_starts_over_from_the_newest_window(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    path.write_bytes(_decision("old", 0))
    live = LiveLogs(tmp_path, window_bytes=4096, ttl_s=0.0)
    assert live.summary().n_runs == 1
    with path.open("ab") as fh:
        fh.write(b"".join(_decision(f"new{i}", 0) for i in range(500)))
    s = live.summary()
    assert live.last_read <= 4096
    assert "old" not in {r.run_id for r in s.runs}
