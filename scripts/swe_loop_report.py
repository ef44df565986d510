"""Replay the loop detector over mini-swe-agent runs; print the table in docs/safety.md.

    python scripts/swe_loop_report.py ../shared/data/swe-verified-gemini3-train

For the default config and for each pattern alone at lower thresholds: how many
runs it would have stopped, at which step (decision point), and how many of those
runs had resolved the issue (a false stop).
"""

from __future__ import annotations

import statistics
import sys

from stopserve.features import LOOP_PATTERNS, RunState
from stopserve.importers import mini_swe_agent
from stopserve.safety import LoopConfig, SafetyConfig
from stopserve.trace import Trace, is_decision_point

DEFAULTS = LoopConfig()


def only(pattern: str, threshold: int) -> SafetyConfig:
    off = dict.fromkeys(LOOP_PATTERNS, 0)
    off[pattern] = threshold
    return SafetyConfig(loop=LoopConfig(**off))


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


def main(argv: list[str]) -> int:
    traces = list(mini_swe_agent.read(argv or ["../shared/data/swe-verified-gemini3-train"]))
    n_res = sum(1 for t in traces if t.rewards.get("team") == 1.0)
    print(f"{len(traces)} runs, {n_res} resolved\n")
    print("| config | runs stopped | of them resolved | at step | median share of the run done |")
    print("|---|---|---|---|---|")
    print(
        row(
            "defaults (" + ", ".join(f"{p} {getattr(DEFAULTS, p)}" for p in LOOP_PATTERNS) + ")",
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
