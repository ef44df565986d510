"""Sketch cost: what a content sketch costs per event in the client, over the sizes real runs have.

``python bench/bench_sketch.py [--size tiny|quick|full] [--out F.json]`` measures, on the texts
of real runs (../shared/data: SWE agent steps, MINT turns, InterCode actions and observations,
the texts the importers sketch):

- the size distribution of those texts (characters), per source;
- per event, over that distribution, in the same run: the client recording the event
  (``EventRecorder.returned(..., content=text)``) with its sketch, and without it
  (``sketch=False``: the baseline, content_ref hashing included), ``content_ref`` alone and
  ``sketch`` alone; means over all events (CPU time, the best of the repeats), and the
  percentiles of one sketch's cost (each text timed alone, the best of 3);
- ``parse`` and ``similarity`` (what RunState calls per event);
- the sketch's agreement with the exact Jaccard similarity of the same shingles: for every
  step of a run, does it repeat an earlier one at similarity >= 0.8, by both.

Targets (issue 37): sketch <= 20 us per event in the client (mean over the real sizes);
similarity <= ~1 us. The command hook's cost change is in ``bench_hook.py`` (its
``--no-sketch`` row).
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from _common import ROOT, SHARED_DATA, Section, Target, parser, percentile

sys.path.insert(0, str(ROOT / "tests" / "signals"))

from real_texts import agreement, intercode_runs, mint_runs, swe_runs

from stopserve.client import EventRecorder
from stopserve.ids import content_ref
from stopserve.signals import sketch as sk

SOURCES: dict[str, tuple[Callable[[Path, int], Iterator[list[str]]], Path]] = {
    "SWE agent": (swe_runs, SHARED_DATA / "swe-verified-gemini3-train"),
    "MINT": (mint_runs, SHARED_DATA / "mint-train"),
    "InterCode": (intercode_runs, SHARED_DATA / "intercode-train"),
}
#: runs read per source (texts for the cost part), runs for the agreement part, repeats
RUNS = {"tiny": (20, 10, 1), "quick": (300, 60, 3), "full": (3000, 200, 5)}


def _texts(limit: int) -> dict[str, list[str]]:
    out = {}
    for name, (read, folder) in SOURCES.items():
        if folder.exists():
            out[name] = [
                t for run in read(folder, limit if name != "SWE agent" else max(1, limit // 10)) for t in run
            ]
    return out


def _cpu_per_item(work: Callable[[], None], n: int, repeats: int) -> float:
    """Best CPU microseconds per item of ``work`` (which does ``n`` items) over ``repeats``."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        work()
        best = min(best, time.process_time() - t0)
    return best / n * 1e6


def _cost(texts: list[str], repeats: int) -> dict[str, float]:
    plain, sketched = EventRecorder(sketch=False, id_prefix="b-"), EventRecorder(id_prefix="s-")

    def record(rec: EventRecorder) -> Callable[[], None]:
        def work() -> None:
            for text in texts:
                rec.returned("bash", content=text)
            rec.drain()

        return work

    def each(fn: Callable[[str], object]) -> Callable[[], None]:
        def work() -> None:
            for text in texts:
                fn(text)

        return work

    n = len(texts)
    row = {
        "record, no sketch": _cpu_per_item(record(plain), n, repeats),
        "record, with sketch": _cpu_per_item(record(sketched), n, repeats),
        "content_ref": _cpu_per_item(each(content_ref), n, repeats),
        "sketch": _cpu_per_item(each(sk.sketch), n, repeats),
    }
    row["added by the sketch"] = row["record, with sketch"] - row["record, no sketch"]
    return row


def _one_by_one(texts: list[str]) -> list[float]:
    out = []
    for text in texts:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter_ns()
            sk.sketch(text)
            best = min(best, time.perf_counter_ns() - t0)
        out.append(best / 1000)
    return out


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    n_runs, n_agree, repeats = RUNS[args.size]
    section = Section("Content sketches: cost per event and agreement with exact Jaccard", sys.argv)
    texts = _texts(n_runs)
    if not texts:
        section.skip(f"real runs not found at {SHARED_DATA}")
        section.emit(args.out)
        return
    section.add(
        f"Texts of real runs as the importers sketch them; the machine is shared (2 cores), so costs are "
        f"CPU time, the best of {repeats} repeat(s), beside the client's own recording of the same events "
        "measured in the same run."
    )
    sizes = {name: [len(t) for t in ts] for name, ts in texts.items()}
    section.add("", "Text sizes (characters):", "")
    section.table(
        ["source", "texts", "p50", "p90", "p99", "max", f"longer than {sk.MAX_CHARS} (capped)"],
        [
            [
                name,
                len(s),
                percentile(s, 50),
                percentile(s, 90),
                percentile(s, 99),
                max(s),
                f"{sum(x > sk.MAX_CHARS for x in s) / len(s):.1%}",
            ]
            for name, s in sizes.items()
        ],
    )
    pooled = [t for ts in texts.values() for t in ts]
    random.Random(0).shuffle(pooled)
    costs = {name: _cost(ts, repeats) for name, ts in texts.items()}
    costs["all"] = _cost(pooled, repeats)
    section.add("Mean CPU microseconds per event:", "")
    keys = ["record, no sketch", "record, with sketch", "added by the sketch", "content_ref", "sketch"]
    section.table(["source", *keys], [[name, *(row[k] for k in keys)] for name, row in costs.items()])
    one = _one_by_one(pooled)
    spread = {f"p{q}": percentile(one, q) for q in (50, 90, 99)} | {"max": max(one)}
    section.add(
        "One sketch, each text timed alone (wall microseconds, the best of 3): "
        + ", ".join(f"{k} {v:.1f}" for k, v in spread.items()),
        "",
    )
    wires = [sk.sketch(t) for t in pooled[:500]]
    parsed = [sk.parse(w) for w in wires]
    pairs = list(zip(parsed, parsed[1:] + parsed[:1], strict=True))

    def sims() -> None:
        for a, b in pairs:
            sk.similarity(a, b)

    def parses() -> None:
        for w in wires:
            sk.parse(w)

    similarity_us = _cpu_per_item(sims, len(pairs), max(repeats, 3))
    parse_us = _cpu_per_item(parses, len(wires), max(repeats, 3))
    section.add(f"`similarity`: {similarity_us:.2f} us per pair; `parse`: {parse_us:.2f} us per sketch.", "")
    agree = {}
    for name, (read, folder) in SOURCES.items():
        if folder.exists():
            agree[name] = agreement(read(folder, n_agree if name != "SWE agent" else max(2, n_agree // 8)))
    section.add("Agreement with the exact Jaccard similarity of the same shingles, at 0.8:", "")
    section.table(
        [
            "source",
            "steps",
            "steps repeating an earlier one (exact)",
            "agreement",
            "mean abs. error per pair",
        ],
        [[name, a["steps"], a["repeats"], f"{a['agreement']:.2%}", a["mae"]] for name, a in agree.items()],
    )
    mean_sketch = costs["all"]["added by the sketch"]
    section.targets += [
        Target(
            "sketch cost per event in the client, mean over real sizes",
            f"{mean_sketch:.1f} us (recording without it: {costs['all']['record, no sketch']:.1f} us)",
            "<= 20 us",
            mean_sketch <= 20,
        ),
        Target("similarity of two sketches", f"{similarity_us:.2f} us", "<= ~1 us", similarity_us <= 1.0),
    ]
    section.data = {
        "sizes": {
            name: {"n": len(s), "p50": percentile(s, 50), "p90": percentile(s, 90)}
            for name, s in sizes.items()
        },
        "cost_us": costs,
        "sketch_us_one_by_one": spread,
        "similarity_us": similarity_us,
        "parse_us": parse_us,
        "agreement": agree,
    }
    section.emit(args.out)


if __name__ == "__main__":
    main()
