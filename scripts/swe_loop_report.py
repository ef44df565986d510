"""Replay the loop detector over mini-swe-agent runs; print the tables in docs/safety.md.

    python scripts/swe_loop_report.py ../shared/data/swe-verified-gemini3-train
    python scripts/swe_loop_report.py ../shared/data/swe-verified-gemini3-train --simulated sim.jsonl

For the default config and for each pattern alone at lower thresholds: how many
runs it would have stopped, at which step (decision point), and how many of those
runs had resolved the issue (a false stop). With ``--simulated`` (traces from
``stopserve simulate``), also how often the default detector fires on simulated runs
that got stuck (an aggregate repeating the previous one's content ref: a stuck round)
and on runs that never did, per topology.
"""

from __future__ import annotations

import argparse
import collections
import statistics

from stopserve.features import LOOP_PATTERNS, RunState
from stopserve.importers import mini_swe_agent
from stopserve.safety import LoopConfig, SafetyConfig
from stopserve.trace import Trace, is_decision_point, read_traces

DEFAULTS = LoopConfig()


def only(pattern: str, threshold: int) -> SafetyConfig:
    off = dict.fromkeys(LOOP_PATTERNS, 0)
    off[pattern] = threshold
    return SafetyConfig(loop=LoopConfig(**off, nudge=0))  # stopping at the threshold itself


def row(label: str, cfg: SafetyConfig, traces: list[Trace]) -> str:
    hits = []
    for tr in traces:
        found = cfg.first_stop(tr)
        if found is not None:
            total = sum(is_decision_point(e) for e in tr.events)
            hits.append((tr, found[0], total))
    resolved = sum(1 for tr, _, _ in hits if tr.rewards.get("team") == 1.0)
    if hits:
        steps = [turn for _, turn, _ in hits]
        where = f"{min(steps)}–{max(steps)} (median {statistics.median(steps):g})"
        share = statistics.median(turn / total for _, turn, total in hits)
        frac = f"{share:.0%}"
    else:
        where = frac = "–"
    return f"| {label} | {len(hits)} | {resolved} | {where} | {frac} |"


def stuck_rounds(trace: Trace) -> int:
    """Longest run of aggregates repeating the previous aggregate's content ref."""
    run = longest = 0
    prev: str | None = None
    for e in trace.events:
        if e.type == "aggregate":
            run = run + 1 if e.content_ref is not None and e.content_ref == prev else 0
            longest = max(longest, run)
            prev = e.content_ref
    return longest


def simulated(path: str) -> None:
    cfg = SafetyConfig()
    # per topology: [runs never stuck, of them stopped, runs stuck >= 2 rounds, of them stopped]
    table: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0])
    patterns: collections.Counter[str] = collections.Counter()
    for tr in read_traces(path):
        found = cfg.first_stop(tr.model_copy(update={"budget": None}))  # the loop nets alone
        stuck = stuck_rounds(tr)
        row = table[tr.topology or "unknown"]
        if stuck == 0:
            row[0] += 1
            row[1] += found is not None
        elif stuck >= 2:
            row[2] += 1
            row[3] += found is not None
        if found is not None:
            patterns[found[2].pattern or ""] += 1
    print("\n| topology | runs never stuck | of them stopped | runs stuck >= 2 rounds | of them stopped |")
    print("|---|---|---|---|---|")
    for topo, (n0, s0, n2, s2) in sorted(table.items()):
        print(f"| {topo} | {n0} | {s0} | {n2} | {s2} |")
    print("\npatterns that fired first: " + ", ".join(f"{p} {n}" for p, n in patterns.most_common()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("sources", nargs="*", default=["../shared/data/swe-verified-gemini3-train"])
    ap.add_argument("--simulated", metavar="TRACES", help="also report on simulated traces")
    args = ap.parse_args(argv)
    traces = list(mini_swe_agent.read(args.sources))
    n_res = sum(1 for t in traces if t.rewards.get("team") == 1.0)
    print(f"{len(traces)} runs, {n_res} resolved\n")
    print("| config | runs stopped | of them resolved | at step | median share of the run done |")
    print("|---|---|---|---|---|")
    print(
        row(
            "defaults ("
            + ", ".join(f"{p} {getattr(DEFAULTS, p)}" for p in LOOP_PATTERNS)
            + f"; then {DEFAULTS.nudge} nudges)",
            SafetyConfig(),
            traces,
        )
    )
    for pattern in LOOP_PATTERNS:
        default = getattr(DEFAULTS, pattern)
        low = 4 if pattern == "alternating_actions" else 2
        for threshold in range(low, default + 1):
            print(row(f"{pattern} = {threshold} alone", only(pattern, threshold), traces))
    # the longest run of each pattern anywhere in the runs: the margin below each default
    longest = dict.fromkeys(LOOP_PATTERNS, 0)
    for tr in traces:
        state = RunState(tr.topology, tr.budget)
        for e in tr.events:
            state.fold(e)
            for p in LOOP_PATTERNS:
                longest[p] = max(longest[p], state.loop_run(p))
    print("\n| pattern | default threshold | longest run seen in any run |")
    print("|---|---|---|")
    for p in LOOP_PATTERNS:
        print(f"| {p} | {getattr(DEFAULTS, p)} | {longest[p]} |")
    if args.simulated:
        simulated(args.simulated)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
