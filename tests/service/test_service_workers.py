"""Issue 13, item 8: ``--workers N > 1`` would split a run's state across processes: refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("how", ["option", "variable"])
def test_more_than_one_worker_is_refused_with_the_alternative(tmp_path: Path, how: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STOPSERVE_")}
    env["PYTHONPATH"] = str(ROOT)
    argv = [
        sys.executable,
        "-m",
        "stopserve.cli",
        "serve",
        "--no-model",
        "--port",
        "0",
        "--log-dir",
        str(tmp_path),
    ]
    if how == "option":
        argv += ["--workers", "2"]
    else:
        env["STOPSERVE_WORKERS"] = "3"
    try:
        done = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the server started with several workers instead of refusing")
    assert done.returncode == 2, done.stderr
    err = done.stderr
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3, err
    assert "one worker" in err and "shared run store" in err and "sidecar" in err
    assert ("--workers" if how == "option" else "STOPSERVE_WORKERS") in err
