"""In-process decide latency: fold the new event, then Policy.decide, at 10, 1,000 and
100,000 events into a run.

Each timed call folds one fresh decision-point event into a RunState already holding
N events and asks the policy. Safety nets are configured wide open so the model path
is what is timed (a budget stop would short-circuit it). Baseline in the same run:
the same loop with ``Policy.safety_only()`` (no model), and the model with LightGBM's
predict instead of the compiled boosters (``engine="lightgbm"``, the fallback). Target:
<= 50 µs median at 1,000 events, flat from 10 to 100,000. The profile of the model row
at 1,000 events is always printed (pyinstrument).
"""

from __future__ import annotations

import gc
import math
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from _common import ROOT, Section, Target, details, load, median, parser, percentile, profile_text
from _events import decision_event, event_dicts
from _model import model_dir

TARGET_US = 50.0
FLAT_RATIO = 1.3  # "flat": median at 100,000 events within 1.3x of the median at 10


def open_safety(safety: ModuleType) -> Any:
    """A SafetyConfig that never fires on the benchmark's events (huge caps, no min_turns)."""
    cfg: dict[str, Any] = {
        "max_turns": 10**9,
        "max_seconds": 1e12,
        "max_tokens": 10**15,
        "max_usd": 1e12,
        "min_turns": 0,
    }
    return safety.SafetyConfig.model_validate(cfg)


def _prefix(n: int) -> list[Any]:
    from stopserve.trace import Event

    return [Event.model_validate(d) for d in event_dicts(n, seed=n, prefix="p")]


def measure(
    features: ModuleType, policy: Any, safety: Any, n_prefix: int, iters: int, *, profile: bool = False
) -> dict[str, Any]:
    """Latencies (µs) of fold-one-event + decide on runs holding ``n_prefix`` events.

    ``profile``: run the timed loop (only it, not the set-up) under pyinstrument and return
    its call tree as ``profile``.
    """
    from stopserve.trace import Event

    prefix = _prefix(n_prefix)
    t_end = prefix[-1].t if prefix else 0.0
    per_state = max(1, n_prefix // 10)  # each state grows by at most 10% while timed
    n_states = math.ceil(iters / per_state)
    states = []
    for _ in range(n_states):
        st = features.RunState()
        for e in prefix:
            st.fold(e)
        states.append(st)
    fresh = [Event.model_validate(decision_event(i, t_end + 1 + i * 0.01)) for i in range(iters)]
    # warm up on a throwaway state: first calls pay for lazy imports and caches
    warm = features.RunState()
    for e in prefix[: min(len(prefix), 200)]:
        warm.fold(e)
    for i, e in enumerate(event_dicts(200, seed=99, prefix="w", t0=warm.elapsed)):
        warm.fold(Event.model_validate(e))
        if i % 3 == 2:
            policy.decide(warm, safety=safety)
    total: list[float] = []
    decide_only: list[float] = []
    features_only: list[float] = []
    actions: dict[str, int] = {}
    clock = time.perf_counter_ns

    def loop() -> None:
        for i in range(iters):
            st = states[i // per_state]
            ev = fresh[i]
            t0 = clock()
            st.fold(ev)
            t1 = clock()
            dec = policy.decide(st, safety=safety)
            t2 = clock()
            total.append((t2 - t0) / 1e3)
            decide_only.append((t2 - t1) / 1e3)
            actions[dec.action] = actions.get(dec.action, 0) + 1

    cpu0 = time.thread_time_ns()
    prof = profile_text(loop, max_lines=60) if profile else None
    if not profile:
        loop()
    cpu_us = (time.thread_time_ns() - cpu0) / 1e3 / iters
    for i in range(min(iters, 2000)):
        st = states[i // per_state]
        t0 = clock()
        st.features()
        features_only.append((clock() - t0) / 1e3)
    return {
        "events": n_prefix,
        "iters": iters,
        "p50_us": median(total),
        "p99_us": percentile(total, 99),
        "mean_us": sum(total) / len(total),
        "cpu_mean_us": cpu_us,
        "decide_p50_us": median(decide_only),
        "features_p50_us": median(features_only),
        "actions": actions,
        "profile": prof,
    }


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__ or "").parse_args(argv)
    sec = Section("In-process decide latency (fold + predict)", sys.argv)
    mods = [
        load("stopserve.features", "RunState"),
        load("stopserve.safety", "SafetyConfig"),
        load("stopserve.policy", "Policy"),
    ]
    missing = [m for m in mods if isinstance(m, str)]
    if missing:
        for why in missing:
            sec.skip(why)
        sec.emit(args.out)
        return 0
    features, safety_mod, policy_mod = (m for m in mods if not isinstance(m, str))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="stopserve-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    sizes = {"tiny": (10, 1_000), "quick": (10, 1_000, 100_000), "full": (10, 1_000, 100_000)}[args.size]
    iters = {"tiny": 100, "quick": 3_000, "full": 20_000}[args.size]
    safety = open_safety(safety_mod)

    policies: list[tuple[str, Any]] = []
    mdir, how = model_dir(workdir, args.size)
    if mdir is None:
        sec.skip(f"no model to time ({how}); timing the safety-only policy alone")
    else:
        loaded = policy_mod.Policy.load(mdir)
        policies.append(("model" if loaded.kind == "model" else f"model dir of kind {loaded.kind}", loaded))
        sec.add(f"Model: {how}; kind `{policies[0][1].kind}`, version `{policies[0][1].model_version}`.", "")
        info = getattr(loaded, "inference", None)
        if info is not None:
            sec.data["inference"] = info
            sec.add(f"Inference (`Policy.inference`): engine `{info['engine']}`: {info['detail']}.", "")
            if info["engine"] != "lightgbm" and args.size != "tiny":
                fallback = policy_mod.Policy.load(mdir, engine="lightgbm")
                policies.append(("model, LightGBM fallback (`STOPSERVE_INFERENCE=lightgbm`)", fallback))
    shipped = ROOT / "models" / "default"
    if args.size != "tiny" and mdir != shipped and (shipped / "manifest.json").is_file():
        try:
            default = policy_mod.Policy.load(shipped)
        except Exception as exc:  # a stale shipped model is worth a line, not a crash
            sec.skip(f"could not load models/default: {exc}")
        else:
            policies.append((f"shipped models/default ({default.kind})", default))
    policies.append(("safety only (baseline)", policy_mod.Policy.safety_only(safety)))

    rows = []
    results: dict[str, list[dict[str, Any]]] = {}
    gc_was = gc.isenabled()
    for label, pol in policies:
        for n in sizes:
            t0 = time.perf_counter()
            r = measure(features, pol, safety, n, iters)
            print(
                f"{label} @ {n}: p50 {r['p50_us']:.1f} us ({time.perf_counter() - t0:.1f}s)", file=sys.stderr
            )
            results.setdefault(label, []).append(r)
            rows.append(
                [
                    label,
                    n,
                    r["p50_us"],
                    r["p99_us"],
                    r["mean_us"],
                    r["cpu_mean_us"],
                    r["decide_p50_us"],
                    r["features_p50_us"],
                    ", ".join(f"{k} {v}" for k, v in sorted(r["actions"].items())),
                ]
            )
    assert gc.isenabled() == gc_was
    sec.data["results"] = results
    sec.add(
        f"{iters:,} timed calls per row, each folding one fresh `return` event into a run already holding "
        "N events, then `Policy.decide(state, safety=wide-open caps)`; garbage collector on, as in the "
        "service. µs per call, wall clock; `CPU µs/call` = the thread's CPU time over the loop / calls "
        "(leaves "
        "out waiting for a core on this shared machine). `decide` = the decide call alone; `features()` = "
        "the feature vector alone.",
        "",
    )
    sec.table(
        [
            "policy",
            "events in run",
            "p50 µs",
            "p99 µs",
            "mean µs",
            "CPU µs/call",
            "decide p50 µs",
            "features() p50 µs",
            "actions",
        ],
        rows,
    )
    main_rows = results[policies[0][0]]
    at = {r["events"]: r for r in main_rows}
    if 1_000 in at:
        p50 = at[1_000]["p50_us"]
        met: bool | None = p50 <= TARGET_US
        if policies[0][0] != "model":
            met = None  # the target is about the model path; safety nets alone do not count
        sec.targets.append(
            Target(
                f"decide p50 at 1,000 events ({policies[0][0]})",
                f"{p50:.1f} µs",
                f"<= {TARGET_US:.0f} µs",
                met,
            )
        )
        if policies[0][0] == "model" and args.size != "tiny":
            pol = policies[0][1]
            prof = measure(features, pol, safety, 1_000, max(iters // 4, 100), profile=True)["profile"]
            sec.data["profile"] = prof
            sec.add(*details("profile of fold + decide at 1,000 events (pyinstrument)", prof))
    if 10 in at and 100_000 in at:
        ratio = at[100_000]["p50_us"] / at[10]["p50_us"]
        sec.targets.append(
            Target(
                "flat: p50 at 100,000 / p50 at 10 events",
                f"{ratio:.2f}x",
                f"<= {FLAT_RATIO}x",
                ratio <= FLAT_RATIO if policies[0][0] == "model" else None,
            )
        )
    sec.emit(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
