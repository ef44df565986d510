"""The append-only JSON Lines log: rotation, torn tails, restarts, concurrent writers."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from stopserve.service.log import DecisionLog, JsonlLog


def read(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_append_and_restart_continue(tmp_path: Path) -> None:
    log = JsonlLog(tmp_path / "d.jsonl", fsync="always")
    log.append({"n": 1})
    log.close()
    log = JsonlLog(tmp_path / "d.jsonl")
    log.append({"n": 2})
    log.close()
    assert read(tmp_path / "d.jsonl") == [{"n": 1}, {"n": 2}]


def test_torn_last_line_is_cut_on_open(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"n": 1}\n{"n": 2}\n{"n": 3, "par')
    log = JsonlLog(path)
    log.append({"n": 4})
    log.close()
    assert read(path) == [{"n": 1}, {"n": 2}, {"n": 4}]
    only_torn = tmp_path / "t.jsonl"
    only_torn.write_bytes(b'{"half')
    JsonlLog(only_torn).close()
    assert only_torn.read_bytes() == b""


def test_size_rotation_keeps_every_line(tmp_path: Path) -> None:
    log = JsonlLog(tmp_path / "d.jsonl", max_bytes=4096)
    for i in range(500):
        log.append({"n": i, "pad": "x" * 40})
    log.close()
    files = sorted(tmp_path.glob("d*.jsonl"))
    assert len(files) > 3
    assert all(f.stat().st_size <= 4096 for f in files)
    rotated = [f for f in files if f.name != "d.jsonl"]
    assert all(f.name.startswith("d.") for f in rotated)
    numbers = sorted(int(x["n"]) for f in files for x in read(f))  # type: ignore[call-overload]
    assert numbers == list(range(500))


def test_threads_never_interleave_or_lose_lines(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path, fsync="interval", fsync_interval_s=0.01, max_bytes=64 * 1024)

    def writer(k: int) -> None:
        for i in range(300):
            log.decision({"w": k, "i": i, "blob": "y" * (i % 50)})

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    got = [(x["w"], x["i"]) for f in tmp_path.glob("decisions*.jsonl") for x in read(f)]
    assert sorted(got) == sorted((k, i) for k in range(4) for i in range(300))  # type: ignore[type-var]
