"""The real data sets the project measures itself on, and their held-out splits.

Every decision-quality figure on real runs (``docs/training.md``, ``bench/RESULTS.md``,
the default model's card) is made from these sets, split the same way
(``../shared/spec/evaluation-protocol.md``: train and test never share a task):

==========  =======================================  ==================  ===============
set         source (under ``../shared/data``)         importer            held out
==========  =======================================  ==================  ===============
swe         ``swe-verified-gemini3-train``           ``mini-swe-agent``  repositories
mint        ``mint-train``                           ``mint``            tasks; models
intercode   ``intercode-train``                      ``intercode``       tasks; models
sim         ``stopserve simulate --run-to-cap``      (simulator)         fresh seed
==========  =======================================  ==================  ===============

A split is a pure function of the trace (a hash of its task id, repository or
system), so the same trace always lands on the same side, whatever order or subset
is read: ``split_file`` writes both sides of a JSON Lines file. SWE runs are held
out by repository (``django`` trains; the six other repositories test).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import orjson

from stopserve.errors import TrainingError

__all__ = [
    "DEFAULT_CORPUS_LIMITS",
    "REAL_SETS",
    "RealSet",
    "default_corpus",
    "held_out",
    "import_set",
    "label_systems",
    "split_file",
    "subsample_file",
    "system_family",
]


@dataclass(frozen=True)
class RealSet:
    """One real data set: where it lives, how it imports, how it is grouped and split."""

    name: str
    source: str
    importer: str
    group_by: str
    #: what a held-out split keeps apart: "task" (hash of the task id), "repo", "system"
    split_by: str


REAL_SETS: Final[dict[str, RealSet]] = {
    "swe": RealSet("swe", "swe-verified-gemini3-train", "mini-swe-agent", "repo", "repo"),
    "mint": RealSet("mint", "mint-train", "mint", "task", "task"),
    "intercode": RealSet("intercode", "intercode-train", "intercode", "task", "task"),
}

#: Share of the tasks (or systems) held out for testing.
TEST_SHARE: Final = 0.2


def _unit(text: str, salt: str) -> float:
    return int(hashlib.sha256(f"{salt}:{text}".encode()).hexdigest()[:12], 16) / float(16**12)


def held_out(
    trace: dict[str, object], by: str, *, share: float = TEST_SHARE, salt: str = "stopserve"
) -> bool:
    """Whether a trace (format-v1 JSON data) is on the test side of the split ``by``.

    ``task``: a hash of the task id; ``system``: a hash of the producing system (one
    model's runs); ``repo``: SWE-bench repositories, ``django`` trains and the others test.
    """
    task = str(trace.get("task_id", ""))
    if by == "repo":
        return not task.startswith("django__")
    if by == "system":
        return _unit(str(trace.get("system") or ""), salt) < share
    if by == "task":
        return _unit(task, salt) < share
    raise TrainingError(f"split by {by!r}: expected task, system or repo")


def split_file(src: Path, train: Path, test: Path, by: str, *, share: float = TEST_SHARE) -> tuple[int, int]:
    """Write the two sides of a JSON Lines trace file; returns (train, test) counts."""
    n_train = n_test = 0
    with src.open("rb") as fh, train.open("wb") as a, test.open("wb") as b:
        for line in fh:
            if not line.strip():
                continue
            if held_out(orjson.loads(line), by, share=share):
                b.write(line)
                n_test += 1
            else:
                a.write(line)
                n_train += 1
    return n_train, n_test


def subsample_file(
    src: Path,
    dst: Path,
    n: int,
    *,
    keep: Callable[[dict[str, object]], bool] | None = None,
    salt: str = "sub",
) -> int:
    """Keep about ``n`` traces of a JSON Lines file, chosen by a hash of the task id (whole tasks)."""
    lines = [line for line in src.read_bytes().splitlines() if line.strip()]
    if keep is not None:
        lines = [line for line in lines if keep(orjson.loads(line))]
    if len(lines) <= n:
        dst.write_bytes(b"\n".join(lines) + b"\n")
        return len(lines)
    share = n / len(lines)
    chosen = [line for line in lines if _unit(str(orjson.loads(line).get("task_id")), salt) < share]
    dst.write_bytes(b"\n".join(chosen) + b"\n")
    return len(chosen)


def import_set(name: str, shared: Path, out: Path) -> Path:
    """Import one real set from ``shared`` (the data folder) into ``out/<name>.jsonl`` (cached).

    The importer's defaults apply: events carry their texts' sketches and their ``progress``.
    The cached file is used while it is newer than the source and than the importer's module
    (an importer that changed, say to fill a new field, imports the set again).
    """
    import importlib.util

    from stopserve.importers import IMPORTERS, MODULES
    from stopserve.trace import TraceWriter

    spec = REAL_SETS[name]
    src = shared / spec.source
    if not src.exists():
        raise TrainingError(f"{src}: not found (the shared data folder holds the real runs)")
    dst = out / f"{name}.jsonl"
    module = importlib.util.find_spec(f"stopserve.importers.{MODULES[spec.importer]}")
    code = Path(module.origin) if module is not None and module.origin else None
    newest = max(src.stat().st_mtime, code.stat().st_mtime if code is not None else 0.0)
    if dst.exists() and dst.stat().st_mtime >= newest:
        return dst

    out.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(".tmp.jsonl")
    skipped: list[object] = []
    with TraceWriter(tmp) as writer:
        for trace in IMPORTERS[spec.importer]([str(src)], on_error=skipped.append):
            writer.write(trace)
    tmp.rename(dst)
    return dst


def system_family(trace: dict[str, object]) -> str:
    """The system a trace's run came from: one agent scaffold or harness on one benchmark.

    What leave-one-system-out holds out whole (``docs/training.md``): ``mini-swe-agent``
    (SWE-bench), ``mint`` (one agent), ``mint-feedback`` and ``mint-feedback-sparse`` (a
    second model writes feedback, dense or sparse: MINT's ``PHF`` settings),
    ``intercode-sql``, ``intercode-bash``, and ``sim-<topology>`` for simulated runs.
    Anything else: its ``system`` up to the first "/".
    """
    system = str(trace.get("system") or "unknown")
    dataset = system.split("/", 1)[0]
    if dataset == "mint":
        parts = str(trace.get("trace_id", "")).split("/")
        feedback = parts[2] if len(parts) > 2 else "None"
        if feedback == "None":
            return "mint"
        return "mint-feedback-sparse" if len(parts) > 3 and parts[3].endswith("-sparse") else "mint-feedback"
    if dataset == "stopserve-sim":
        return f"sim-{trace.get('topology') or 'unknown'}"
    return dataset


def label_systems(src: Path, dst: Path) -> dict[str, int]:
    """Copy a JSON Lines trace file with each ``system`` prefixed by its :func:`system_family`.

    ``system`` becomes ``<family>/<system>``, so ``--group-by dataset`` (the system up to
    the first "/") holds whole systems out. Returns the traces per family.
    """
    counts: dict[str, int] = {}
    with src.open("rb") as fh, dst.open("wb") as out:
        for line in fh:
            if not line.strip():
                continue
            trace = orjson.loads(line)
            family = system_family(trace)
            counts[family] = counts.get(family, 0) + 1
            trace["system"] = f"{family}/{trace.get('system') or 'unknown'}"
            out.write(orjson.dumps(trace) + b"\n")
    return counts


#: Runs kept per system in the default model's corpus (None: all of them).
DEFAULT_CORPUS_LIMITS: Final[dict[str, int | None]] = {
    "mint": 1500,
    "mint-feedback": 1500,
    "intercode-sql": 3000,
}


def default_corpus(
    shared: Path,
    out: Path,
    *,
    limits: dict[str, int | None] | None = None,
    sim_n: int = 2000,
    log: Callable[[str], None] | None = None,
) -> list[Path]:
    """The default model's corpus: one JSON Lines file per system, every trace labelled with it.

    Every real set in ``shared`` (the runs of each system kept up to ``limits``, whole
    tasks by hash), and ``sim_n`` behavior-logged simulated runs (``stopserve simulate
    --seed 10``), a system per topology (:func:`system_family`). What
    ``training/train_default.sh`` trains on and ``bench/bench_default.py`` measures.
    """
    from stopserve.trace import TraceWriter
    from stopserve.training.simulate import simulate

    limits = DEFAULT_CORPUS_LIMITS if limits is None else limits
    out.mkdir(parents=True, exist_ok=True)
    work = out / ".work"
    work.mkdir(exist_ok=True)
    written: list[Path] = []
    for name, spec in REAL_SETS.items():
        if not (shared / spec.source).exists():
            continue
        labelled = work / f"{name}.jsonl"
        label_systems(import_set(name, shared, work / "imported"), labelled)
        by_system: dict[str, list[bytes]] = {}
        for line in labelled.read_bytes().splitlines():
            if line.strip():
                by_system.setdefault(orjson.loads(line)["system"].split("/", 1)[0], []).append(line)
        for system, lines in sorted(by_system.items()):
            path = out / f"{system}.jsonl"
            path.write_bytes(b"\n".join(lines) + b"\n")
            cap = limits.get(system)
            kept = subsample_file(path, path, cap) if cap is not None else len(lines)
            written.append(path)
            if log is not None:
                log(f"{system}: {len(lines)} runs, {kept} kept")
    raw = work / "sim.jsonl"
    with TraceWriter(raw) as writer:
        for trace in simulate(sim_n, seed=10):
            writer.write(trace)
    counts = label_systems(raw, out / "sim.jsonl")
    written.append(out / "sim.jsonl")
    if log is not None:
        log(f"simulated: {counts}")
    # in the order of a shell's glob under LC_ALL=C (training/train_default.sh): LightGBM's fit
    # depends on the order of its rows, and the benchmark must judge the very model shipped
    return sorted(written)
