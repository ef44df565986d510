"""Training: `stopserve train` against raw lightgbm.train on the same matrix, and its peak memory.

``bench/_train_probe.py`` runs ``stopserve train`` in one process under ``/usr/bin/time -v``
(peak resident memory), recording every ``lightgbm.train`` call the fit makes (rows,
labels, weights, parameters, rounds run), then replays the same boosters with raw
``lightgbm.train`` on the same matrix. Target (issue 4/6): the fit takes at most 1.5x
the raw replay.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import BENCH, ROOT, Section, Target, details, load, parser
from _traces import make

TARGET_RATIO = 1.5


def time_v(stderr: str) -> dict[str, float]:
    """Peak RSS (bytes) and wall seconds from ``/usr/bin/time -v`` output."""
    out: dict[str, float] = {}
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr)
    if m:
        out["peak_rss_bytes"] = int(m.group(1)) * 1024.0
    m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", stderr)
    if m:
        secs = 0.0
        for part in m.group(1).split(":"):
            secs = secs * 60 + float(part)
        out["wall_s"] = secs
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__ or "")
    p.add_argument("--points", type=int, help="decision points to train on (default by --size)")
    args = p.parse_args(argv)
    sec = Section("Training: stopserve train against raw lightgbm.train", sys.argv)
    for mod in ("stopserve.training.fit", "stopserve.training.labels"):
        got = load(mod)
        if isinstance(got, str):
            sec.skip(got)
            sec.emit(args.out)
            return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="stopserve-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    n_points = args.points or {"tiny": 1_000, "quick": 30_000, "full": 50_000}[args.size]
    folds = {"tiny": 2, "quick": 3, "full": 3}[args.size]
    traces_path = workdir / f"train-{n_points}.jsonl"
    n_traces, points, how = make(traces_path, n_points, seed=5)
    sec.add(f"Traces: {how}: {n_traces:,} traces, {points:,} decision points.", "")
    probe_out = workdir / "train-probe.json"
    train_args = [str(traces_path), "-o", str(workdir / "train-model"), "--no-progress",
                  "--folds", str(folds), "--cost-unit", "ktokens"]  # fmt: skip
    cmd = ["/usr/bin/time", "-v", sys.executable, str(BENCH / "_train_probe.py"), str(probe_out), "--",
           *train_args]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=7200, check=False)
    if proc.returncode != 0 or not probe_out.exists():
        sec.skip(f"could not run stopserve train (exit {proc.returncode}): {proc.stderr.strip()[-800:]}")
        sec.emit(args.out)
        return 0
    rep: dict[str, Any] = json.loads(probe_out.read_text())
    tv = time_v(proc.stderr)
    fit = rep["fit"]
    raw = rep.get("raw_seconds")
    ratio = fit["seconds"] / raw if raw else None
    peak = tv.get("peak_rss_bytes", rep["peak_rss_bytes"])
    rows = [
        ["decision points (rows of the matrix)", fit.get("rows")],
        ["features (columns)", rep.get("matrix_shape", [None, None])[1]],
        ["folds", folds],
        ["`stopserve train` wall s (read, featurize, fit, save)", rep["cli_seconds"]],
        ["of which `PolicyLearner.fit` s (decision points, cross-validation, final fit)", fit["seconds"]],
        ["of which inside `lightgbm.train` s (recorded)", rep["recorded_lgb_seconds"]],
        ["`lightgbm.train` calls (boosters)", rep["calls"]],
        ["raw replay s: same boosters, same rows, labels, params and rounds", raw],
        ["**fit / raw** (wall)", ratio],
        [
            "fit CPU s / raw CPU s (all threads)",
            f"{fit.get('cpu_seconds', 0):.1f} / {rep.get('raw_cpu_seconds', 0):.1f}",
        ],
        ["peak RSS of the process (MiB)", peak / 2**20],
        ["of which at most: the probe's recorded arrays (MiB)", rep["probe_bytes"] / 2**20],
        ["chosen policy", fit.get("chosen")],
    ]
    sec.table(["figure", "value"], rows)
    sec.add(
        "The fit cross-fits Q, S and K over the folds (with early stopping on an inner validation "
        "split), then, when the learned policy ships, trains the final boosters; the raw replay trains "
        "each of those same boosters "
        "from a fresh `lightgbm.Dataset` of the same rows, without validation sets. Peak memory is "
        "`/usr/bin/time -v`'s maximum resident set size of the whole `stopserve train` process.",
        "",
    )
    if n_points < 1_000_000:
        why = (
            f"peak memory and fit/raw ratio on 1,000,000 decision points (this run: {points:,}, to fit the "
            "suite's time budget): `python bench/run_all.py --only train --train-points 1000000 "
            "--output bench/RESULTS-1m.md` (committed next to this file)"
        )
        sec.missing.append(why)
        sec.add(f"- Not measured in this run: {why}.", "")
    sec.data["train"] = {**rep, "time_v": tv, "n_traces": n_traces, "n_points": points, "folds": folds}
    if ratio is not None:
        met = ratio <= TARGET_RATIO
        sec.targets.append(
            Target(f"fit time / raw lightgbm.train ({points:,} decision points)", f"{ratio:.2f}x",
                   f"<= {TARGET_RATIO}x", met)
        )  # fmt: skip
        if not met and args.size != "tiny":
            prof_out = workdir / "train-profile.txt"
            small = workdir / "train-profile.jsonl"
            make(small, min(n_points, 100_000), seed=6)
            subprocess.run(
                [sys.executable, "-m", "pyinstrument", "--no-color", "--no-unicode", "-r", "text", "-o",
                 str(prof_out), "-m", "stopserve.cli", "train", str(small), "-o", str(workdir / "prof-model"),
                 "--no-progress", "--folds", str(folds), "--cost-unit", "ktokens"],
                cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False,
            )  # fmt: skip
            if prof_out.exists():
                text = [ln for ln in prof_out.read_text().splitlines() if ln.strip()]
                title = "profile of `stopserve train` on up to 100,000 decision points (pyinstrument)"
                sec.add(*details(title, "\n".join(text[:60])))
    sec.emit(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
