"""One `PolicyLearner.fit` + save, in this process or on a local Dask cluster; JSON figures out.

    python bench/_dask_probe.py OUT.json MODE MODEL_DIR [train options as JSON] -- TRACE_FILES...

MODE is ``single`` (the single-process trainer, ``LocalBackend``) or ``local:N``
(``DaskBackend`` on N local one-thread workers). Records wall seconds of each phase
(featurize = building the decision points; LightGBM = every booster's training call;
replay = the replays through ``decide``; the rest: tuning, the guard, predictions,
saving), this process's peak RSS and, for Dask, each worker's peak RSS (its own
``ru_maxrss``, asked before the cluster closes), and CPU seconds of the client (with
the local scheduler, which runs in it) and of each worker. Run once per mode, in a fresh process,
so no peak is another mode's.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any


class Timed:
    """A backend whose calls are timed (featurize, replay) and whose trainer is counted."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seconds = {"featurize": 0.0, "replay": 0.0}

    def decision_points(self, source: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.inner.decision_points(source, **kw)
        finally:
            self.seconds["featurize"] += time.perf_counter() - t0

    def trainer(self, *args: Any) -> Any:
        return self.inner.trainer(*args)

    def replay(self, *args: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.inner.replay(*args, **kw)
        finally:
            self.seconds["replay"] += time.perf_counter() - t0


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def main() -> int:
    out, mode, model_dir, options = sys.argv[1:5]
    files = sys.argv[sys.argv.index("--") + 1 :]
    from stopserve.training.fit import LocalBackend, PolicyLearner

    opts: dict[str, Any] = json.loads(options)
    fit_kw = {k: opts.pop(k) for k in ("cost_unit", "group_by") if k in opts}
    from stopserve.objective import Objective

    opts["objective"] = Objective.of(opts.pop("lam", None), opts.pop("cost_share", None))
    backend: Any = None
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    if mode == "single":
        inner: Any = LocalBackend()
    else:
        from stopserve.training.distributed import DaskBackend

        backend = DaskBackend.connect(mode)
        inner = backend
    t_up = time.perf_counter() - t0
    timed = Timed(inner)
    t0 = time.perf_counter()
    learner = PolicyLearner(backend=timed, **opts).fit(files, **fit_kw)
    learner.save(model_dir)
    wall = time.perf_counter() - t0
    workers: dict[str, int] = {}
    worker_cpu: dict[str, float] = {}
    if backend is not None:
        workers = backend.client.run(_peak_rss)
        worker_cpu = backend.client.run(_cpu_s)
        backend.close()
    lgb_s = float(learner.timings_["lightgbm_train_s"])
    doc = {
        "mode": mode,
        "cluster_start_s": t_up,
        "wall_s": wall,
        "featurize_s": timed.seconds["featurize"],
        "lightgbm_s": lgb_s,
        "replay_s": timed.seconds["replay"],
        "rest_s": wall - timed.seconds["featurize"] - lgb_s - timed.seconds["replay"],
        "load_1min": [load_start, os.getloadavg()[0]],
        "client_peak_rss": _peak_rss(),
        "client_cpu_s": _cpu_s(),
        "worker_cpu_s": worker_cpu,
        "worker_peak_rss": workers,
        "n_rows": learner.dp_.n_rows,
        "n_traces": learner.dp_.n_traces,
        "cv_learned": learner.cv_["policies"]["learned"]["value"],
        "cv_best_heuristic": learner.cv_["policies"][learner.cv_["best_heuristic"]]["value"],
        "shipped": learner.guard_["shipped"],
        "cv_values_learned": learner.cv_values_["learned"].tolist(),
        "groups": learner.dp_.group.tolist(),
    }
    Path(out).write_text(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
