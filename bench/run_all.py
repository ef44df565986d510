"""Run every benchmark and write bench/RESULTS.md from scratch.

    python bench/run_all.py            # the full suite (about 20 minutes on 2 cores)
    python bench/run_all.py --quick    # smaller inputs, shorter runs (a few minutes)
    python bench/run_all.py --update --only decide serve      # re-run two sections, keep the rest
    python bench/run_all.py --update --from-json q.json        # a section run by its own command

The slow sections (quality at full size takes about an hour, the Dask and credit benchmarks
longer) are run on their own (``python bench/bench_quality.py --size full --out q.json``) and
put in with ``--update --from-json``. With ``--update`` the other sections of RESULTS.md stay
as they were; every section says when, on which code and under what load it was measured
(``bench/results.json`` keeps the sections RESULTS.md is rendered from).

Each section runs in its own process, one after another (never in parallel: the
figures would disturb each other), with a timeout; a section whose part is missing
says "not available yet: <module>", and one that fails is reported with its error,
so the file is always written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import BENCH, ROOT, command_line, machine

#: (script, timeout in seconds for the full size); quick and tiny sizes get less.
SECTIONS: list[tuple[str, int]] = [
    ("bench_featurize.py", 600),
    ("bench_inference.py", 600),
    ("bench_decide.py", 900),
    ("bench_train.py", 1800),
    ("bench_quality.py", 1800),
    ("bench_default.py", 3600),
    ("bench_learning.py", 14400),
    ("bench_simulate.py", 600),
    ("bench_client.py", 300),
    ("bench_hook.py", 300),
    ("bench_sketch.py", 300),
    ("bench_report.py", 600),
    ("bench_serve.py", 900),
    ("bench_reliability.py", 1500),
    ("bench_replicas.py", 900),
    ("bench_dask.py", 5400),
    ("bench_credit.py", 5400),
]


def git_head() -> str:
    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return proc.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git(
        "status", "--porcelain", "--untracked-files=no", "stopserve", "training", "bench",
        ":!bench/RESULTS.md", ":!bench/results.json", ":!bench/*.png",
    )  # fmt: skip
    return f"{head}{' (plus uncommitted changes)' if dirty else ''}"


def run_section(
    script: str, size: str, workdir: Path, timeout: float, extra: list[str] | None = None
) -> dict[str, Any]:
    """Run one benchmark script; its JSON section, or a section saying what went wrong."""
    path = BENCH / script
    name = script.removesuffix(".py")
    if not path.exists():
        return _stub(name, f"not available yet: bench/{script}")
    help_text = subprocess.run(
        [sys.executable, str(path), "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    ).stdout
    if "--out" not in help_text:
        return run_foreign(path, size, timeout, help_text)
    out = workdir / f"{name}.json"
    out.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        str(path),
        "--size",
        size,
        *(extra or []),
        "--out",
        str(out),
        "--workdir",
        str(workdir),
    ]
    log = workdir / f"{name}.log"
    t0 = time.monotonic()
    try:
        with log.open("w") as fh:
            proc = subprocess.run(
                cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=fh, timeout=timeout, check=False
            )
        rc: int | str = proc.returncode
    except subprocess.TimeoutExpired:
        rc = f"timeout after {timeout:.0f}s"
    took = time.monotonic() - t0
    if rc == 0 and out.exists():
        doc: dict[str, Any] = json.loads(out.read_text())
        doc["seconds"] = took
        return doc
    tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-15:])
    return _stub(name, f"{script} failed ({rc})", command_line(cmd), tail, took)


def run_foreign(path: Path, size: str, timeout: float, help_text: str) -> dict[str, Any]:
    """A script written to another interface (e.g. bench_client.py): run it, quote its markdown."""
    name = path.stem
    cmd = [sys.executable, str(path)]
    if size != "full" and "--n " in help_text:
        cmd += ["--n", "50" if size == "tiny" else "150"]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return _stub(name, f"{path.name}: timeout after {timeout:.0f}s", command_line(cmd))
    took = time.monotonic() - t0
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        return _stub(name, f"{path.name} failed ({proc.returncode})", command_line(cmd), tail, took)
    parts = path.read_text().split('"""')
    title = (parts[1].strip().splitlines() or [name])[0].rstrip(".") if len(parts) > 2 else name
    text = proc.stdout.strip()
    if not text.startswith(("|", "#")):  # plain text: keep its layout
        text = f"```\n{text}\n```"
    md = [f"## {title}", "", f"Command: `{command_line(cmd)}` (its output, verbatim)", "", text, ""]
    return {"title": title, "command": command_line(cmd), "markdown": "\n".join(md), "data": {},
            "missing": [], "targets": [], "seconds": took}  # fmt: skip


def _stub(name: str, why: str, command: str = "", tail: str = "", took: float = 0.0) -> dict[str, Any]:
    md = [f"## {name}", "", f"- {why}"]
    if command:
        md += ["", f"Command: `{command}`"]
    if tail:
        md += ["", "```", tail, "```"]
    return {"title": name, "command": command, "markdown": "\n".join(md) + "\n", "data": {},
            "missing": [why], "targets": [], "seconds": took}  # fmt: skip


#: The sections RESULTS.md is rendered from, each with when and how it was measured.
STATE: Path = BENCH / "results.json"


def stamp(doc: dict[str, Any], started: dt.datetime, load_start: float) -> dict[str, Any]:
    """When, on which code and under what load the section was measured."""
    doc.setdefault(
        "measured",
        f"{started.strftime('%Y-%m-%d %H:%M UTC')}, code git {git_head()}, "
        f"load average {load_start} at the start and {machine()['load_1min']} at the end",
    )
    return doc


def from_json(path: Path, measured: str | None) -> dict[str, Any]:
    """A section a benchmark script wrote with ``--out`` (run by its own command)."""
    doc: dict[str, Any] = json.loads(path.read_text())
    when = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    doc["measured"] = measured or f"by its own command, finished {when}"
    return doc


def merge(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``old`` with each section of ``new`` in its place (same title), or added at the end."""
    out = list(old)
    for doc in new:
        at = next((i for i, d in enumerate(out) if d["title"] == doc["title"]), None)
        if at is None:
            out.append(doc)
        else:
            out[at] = doc
    return out


def render(
    docs: list[dict[str, Any]],
    argv: list[str],
    started: dt.datetime,
    facts: dict[str, Any],
    complete: bool,
    updated: bool = False,
) -> str:
    """RESULTS.md; the hand-written reading (NOTES.md) only when every section ran."""
    took = sum(d.get("seconds", 0.0) for d in docs)
    head = (
        [
            "Each section was produced by one command on this machine; sections were measured at "
            "different times (each says when, on which code and under what load), and the only "
            "hand-written part is the last section, which reads them. The machine is shared (2 cores, "
            "other work running), so absolute figures are noisy: each section compares against a "
            "baseline measured in the same run, and the ratios are the figures to read.",
            "",
            f"- Last update: `{command_line(argv)}` on {started.strftime('%Y-%m-%d %H:%M UTC')}",
            f"- Machine: {facts['cpus']} cores, Python {facts['python']}, {facts['platform']}",
        ]
        if updated
        else [
            "Every figure below was produced by one command on this machine, in one run; the only "
            "hand-written part is the last section, which reads them. The machine is shared (2 cores, "
            "other work running), so absolute figures are "
            "noisy: each section compares against a baseline measured in the same run, and the ratios "
            "are the figures to read.",
            "",
            f"- Command: `{command_line(argv)}`",
            f"- Date: {started.strftime('%Y-%m-%d %H:%M UTC')}; took {took / 60:.1f} min",
            f"- Machine: {facts['cpus']} cores, Python {facts['python']}, {facts['platform']}",
            f"- Load average (1 min) at start: {facts['load_1min']}, at end: {machine()['load_1min']}",
            f"- Code: git {git_head()}",
        ]
    )
    lines = [
        "# stopserve benchmark results",
        "",
        *head,
        "",
        "## Targets",
        "",
        "| section | target | measured | goal | verdict |",
        "|---|---|---|---|---|",
    ]
    for d in docs:
        for t in d.get("targets", []):
            verdict = {True: "met", False: "**MISSED**", None: "not judged"}[t["met"]]
            lines.append(f"| {d['title']} | {t['name']} | {t['measured']} | {t['goal']} | {verdict} |")
    missing = [(d["title"], m) for d in docs for m in d.get("missing", [])]
    if missing:
        lines += ["", "Not measured" + ("" if updated else " in this run") + ":", ""]
        lines += [f"- {title}: {m}" for title, m in missing]
    notes = BENCH / "NOTES.md"
    lines.append("")
    for d in docs:
        md = d["markdown"].rstrip().split("\n", 1)
        when = [f"Measured: {d['measured']}.", ""] if updated and d.get("measured") else []
        lines += [md[0], "", *when, *(md[1].lstrip("\n").splitlines() if len(md) > 1 else []), ""]
    if notes.exists() and complete:
        lines += [
            "## Reading the misses (written by hand from the profiles above)",
            "",
            notes.read_text().strip(),
            "",
        ]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller inputs and shorter runs")
    p.add_argument("--size", choices=("tiny", "quick", "full"), help=argparse.SUPPRESS)
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these sections (e.g. serve decide)")
    p.add_argument(
        "--train-points",
        type=int,
        metavar="N",
        help="decision points for the training benchmark (default 50,000 in the full run)",
    )
    p.add_argument(
        "--update",
        action="store_true",
        help=f"keep the sections of {STATE.name} that are not re-run (with --only or --from-json)",
    )
    p.add_argument(
        "--from-json",
        nargs="+",
        type=Path,
        default=[],
        metavar="FILE",
        help="with --update: sections a benchmark script wrote with --out",
    )
    p.add_argument(
        "--measured",
        metavar="TEXT",
        help="with --from-json: when, on which code and under what load those sections were measured",
    )
    p.add_argument("--output", type=Path, default=BENCH / "RESULTS.md")
    p.add_argument("--workdir", type=Path, help="scratch folder (default: a temporary one, removed after)")
    args = p.parse_args(argv)
    if args.from_json and not args.update:
        p.error("--from-json needs --update")
    if args.update and not STATE.exists():
        p.error(f"--update needs {STATE} (written by a full run)")
    size = args.size or ("quick" if args.quick else "full")
    scale = {"tiny": 0.2, "quick": 0.5, "full": 1.0}[size]
    started = dt.datetime.now(dt.UTC)
    facts = machine()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="stopserve-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    known = {name for name, _ in SECTIONS}
    # scripts other engineers add (e.g. service_sizing.py) run too, after the known ones
    extra = [(p.name, 600) for p in sorted(BENCH.glob("*.py")) if not p.name.startswith("_")
             and p.name != "run_all.py" and p.name not in known]  # fmt: skip
    chosen = SECTIONS + extra
    if args.update and not args.only:
        chosen = []
    if args.only:
        wanted = {n.removeprefix("bench_").removesuffix(".py") for n in args.only}
        chosen = [s for s in chosen if s[0].removeprefix("bench_").removesuffix(".py") in wanted]
        if not chosen:
            p.error(f"--only: no section named {', '.join(sorted(wanted))}")
    docs = []
    try:
        for script, timeout in chosen:
            print(f"== {script} ({size})", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            opts = (
                ["--points", str(args.train_points)]
                if args.train_points and script == "bench_train.py"
                else []
            )
            load_start = machine()["load_1min"]
            started_at = dt.datetime.now(dt.UTC)
            doc = run_section(script, size, workdir, timeout * scale + 60, opts)
            doc = stamp(doc, started_at, load_start)
            print(
                f"   {time.monotonic() - t0:.0f}s; missing: {doc.get('missing') or 'nothing'}",
                file=sys.stderr,
            )
            docs.append(doc)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    shown = [str(Path(__file__)), *(argv or sys.argv[1:])]
    docs += [from_json(path, args.measured) for path in args.from_json]
    if args.update:
        docs = merge(json.loads(STATE.read_text()), docs)
        complete = True
    else:
        complete = not args.only
    if args.output == BENCH / "RESULTS.md" and complete:
        STATE.write_text(json.dumps(docs, indent=1, default=str) + "\n")
    args.output.write_text(render(docs, shown, started, facts, complete=complete, updated=args.update))
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
