"""Run ``stopserve train`` in this process, recording every ``lightgbm.train`` call, then
replay the same boosters with raw ``lightgbm.train`` on the same matrix.

    python bench/_train_probe.py OUT.json -- <stopserve train arguments>

Each recorded call keeps its rows, labels, weights, parameters and the number of
rounds it ran; the replay builds a fresh ``lightgbm.Dataset`` from the same matrix
rows and trains for that many rounds (no validation set), which is what a user
calling LightGBM directly for the same models would pay. The recorded arrays stay
alive until the end, so the peak memory of this process overstates that of a plain
``stopserve train`` by ``probe_bytes`` at most (reported).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from typing import Any

import lightgbm as lgb
import numpy as np

CALLS: list[dict[str, Any]] = []
MATRIX: dict[str, Any] = {}
FIT: dict[str, Any] = {}
_raw_train = lgb.train


def _recording_train(params: dict[str, Any], train_set: Any, *args: Any, **kwargs: Any) -> Any:
    t0 = time.perf_counter()
    booster = _raw_train(params, train_set, *args, **kwargs)
    took = time.perf_counter() - t0
    ref = train_set.reference
    if ref is not None and "X" not in MATRIX:
        MATRIX["X"] = ref.data
    rows = train_set.used_indices
    CALLS.append(
        {
            "params": dict(params),
            "rows": None if rows is None else np.asarray(rows),
            "label": train_set.get_label(),
            "weight": train_set.get_weight(),
            "rounds": booster.current_iteration(),
            "seconds": took,
            "valid": bool(kwargs.get("valid_sets")),
        }
    )
    return booster


def main(argv: list[str]) -> int:
    out = argv[0]
    train_args = argv[argv.index("--") + 1 :]
    lgb.train = _recording_train
    import stopserve.training.fit as fit

    real_fit = fit.PolicyLearner.fit

    def timed_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0, c0 = time.perf_counter(), time.process_time()
        learner = real_fit(self, *args, **kwargs)
        FIT["seconds"] = time.perf_counter() - t0
        FIT["cpu_seconds"] = time.process_time() - c0
        FIT["timings"] = dict(learner.timings_)
        FIT["chosen"] = learner.chosen_
        FIT["rows"] = int(learner.dp_.n_rows)
        FIT["traces"] = int(learner.dp_.n_traces)
        return learner

    fit.PolicyLearner.fit = timed_fit  # type: ignore[method-assign]
    from stopserve.cli import main as cli_main

    t0 = time.perf_counter()
    rc = cli_main(["train", *train_args])
    cli_s = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    lgb.train = _raw_train
    probe_bytes = sum(
        (c["rows"].nbytes if c["rows"] is not None else 0)
        + (c["label"].nbytes if c["label"] is not None else 0)
        + (c["weight"].nbytes if c["weight"] is not None else 0)
        for c in CALLS
    )
    report: dict[str, Any] = {
        "rc": rc,
        "cli_seconds": cli_s,
        "fit": FIT,
        "peak_rss_bytes": peak_kib * 1024,
        "probe_bytes": probe_bytes,
        "calls": len(CALLS),
        "recorded_lgb_seconds": sum(c["seconds"] for c in CALLS),
    }
    X = MATRIX.get("X")
    if rc == 0 and X is not None:
        X = np.asarray(X)
        report["matrix_shape"] = list(X.shape)
        raw = raw_cpu = 0.0
        for c in CALLS:
            params = dict(c["params"])
            rows = c["rows"]
            sub = X if rows is None else X[rows]  # slicing is not LightGBM's work: not timed
            t0, c0 = time.perf_counter(), time.process_time()
            ds = lgb.Dataset(sub, label=c["label"], weight=c["weight"], params={"verbose": -1})
            _raw_train(params, ds, num_boost_round=max(1, c["rounds"]))
            raw += time.perf_counter() - t0
            raw_cpu += time.process_time() - c0
            del sub, ds
        report["raw_seconds"] = raw
        report["raw_cpu_seconds"] = raw_cpu
        report["rounds"] = [c["rounds"] for c in CALLS]
    with open(out, "w") as fh:
        json.dump(report, fh, indent=2)
    return int(rc)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
