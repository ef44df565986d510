"""Issue 13, item 4: a failed write leaves the log as it was; recovery repairs every torn line."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_service_app import make_client, turn_events

from stopserve.service.log import JsonlLog


class FlakyDisk:
    """``os.write`` that can be told to run out of space after some bytes (a write cut mid-line)."""

    def __init__(self) -> None:
        self.room: int | None = None  # bytes left before ENOSPC; None: unlimited

    def __call__(self, fd: int, data: bytes | memoryview) -> int:
        if self.room is None:
            return os.write(fd, data)
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = os.write(fd, bytes(data[: self.room]))
        self.room -= n
        return n


def parsed(path: Path) -> list[dict[str, object]]:
    raw = path.read_bytes()
    assert not raw or raw.endswith(b"\n"), "a torn last line"
    return [json.loads(line) for line in raw.splitlines()]


@pytest.mark.parametrize("fsync", ["always", "interval"])
def test_a_write_cut_by_a_full_disk_is_undone(tmp_path: Path, fsync: str) -> None:
    disk = FlakyDisk()
    path = tmp_path / "d.jsonl"
    log = JsonlLog(path, fsync=fsync, write=disk)  # type: ignore[arg-type]
    log.append({"n": 1})
    before = path.read_bytes()
    disk.room = 7  # the next line is cut after 7 bytes
    with pytest.raises(OSError) as info:
        log.append({"n": 2, "pad": "x" * 50})
    assert info.value.errno == errno.ENOSPC
    assert path.read_bytes() == before  # the file is as it was: no partial line
    disk.room = None  # space returns
    log.append({"n": 3})
    log.close()
    assert parsed(path) == [{"n": 1}, {"n": 3}]


def test_recovery_repairs_or_quarantines_every_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    good = [{"kind": "decision", "n": i} for i in range(5)]
    raw = [json.dumps(g).encode() for g in good]
    path.write_bytes(
        raw[0]
        + b"\n"
        + b'{"kind": "decision", "n": 9, "pa'
        + raw[1]
        + b"\n"  # a cut line, then the next record
        + raw[2]
        + b"\n"
        + b"\x00\x00garbage\n"
        + raw[3]
        + b"\n"
        + raw[4]
        + b"\n"
        + b'{"kind": "deci'  # a torn tail
    )
    log = JsonlLog(path)
    log.append({"kind": "decision", "n": 5})
    log.close()
    assert parsed(path) == [*good, {"kind": "decision", "n": 5}]
    quarantine = tmp_path / "d.quarantine"
    kept = quarantine.read_bytes()
    assert b'"n": 9, "pa' in kept and b"garbage" in kept and b'{"kind": "deci' in kept
    # a clean file is left alone (no quarantine written)
    clean = tmp_path / "c.jsonl"
    clean.write_bytes(raw[0] + b"\n")
    JsonlLog(clean).close()
    assert clean.read_bytes() == raw[0] + b"\n" and not (tmp_path / "c.quarantine").exists()


def test_the_service_answers_503_on_a_full_disk_and_loses_nothing_answered(tmp_path: Path) -> None:
    disk = FlakyDisk()
    with make_client(tmp_path) as c:
        engine = c.app.state.engine  # type: ignore[attr-defined]
        engine.log.decisions._write = disk
        answered = []
        for i in range(3):
            r = c.post(f"/v1/runs/r{i}/decide", json={"events": turn_events(0)})
            assert r.status_code == 200
            answered.append(f"r{i}")
        disk.room = 20
        r = c.post("/v1/runs/full/decide", json={"events": turn_events(0)})
        assert r.status_code == 503 and r.json()["error"]["type"] == "log_unavailable"
        disk.room = None
        r = c.post("/v1/runs/full/decide", json={"events": turn_events(0)})
        assert r.status_code == 200
        answered.append("full")
    rows = parsed(tmp_path / "logs" / "decisions.jsonl")
    assert [x["run_id"] for x in rows] == answered


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (the tests run as root); skipped where mounting is not permitted."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); "
            "the injected-error tests cover the same path"
        )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_real_full_tmpfs(tmpfs: Path, tmp_path: Path) -> None:
    logs = tmpfs / "logs"
    answered: list[tuple[str, int]] = []
    refused = 0
    with make_client(tmp_path, log_dir=logs) as c:
        filler = tmpfs / "filler"
        with filler.open("wb", buffering=0) as fh:  # fill the disk to the last byte
            try:
                while True:
                    fh.write(b"\0" * 4096)
            except OSError:
                pass
        for turn in range(200):
            r = c.post(f"/v1/runs/t{turn % 7}/decide", json={"events": turn_events(turn // 7)})
            if r.status_code == 200:
                answered.append((f"t{turn % 7}", r.json()["turn"]))
            else:
                assert r.status_code == 503, r.text
                refused += 1
        assert refused > 0, "the disk never filled"
        filler.unlink()  # space returns
        r = c.post("/v1/runs/after/decide", json={"events": turn_events(0)})
        assert r.status_code == 200
        answered.append(("after", 1))
    rows = parsed(logs / "decisions.jsonl")  # every line whole
    logged = {(x["run_id"], x["turn"]) for x in rows}
    assert set(answered) <= logged
