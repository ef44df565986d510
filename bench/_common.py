"""Helpers shared by the benchmark scripts: sizes, availability checks, statistics, output.

Every script is ``python bench/bench_<name>.py [--size tiny|quick|full] [--out FILE.json]``.
It prints its markdown section on stdout and, with ``--out``, writes a JSON document
``{"title", "command", "markdown", "data", "missing", "targets"}`` that ``bench/run_all.py``
assembles into ``bench/RESULTS.md``. A part that is not importable yet is reported as
"not available yet: <module>" and its section is skipped, never crashed on.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import platform
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
SHARED_DATA = ROOT.parent / "shared" / "data"
SWE_DIR = SHARED_DATA / "swe-verified-gemini3-train"
SIZES = ("tiny", "quick", "full")


def load(module: str, *names: str) -> ModuleType | str:
    """Import ``module`` and check it has ``names``; on failure return why, as a string."""
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        return f"not available yet: {module} ({exc})"
    except Exception as exc:  # a half-written module must not take the benchmark down with it
        return f"not available yet: {module} (import failed: {type(exc).__name__}: {exc})"
    lacking = [n for n in names if not hasattr(mod, n)]
    if lacking:
        return f"not available yet: {module}.{', '.join(lacking)}"
    return mod


@dataclass
class Target:
    """One target of issue 6 and whether this run met it."""

    name: str
    measured: str
    goal: str
    met: bool | None  # None: could not be judged in this run

    def row(self) -> str:
        verdict = {True: "met", False: "**MISSED**", None: "not judged"}[self.met]
        return f"| {self.name} | {self.measured} | {self.goal} | {verdict} |"


@dataclass
class Section:
    """What one benchmark script reports."""

    title: str
    argv: Sequence[str]
    lines: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def skip(self, why: str) -> None:
        """Record a part that is missing, and say so in the section."""
        self.missing.append(why)
        self.lines.append(f"- {why}: this part of the section is skipped.")
        print(why, file=sys.stderr)

    def table(self, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.lines.append("| " + " | ".join(header) + " |")
        self.lines.append("|" + "|".join("---" for _ in header) + "|")
        for row in rows:
            self.lines.append("| " + " | ".join(fmt(v) for v in row) + " |")
        self.lines.append("")

    def markdown(self) -> str:
        out = [f"## {self.title}", "", f"Command: `{command_line(self.argv)}`", ""]
        if self.targets:
            out += ["| target | measured | goal | verdict |", "|---|---|---|---|"]
            out += [t.row() for t in self.targets]
            out.append("")
        out += self.lines
        return "\n".join(out).rstrip() + "\n"

    def emit(self, out: Path | None) -> None:
        text = self.markdown()
        print(text)
        if out is not None:
            doc = {
                "title": self.title,
                "command": command_line(self.argv),
                "markdown": text,
                "data": self.data,
                "missing": self.missing,
                "targets": [t.__dict__ for t in self.targets],
            }
            out.write_text(json.dumps(doc, indent=2, default=str) + "\n")


#: Options that only say where scratch output goes: left out of the commands shown.
_PLUMBING = ("--out", "--output", "--workdir")


def command_line(argv: Sequence[str]) -> str:
    """``argv`` as a user would type it from the repository root."""
    args = [str(a) for a in argv]
    if args and args[0] == sys.executable:
        args = args[1:]
    if args and args[0].endswith(".py"):
        with contextlib.suppress(ValueError):
            args[0] = str(Path(args[0]).resolve().relative_to(ROOT))
        args.insert(0, "python")
    shown: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a in _PLUMBING:
            skip = True
        elif not a.startswith(tuple(f"{p}=" for p in _PLUMBING)):
            shown.append(a)
    return shlex.join(shown)


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--size", choices=SIZES, default="full", help="tiny: smoke test; quick: minutes")
    p.add_argument("--out", type=Path, help="write the section as JSON here")
    p.add_argument("--workdir", type=Path, help="scratch folder (default: a fresh temporary one)")
    return p


def fmt(value: Any) -> str:
    """Numbers for tables: 3 significant digits, thousands separated."""
    if isinstance(value, bool) or value is None:
        return "—" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value == 0:
            return "0"
        mag = abs(value)
        if mag >= 1000:
            return f"{value:,.0f}"
        if mag >= 1:
            return f"{value:.3g}" if mag < 100 else f"{value:.0f}"
        return f"{value:.3g}"
    return str(value)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def best_rate(work: Callable[[], int], repeats: int) -> tuple[float, float]:
    """Run ``work`` (returns items done) ``repeats`` times; best items per wall second and
    per CPU second of this process.

    The best of several repeats is the least noisy estimate on a shared machine, and
    CPU time does not count the time the process waited for a core.
    """
    wall: list[float] = []
    cpu: list[float] = []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        n = work()
        t1, c1 = time.perf_counter(), time.process_time()
        wall.append(n / (t1 - t0))
        cpu.append(n / max(c1 - c0, 1e-9))
    return max(wall), max(cpu)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def profile_text(fn: Callable[[], Any], *, max_lines: int = 45) -> str:
    """Run ``fn`` under pyinstrument; the call tree as text (or why there is none)."""
    try:
        from pyinstrument import Profiler
    except ImportError:
        return "(pyinstrument is not installed: pip install pyinstrument)"
    profiler = Profiler(interval=0.0002)
    profiler.start()
    try:
        fn()
    finally:
        profiler.stop()
    text = profiler.output_text(unicode=False, color=False, show_all=False)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    # drop pyinstrument's banner: the tree starts at the first line with a time
    start = next((i for i, ln in enumerate(lines) if re.match(r"^\d+\.\d+ ", ln)), 0)
    tree = lines[start:]
    if len(tree) > max_lines:
        tree = [*tree[:max_lines], f"... ({len(tree) - max_lines} more lines)"]
    return "\n".join(tree)


def details(summary: str, body: str) -> list[str]:
    return ["<details><summary>" + summary + "</summary>", "", "```", body, "```", "", "</details>", ""]


def machine() -> dict[str, Any]:
    """Facts about the machine this run happened on."""
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_1min": round(load1, 2),
    }
