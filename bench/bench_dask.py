"""Training on a local Dask cluster (`--dask local:N`) against the single-process trainer.

For each size, simulated traces are written to several files (one Dask partition each),
and `bench/_dask_probe.py` runs `PolicyLearner.fit` + save once per mode, each in a
fresh process: the single-process trainer, then 1 and 2 local one-thread workers. Wall
time per phase, the ratio to the single-process run of the same size (same run, same
files), the client's and each worker's peak RSS, and the cross-validated value of the
learned policy with a paired bootstrap interval of (Dask − single) over task groups.
With the shared data, the default model's corpus (`training/train_default.sh`'s recipe)
is featurized and fitted the same three ways.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import BENCH, ROOT, SHARED_DATA, Section, load, parser
from _model import run, stopserve_cmd
from _traces import count_points

MODES = ("single", "local:1", "local:2")
SYNTH_OPTIONS = {"folds": 3, "cost_unit": "ktokens", "method": "behavior"}
CORPUS_OPTIONS = {
    "folds": 5,
    "cost_scale": "per_run",
    "cost_share": 0.3,
    "features": "scale-free",
    "method": "behavior",
}


def simulate_files(workdir: Path, n_points: int, n_files: int, seed: int) -> tuple[list[Path], int, int, str]:
    """``n_files`` simulator files with about ``n_points`` decision points in all."""
    pilot = workdir / "pilot.jsonl"
    run(stopserve_cmd("simulate", "--n", "200", "--seed", str(seed + 1000), "-o", str(pilot)), timeout=600)
    p_traces, p_points = count_points(pilot)
    pilot.unlink()
    per_file = max(2, int(n_points / max(p_points / p_traces, 1.0) / n_files * 1.03) + 1)
    files = []
    for i in range(n_files):
        path = workdir / f"sim-{n_points}-{i}.jsonl"
        if not path.exists():
            run(
                stopserve_cmd("simulate", "--n", str(per_file), "--seed", str(seed + i), "-o", str(path)),
                timeout=3600,
            )
        files.append(path)
    traces = points = 0
    for f in files:
        t, p = count_points(f)
        traces, points = traces + t, points + p
    how = f"{n_files} files of `stopserve simulate --n {per_file} --seed {seed}..{seed + n_files - 1}`"
    return files, traces, points, how


def corpus_files(workdir: Path, mint_n: int, ic_n: int, sim_n: int) -> tuple[list[Path], str]:
    """The default model's training corpus (training/train_default.sh), one file per set."""
    from stopserve.training.corpus import REAL_SETS, import_set, split_file, subsample_file

    limits = {"swe": None, "mint": mint_n, "intercode": ic_n}
    files = []
    for name, spec in REAL_SETS.items():
        train, test = workdir / f"{name}-train.jsonl", workdir / f"{name}-test.jsonl"
        if not train.exists():
            full = import_set(name, SHARED_DATA, workdir / "imported")
            split_file(full, train, test, spec.split_by)
            if limits[name] is not None:
                subsample_file(train, train, int(limits[name] or 0))
        files.append(train)
    sim = workdir / "sim-train.jsonl"
    if not sim.exists():
        run(
            stopserve_cmd("simulate", "--n", str(sim_n), "--seed", "10", "--run-to-cap", "-o", str(sim)),
            timeout=1800,
        )
    files.append(sim)
    how = (
        f"training/train_default.sh's corpus: SWE django runs, MINT {mint_n}, InterCode {ic_n}, "
        f"{sim_n} simulated run-to-cap runs (4 files); --cost-scale per-run --cost-share 0.3 "
        "--features scale-free, 5 folds"
    )
    return files, how


def probe(
    mode: str, files: list[Path], options: dict[str, Any], workdir: Path, tag: str, reuse: bool
) -> dict[str, Any]:
    out = workdir / f"probe-{tag}-{mode.replace(':', '')}.json"
    model = workdir / f"model-{tag}-{mode.replace(':', '')}"
    if reuse and out.exists():
        reused: dict[str, Any] = json.loads(out.read_text())
        reused["reused"] = True
        return reused
    cmd = [sys.executable, str(BENCH / "_dask_probe.py"), str(out), mode, str(model), json.dumps(options),
           "--", *map(str, files)]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=4 * 3600, check=False)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"{mode}: exit {proc.returncode}: {proc.stderr.strip()[-1500:]}")
    doc: dict[str, Any] = json.loads(out.read_text())
    doc["process_s"] = time.perf_counter() - t0
    return doc


def paired_interval(a: dict[str, Any], b: dict[str, Any], seed: int = 0) -> tuple[float, float, float]:
    """Mean of (b − a) per trace, and its 90% interval resampling task groups (paired)."""
    from stopserve.training.fit import bootstrap_diff

    diff = np.asarray(b["cv_values_learned"]) - np.asarray(a["cv_values_learned"])
    draws = bootstrap_diff(diff, np.asarray(a["groups"]), seed=seed)
    return float(diff.mean()), float(np.quantile(draws, 0.05)), float(np.quantile(draws, 0.95))


def report(sec: Section, title: str, how: str, docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    base = docs.get("single")
    first = next(iter(docs.values()))
    sec.add(
        f"### {title}",
        "",
        f"Traces: {how}: {first['n_traces']:,} traces, {first['n_rows']:,} decision points.",
        "",
    )
    reused = [m for m, d in docs.items() if d.get("reused")]
    if reused:
        sec.add(
            f"Rows of {', '.join(reused)}: an earlier run of this script on the same files (`--reuse`).", ""
        )
    rows = []
    for mode, d in docs.items():
        workers = sorted(d["worker_peak_rss"].values())
        cpu = d.get("client_cpu_s", 0.0) + sum(d.get("worker_cpu_s", {}).values())
        rows.append([
            "single process" if mode == "single" else f"`--dask {mode}`",
            d["wall_s"],
            f"{d['wall_s'] / base['wall_s']:.2f}x" if base else "-",
            d["featurize_s"],
            d["lightgbm_s"],
            d["replay_s"],
            d["rest_s"],
            cpu,
            d["client_peak_rss"] / 2**20,
            ", ".join(f"{w / 2**20:,.0f}" for w in workers) or "-",
            d["cv_learned"],
            "-" if "load_1min" not in d else "{:.1f} / {:.1f}".format(*d["load_1min"]),
        ])  # fmt: skip
    sec.table(
        ["mode", "wall s (fit + save)", "vs single", "featurize s", "LightGBM s", "replay s", "rest s",
         "CPU s (client + workers)", "client peak MiB", "worker peak MiB", "learned CV value",
         "load 1 min (start / end)"],
        rows,
    )  # fmt: skip
    sec.add("Shipped: " + "; ".join(f"{m}: {d['shipped']}" for m, d in docs.items()) + ".", "")
    out: dict[str, Any] = {m: {k: v for k, v in d.items() if k not in ("cv_values_learned", "groups")}
                           for m, d in docs.items()}  # fmt: skip
    if base:
        lines = []
        for mode, d in docs.items():
            if mode == "single":
                continue
            mean, lo, hi = paired_interval(base, d)
            out[mode]["cv_diff_vs_single"] = [mean, lo, hi]
            lines.append(f"`{mode}` {mean:+.4f} [{lo:+.4f}, {hi:+.4f}]")
        sec.add(
            "Learned CV value, Dask − single process, per run, 90% paired bootstrap interval over task "
            "groups: " + "; ".join(lines) + ".",
            "",
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__ or "")
    p.add_argument("--points", type=int, nargs="+", help="sizes in decision points (default by --size)")
    p.add_argument("--files", type=int, default=8, help="trace files (partitions) per size")
    p.add_argument("--modes", nargs="+", default=list(MODES), help="single, local:1, local:2, ...")
    p.add_argument("--no-corpus", action="store_true", help="skip the default model's corpus")
    p.add_argument("--corpus-only", action="store_true", help="only the default model's corpus")
    p.add_argument(
        "--reuse", action="store_true", help="reuse probe results already in --workdir (said in the section)"
    )
    args = p.parse_args(argv)
    sec = Section("Training on a Dask cluster: --dask local:N against the single-process trainer", sys.argv)
    for mod in ("stopserve.training.distributed",):
        got = load(mod, "DaskBackend")
        if isinstance(got, str):
            sec.skip(got)
            sec.emit(args.out)
            return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="stopserve-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    sizes = args.points or {"tiny": [3_000], "quick": [100_000], "full": [1_000_000]}[args.size]
    n_files = 4 if args.size == "tiny" else args.files
    sec.add(
        "The machine has 2 cores shared with other engineers' work (load varies from minute to "
        "minute); `local:2` runs two one-thread workers plus the client on those 2 cores. Ratios "
        "compare runs of the same script, minutes apart, on the same files.",
        "",
    )
    options = dict(SYNTH_OPTIONS)
    if args.size == "tiny":
        options.update(folds=2, method="behavior", max_rounds=30)
    for n_points in [] if args.corpus_only else sizes:
        files, _, points, how = simulate_files(workdir, n_points, n_files, seed=5)
        docs = {}
        for mode in args.modes:
            try:
                docs[mode] = probe(mode, files, options, workdir, f"sim{n_points}", args.reuse)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                sec.skip(f"{mode} on {points:,} decision points failed: {exc}")
        if docs:
            sec.data[f"sim_{n_points}"] = report(sec, f"{points:,} simulated decision points", how, docs)
    if not args.no_corpus and args.size != "tiny":
        if not (SHARED_DATA / "mint-train").is_dir():
            sec.skip(f"the default model's corpus: no shared data at {SHARED_DATA}")
        else:
            files, how = corpus_files(workdir, 4000, 4000, 2000)
            docs = {}
            for mode in args.modes:
                try:
                    docs[mode] = probe(
                        mode, files, {**CORPUS_OPTIONS, "group_by": "task"}, workdir, "corpus", args.reuse
                    )
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    sec.skip(f"{mode} on the default model's corpus failed: {exc}")
            if docs:
                sec.data["corpus"] = report(sec, "The default model's corpus", how, docs)
    sec.add(
        "Phases: featurize = building the decision points (one task per file on Dask, gathered "
        "and assembled on the client); LightGBM = every booster's training call (on Dask: "
        "`lightgbm.dask`, full rounds, cut afterwards at the early-stopping iteration); replay = "
        "the replays through `Policy.decide` (on Dask: one task per file); rest = tuning, the "
        "guard, predictions and saving, on the client either way. Peak RSS: each process's own "
        "`ru_maxrss`. CPU s: user + system seconds of the client (which runs the local scheduler) "
        "and of every worker (nanny processes not counted): on a shared machine the wall time "
        "depends on how much of the 2 cores the run got, the CPU seconds do not.",
        "",
    )
    sec.emit(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
