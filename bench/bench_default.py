"""The shipped default model on systems it has never seen: leave one system out (issue 23).

The default is for systems it never trained on, so it is judged with whole systems held
out. A system is one agent scaffold or harness on one benchmark
(``stopserve.training.corpus.system_family``): mini-swe-agent on SWE-bench, MINT with one
agent, with dense and with sparse feedback, InterCode SQL, InterCode Bash, and each of the
simulator's six topologies. The recipe of ``training/train_default.sh`` is trained with
``--group-by dataset --folds 12``: every system's runs are decided by a policy fitted, and
its margins and rules chosen, without that system (nested cross-fitting); the per-system
figures are those replays, through ``Policy.decide``, at the default cost share 0.3.

Targets (issue 23), per held-out system: value >= behavior - 0.005 and success >= behavior's
success - 1 point; on average: >= 20% of the behavior -> oracle gap; and where behavior's
failed runs go on after their last progress (InterCode), >= 25% of their cost saved.

The ablation trains the same recipe with one part changed at a time, on the same corpus:
no stall evidence (the model stops where its value says so), no per-system floors,
censored runs read as finished ("horizon"), and proposed stops taken. Each row is the same
leave-one-system-out replay.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import SHARED_DATA, Section, Target, parser
from _model import run, stopserve_cmd

#: The recipe's own options (training/train_default.sh); ``None``: a flag without a value.
RECIPE: dict[str, str | None] = {
    "--cost-scale": "per-run", "--cost-share": "0.3", "--features": "scale-free", "--method": "behavior",
    "--rules": "fixed", "--stop-on": "evidence", "--evidence": "3,4,5", "--censored": "unknown",
    "--group-by": "dataset", "--folds": "12", "--inner-cv": None,
    "--max-value-loss": "0.005", "--max-success-loss": "0.01", "--strict-floor": None,
}  # fmt: skip
#: (label, options changed: a value, or ``False`` to leave the option out)
ABLATIONS: list[tuple[str, dict[str, str | bool]]] = [
    ("shipped recipe", {}),
    ("no stall evidence (--stop-on value)", {"--stop-on": "value", "--evidence": False}),
    ("no per-system floors", {"--max-value-loss": False, "--max-success-loss": "0", "--strict-floor": False}),
    ("censored runs as finished (--censored horizon)", {"--censored": "horizon"}),
]
#: The in-system reference (``--in-system``): what a model trained on a system's OWN runs reaches,
#: judged on its held-out tasks, under a success floor: the ceiling of knowing the system. The most
#: permissive recipe a user would train on their own runs: every feature, tuned rules, stop on value,
#: a capped run read as its end (always true of one's own system), per-run cost.
IN_SYSTEM: dict[str, str | None] = {
    "--cost-scale": "per-run", "--cost-share": "0.3", "--censored": "horizon", "--group-by": "task",
    "--max-value-loss": "0.005",
}  # fmt: skip
#: Success floors of the reference: the recipe's own, and one tight enough that the realised loss on
#: held-out tasks is within a point on most systems (a floor holds on the tuning rows, not exactly
#: out of sample).
IN_SYSTEM_FLOORS = ("0.01", "0.0025")
_SMALL = ("mint", "mint-feedback", "mint-feedback-sparse", "intercode-sql", "intercode-bash")
_TINY: dict[str, int | None] = dict.fromkeys(_SMALL, 60)
LIMITS = {
    "tiny": (_TINY, 240),
    "quick": ({"mint": 500, "mint-feedback": 500, "intercode-sql": 1000}, 1000),
    "full": (None, 2000),
}  # fmt: skip


def _flags_of(base: dict[str, str | None], changes: dict[str, str | bool]) -> list[str]:
    """The options of ``base`` with ``changes`` made (``False``: left out), as command-line words."""
    out: list[str] = []
    for option, value in {**base, **changes}.items():
        if value is False:
            continue
        out += [option] if value is None else [option, str(value)]
    return out


def _flags(changes: dict[str, str | bool]) -> list[str]:
    """The recipe's options with ``changes`` made, as command-line words."""
    return _flags_of(RECIPE, changes)


def _per_system(manifest: dict[str, Any], *, shipped: bool = False) -> dict[str, dict[str, float]]:
    """Per system: the learned policy's cross-validated figures (``shipped``: what the guard shipped)."""
    out: dict[str, dict[str, float]] = {}
    heuristic = manifest["guard"]["shipped"] != "learned model"
    policy = manifest["cv"]["best_heuristic"] if shipped and heuristic else "learned"
    for system, row in manifest["cv"]["by_dataset_figures"].items():
        b, lrn, o = row["behavior"], row[policy], row["oracle"]
        gap = o["value"] - b["value"]
        out[system] = {
            "runs": row["runs"],
            "censored": row["censored"],
            "behavior": b["value"],
            "value": lrn["value"],
            "oracle": o["value"],
            "gap_closed": (lrn["value"] - b["value"]) / gap if gap > 1e-12 else float("nan"),
            "success_behavior": b["success"],
            "success_lost": b["success"] - lrn["success"],
            "cost_saved": 1 - lrn["cost"] / b["cost"] if b["cost"] else 0.0,
            "failed_cost_saved": 1 - lrn["cost_failed"] / b["cost_failed"] if b["cost_failed"] else 0.0,
        }
    return out


def _system_files(files: list[Path], out: Path) -> list[Path]:
    """One file per system: the corpus's files, the simulated one split by topology."""
    import orjson

    out.mkdir(parents=True, exist_ok=True)
    by_system: dict[str, list[bytes]] = {}
    for path in files:
        for line in path.read_bytes().splitlines():
            if line.strip():
                by_system.setdefault(orjson.loads(line)["system"].split("/", 1)[0], []).append(line)
    written = []
    for system, lines in sorted(by_system.items()):
        written.append(out / f"{system}.jsonl")
        written[-1].write_bytes(b"\n".join(lines) + b"\n")
    return written


def in_system(section: Section, files: list[Path], work: Path) -> None:
    """The in-system reference: each system trained on and judged on its own runs (tasks held out)."""
    systems = _system_files(files, work / "systems")
    floors: dict[str, dict[str, dict[str, float]]] = {}
    for floor in IN_SYSTEM_FLOORS:
        per: dict[str, dict[str, float]] = {}
        for path in systems:
            model = work / f"in-system-{floor}" / path.stem
            flags = _flags_of(IN_SYSTEM, {"--max-success-loss": floor})
            run(stopserve_cmd("train", str(path), "-o", str(model), *flags, "--no-progress"), timeout=3600)
            per.update(_per_system(json.loads((model / "manifest.json").read_text()), shipped=True))
        floors[floor] = per
    section.data = {"in_system": floors, "flags": _flags_of(IN_SYSTEM, {})}
    section.add(
        "The ceiling of knowing the system: each system's policy trained on **its own** runs and judged "
        "on its held-out tasks (CV by task; what the guard ships: the learned model or the tuned rule), "
        "under the default's value floor and two success floors. Leave-one-system-out cannot expect "
        "more than this.",
        "",
    )
    names = sorted(next(iter(floors.values())))
    header = ["system", "runs", "behavior", "oracle"]
    for floor in IN_SYSTEM_FLOORS:
        header += [f"gap closed, floor {floor} (%)", f"success lost, floor {floor} (pt)"]
    rows = []
    for name in names:
        first = floors[IN_SYSTEM_FLOORS[0]][name]
        row: list[Any] = [name, first["runs"], first["behavior"], first["oracle"]]
        for floor in IN_SYSTEM_FLOORS:
            r = floors[floor][name]
            row += [100 * r["gap_closed"], 100 * r["success_lost"]]
        rows.append(row)
    mean_row: list[Any] = ["mean", "", "", ""]
    for floor in IN_SYSTEM_FLOORS:
        per = floors[floor]
        gaps = [r["gap_closed"] for r in per.values() if r["gap_closed"] == r["gap_closed"]]
        mean_row += [100 * sum(gaps) / len(gaps), max(100 * r["success_lost"] for r in per.values())]
    rows.append(mean_row)
    section.table(header, rows)
    section.add("", "(the mean row's success column is the worst system's loss)")


def main() -> int:
    ap = parser(__doc__ or "")
    ap.add_argument("--ablation", action="store_true", help="also train the ablation rows (4x the time)")
    ap.add_argument(
        "--in-system",
        action="store_true",
        help="only the in-system reference: each system trained and judged on its own runs (its own section)",
    )
    args = ap.parse_args()
    title = (
        "The default model: the in-system reference (issue 23)"
        if args.in_system
        else "The default model on systems it has never seen (issue 23)"
    )
    section = Section(title, sys.argv)
    if not SHARED_DATA.exists():
        section.skip(f"{SHARED_DATA} not found: the real runs are needed")
        section.emit(args.out)
        return 0
    from stopserve.training.corpus import default_corpus

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-default-"))
    limits, sim_n = LIMITS[args.size]
    files = default_corpus(SHARED_DATA, work / "corpus", limits=limits, sim_n=sim_n)
    if args.in_system:
        in_system(section, files, work)
        section.emit(args.out)
        return 0
    rows = ABLATIONS if args.ablation else ABLATIONS[:1]
    results: dict[str, Any] = {}
    for label, changes in rows:
        model = work / f"model-{len(results)}"
        flags = _flags(changes)
        run(stopserve_cmd("train", *map(str, files), "-o", str(model), *flags, "--no-progress"), timeout=7200)
        manifest = json.loads((model / "manifest.json").read_text())
        results[label] = {
            "shipped": manifest["guard"]["shipped"],
            "per_system": _per_system(manifest),
            "flags": flags,
        }
    section.data = {"results": results, "size": args.size}
    shipped = results["shipped recipe"]
    per = shipped["per_system"]
    section.add(
        f"What the recipe shipped: **{shipped['shipped']}**. Each system's runs as decided by a "
        "policy fitted and tuned without that system, cost share 0.3:",
        "",
    )
    section.table(
        ["held-out system", "runs", "ended at a cap", "behavior", "default", "oracle", "gap closed (%)",
         "success lost (pt)", "cost saved (%)", "failed runs' cost saved (%)"],
        [
            [s, r["runs"], r["censored"], r["behavior"], r["value"], r["oracle"], 100 * r["gap_closed"],
             100 * r["success_lost"], 100 * r["cost_saved"], 100 * r["failed_cost_saved"]]
            for s, r in per.items()
        ],
    )  # fmt: skip
    value_ok = [s for s, r in per.items() if r["value"] >= r["behavior"] - 0.005]
    success_ok = [s for s, r in per.items() if r["success_lost"] <= 0.01 + 1e-12]
    gaps = [r["gap_closed"] for r in per.values() if r["gap_closed"] == r["gap_closed"]]
    mean_gap = sum(gaps) / len(gaps) if gaps else float("nan")
    stalled = {s: r["failed_cost_saved"] for s, r in per.items() if s.startswith("intercode")}
    best_stalled = max(stalled.values()) if stalled else float("nan")
    short = ", ".join(f"{s} {100 * per[s]['success_lost']:.2f}" for s in per if s not in success_ok)
    n = len(per)
    section.targets += [
        Target(
            "value >= behavior - 0.005, every held-out system",
            f"{len(value_ok)} of {n}",
            "every system",
            len(value_ok) == n,
        ),
        Target(
            "success >= behavior - 1 point, every held-out system",
            f"{len(success_ok)} of {n}" + (f" (short: {short})" if short else ""),
            "every system",
            len(success_ok) == n,
        ),
        Target(
            "behavior -> oracle gap closed, mean over held-out systems",
            f"{100 * mean_gap:.1f}%",
            ">= 20%",
            mean_gap >= 0.20,
        ),
        Target(
            "failed runs' cost saved where they go on after their last progress (InterCode)",
            ", ".join(f"{s} {100 * v:.1f}%" for s, v in stalled.items()) or "—",
            ">= 25%",
            best_stalled >= 0.25 if stalled else None,
        ),
    ]
    if len(results) > 1:
        section.add("Ablation: the same leave-one-system-out replay, one part of the recipe changed:", "")
        table = []
        for label, res in results.items():
            p = res["per_system"]
            g = [r["gap_closed"] for r in p.values() if r["gap_closed"] == r["gap_closed"]]
            table.append([
                label, res["shipped"], 100 * sum(g) / len(g) if g else float("nan"),
                max(100 * r["success_lost"] for r in p.values()),
                sum(1 for r in p.values() if r["success_lost"] > 0.01 + 1e-12),
                min(r["value"] - r["behavior"] for r in p.values()),
            ])  # fmt: skip
        section.table(
            ["recipe", "shipped", "mean gap closed (%)", "worst success lost (pt)",
             "systems losing > 1 pt", "worst value - behavior"],
            table,
        )  # fmt: skip
    section.emit(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
