"""Every command that can run past a few seconds shows a labelled bar on a terminal, and
``--no-progress`` turns it off. The commands run in a subprocess with a real terminal (a
pty) as stderr; the bars' start-up delay is set to 0 so that small inputs show them too."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN = (
    "import stopserve.progress as p, sys; p._OPTIONS['delay'] = 0; "
    "from stopserve.cli import main; sys.exit(main(sys.argv[1:]))"
)


def on_a_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``stopserve ARGS`` with stderr on a pty; what it wrote there."""
    master, slave = pty.openpty()
    # a terminal of 100 columns (a new pty has none, and tqdm draws nothing in 0 columns)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STOPSERVE_")}
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN, *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=slave
    )
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=300), seen.decode(errors="replace")


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stopserve.cli import main

    d = tmp_path_factory.mktemp("progress")
    assert main(["import", "mint", str(ROOT / "examples" / "mint-sample"), "-o", str(d / "runs.jsonl")]) == 0
    assert main(["train", str(d / "runs.jsonl"), "-o", str(d / "model"), "--no-progress"]) == 0
    return d


COMMANDS = [
    (["import", "mint", str(ROOT / "examples" / "mint-sample"), "-o", "again.jsonl"], "import mint"),
    (["validate", "runs.jsonl"], "validate runs.jsonl"),
    (["simulate", "--n", "50", "-o", "sim.jsonl"], "simulate"),
    (["features", "runs.jsonl", "-o", "features.csv"], "decision points"),
    (["train", "runs.jsonl", "-o", "model2"], "train (fold fits, tunings, replays, final fit)"),
    (["evaluate", "--model", "model", "runs.jsonl", "--json"], "replay"),
    (["credit", "runs.jsonl", "--json"], "credit"),
]


@pytest.mark.parametrize(("args", "label"), COMMANDS, ids=[c[0][0] for c in COMMANDS])
def test_a_long_command_shows_a_labelled_bar_unless_told_not_to(
    args: list[str], label: str, work: Path
) -> None:
    rc, err = on_a_terminal(args, work)
    assert rc == 0, err
    assert f"{label}:" in err, err
    rc, err = on_a_terminal([*args, "--no-progress"], work)
    assert rc == 0, err
    assert f"{label}:" not in err, err
