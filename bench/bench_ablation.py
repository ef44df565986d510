"""Feature ablation: the held-out value of the trained policy with each feature group left out.

For every set (SWE held out by repository, MINT and InterCode by task, the simulator by a
fresh seed), at cost share 0.3: ``stopserve train TRAIN --features <all but one group>``,
then ``stopserve evaluate`` on the held-out side (heuristics tuned on the training side).
A group's gain is (value with every feature) − (value without it): what the group adds.
The groups are ``stopserve.features.FEATURE_GROUPS``. Slow: one training per set and
group; ``--size quick`` subsamples the training sides.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import Section, parser
from _model import run, stopserve_cmd
from bench_quality import _prepare

SHARE = 0.3


def _value(train: Path, test: Path, group: str, features: str, work: Path) -> tuple[float, str]:
    model = work / f"abl-{train.stem}-{abs(hash(features)) % 10**8}"
    args = ["train", str(train), "-o", str(model), "--cost-share", str(SHARE), "--group-by", group]
    run(stopserve_cmd(*args, "--features", features, "--no-progress"), timeout=7200)
    cmd = ["evaluate", "--model", str(model), str(test), "--tune-on", str(train), "--cost-share", str(SHARE)]
    rep = json.loads(run(stopserve_cmd(*cmd, "--group-by", group, "--json"), timeout=7200).stdout)
    learned = rep["policies"]["learned"]
    return float(learned["value"]), str(learned["kind"])


def main() -> int:
    from stopserve.features import FEATURE_GROUPS, FEATURE_NAMES

    ap = parser(__doc__ or "")
    ap.add_argument("--sets", default="swe,mint,intercode,sim")
    args = ap.parse_args()
    section = Section(
        "Feature ablation (issue 12): held-out value without each group, cost share 0.3", sys.argv
    )
    work = args.workdir or Path(tempfile.mkdtemp(prefix="stopserve-ablation-"))
    work.mkdir(parents=True, exist_ok=True)
    sets = {k: v for k, v in _prepare(work, args.size).items() if k in args.sets.split(",")}
    rows: list[list[Any]] = []
    data: dict[str, Any] = {}
    for label, (train, test, group) in sets.items():
        full, kind = _value(train, test, group, "all", work)
        data[label] = {"all": full}
        row: list[Any] = [label, f"{full:.4f} ({kind})"]
        for name, members in FEATURE_GROUPS.items():
            keep = ",".join(n for n in FEATURE_NAMES if n not in members)
            value, kind = _value(train, test, group, keep, work)
            data[label][name] = value
            row.append(f"{full - value:+.4f}" + ("" if kind == "model" else f" ({kind})"))
            print(f"{label} without {name}: {value:.4f} ({kind})", file=sys.stderr)
        rows.append(row)
    section.add(
        "Each cell: held-out value with every feature minus the value without that group (positive: the "
        "group helps). `(heuristic)` marks a cell where the guard shipped the tuned heuristic instead of a "
        "model. Training sides subsampled at `--size quick`.",
        "",
    )
    section.table(["set", "all features (shipped)", *(f"− {g}" for g in FEATURE_GROUPS)], rows)
    section.data = data
    section.emit(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
