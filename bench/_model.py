"""The model the latency benchmarks serve: the shipped default when it is a LightGBM model,
else a small one trained here.

Trained with the project's own commands in the benchmark's scratch folder, so every
figure comes from the one command. ``stopserve train`` ships a tuned heuristic when
the learned policy does not beat it; latency is about the LightGBM path, so the
benchmark model is trained by ``_force_model.py`` (``stopserve train`` with that
guard disarmed) and says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _common import BENCH, ROOT, load


def stopserve_cmd(*args: str) -> list[str]:
    """The ``stopserve`` CLI, run with this interpreter (no reliance on PATH)."""
    return [sys.executable, "-m", "stopserve.cli", *args]


def run(cmd: list[str], *, timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command; raise RuntimeError with its stderr tail when it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        shown = cmd[3:] if cmd[1:3] == ["-m", "stopserve.cli"] else cmd
        raise RuntimeError(f"`{' '.join(shown)}` exited {proc.returncode}: {tail}")
    return proc


def usable(path: Path) -> str | None:
    """The model's kind if this code base can load it (checksums, feature names), else None."""
    policy = load("stopserve.policy", "Policy")
    if isinstance(policy, str) or not (path / "manifest.json").is_file():
        return None
    try:
        return str(policy.Policy.load(path).kind)
    except Exception:  # stale or foreign model: train a fresh one
        return None


def model_dir(workdir: Path, size: str) -> tuple[Path | None, str]:
    """A model directory to benchmark and how it was obtained (or None and why not)."""
    default = ROOT / "models" / "default"
    if usable(default) == "model":
        return default, "shipped default model (models/default)"
    if size == "tiny":
        return None, "tiny size: no model is trained (the smoke test stays fast)"
    target = workdir / "bench-model"
    n = 600
    how = (
        f"small LightGBM model trained by the benchmark: `stopserve simulate --n {n} --seed 11`, then "
        "`python bench/_force_model.py SIM -o DIR --folds 2 --lambda 1 --cost-unit ktokens` (stopserve "
        "train with the ship-a-heuristic guard disarmed, so the LightGBM path is what is timed)"
    )
    if usable(target) == "model":
        return target, how
    for mod in ("stopserve.training.simulate", "stopserve.training.fit"):
        got = load(mod)
        if isinstance(got, str):
            return None, got
    sim = workdir / "bench-model-train.jsonl"
    try:
        run(stopserve_cmd("simulate", "--n", str(n), "--seed", "11", "-o", str(sim)), timeout=600)
        run(
            [sys.executable, str(BENCH / "_force_model.py"), str(sim), "-o", str(target), "--folds", "2",
             "--lambda", "1", "--no-progress", "--cost-unit", "ktokens"],
            timeout=1200,
        )  # fmt: skip
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        return None, f"could not train a benchmark model: {exc}"
    kind = usable(target)
    if kind != "model":
        guard = json.loads((target / "manifest.json").read_text()).get("guard", {})
        return (
            None,
            f"could not train a benchmark model: the learned policy lost even to never stopping ({guard})",
        )
    return target, how
