"""The model the benchmarks serve: the shipped default, else a small one trained here.

Trained with the project's own commands (``stopserve simulate`` then ``stopserve train``)
in the benchmark's scratch folder, so every figure is produced by the one command.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from _common import ROOT, load


def stopserve_cmd(*args: str) -> list[str]:
    """The ``stopserve`` CLI, run with this interpreter (no reliance on PATH)."""
    return [sys.executable, "-m", "stopserve.cli", *args]


def run(cmd: list[str], *, timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command; raise RuntimeError with its stderr tail when it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise RuntimeError(
            f"`{' '.join(cmd[2:] if cmd[1] == '-m' else cmd)}` exited {proc.returncode}: {tail}"
        )
    return proc


def model_dir(workdir: Path, size: str) -> tuple[Path | None, str]:
    """A model directory to benchmark and how it was obtained (or None and why not)."""
    default = ROOT / "models" / "default"
    if (default / "manifest.json").is_file():
        return default, "shipped default model (models/default)"
    if size == "tiny":
        return None, "tiny size: no model is trained (the smoke test stays fast)"
    target = workdir / "bench-model"
    if (target / "manifest.json").is_file():
        return target, f"small model trained by the benchmark ({target.name})"
    for mod in ("training.simulate", "training.fit"):
        got = load(mod)
        if isinstance(got, str):
            return None, got
    n = {"quick": 1000, "full": 1000}[size]
    sim = workdir / "bench-model-train.jsonl"
    try:
        run(stopserve_cmd("simulate", "--n", str(n), "--seed", "11", "-o", str(sim)), timeout=600)
        run(
            stopserve_cmd(
                "train",
                str(sim),
                "-o",
                str(target),
                "--folds",
                "2",
                "--no-progress",
                "--cost-unit",
                "ktokens",
            ),
            timeout=1200,
        )
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        return None, f"could not train a benchmark model: {exc}"
    how = (
        f"small model trained by the benchmark: `stopserve simulate --n {n} --seed 11`, "
        "then `stopserve train --folds 2 --cost-unit ktokens`"
    )
    return target, how
