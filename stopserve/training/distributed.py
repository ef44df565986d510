"""Featurize, fit and replay on a Dask cluster: ``--dask ADDRESS|local:N`` (extra ``[dask]``).

:class:`DaskBackend` is a :class:`stopserve.training.fit.Backend`: the learner and
``evaluate`` run unchanged on top of it, and a model trained with it is an ordinary
model directory.

- **Partitions.** The traces in the canonical order of :class:`~stopserve.training.backend.TraceSource`
  (by trace id, then content), cut every :data:`TRACES_PER_PARTITION` traces: the same traces
  in any file or line order give the same partitions, and so the same model for a seed on the
  same cluster. Each file is indexed by a task (validated, each trace's key and place); the
  client sorts the places, and each partition's tasks read their traces back from the files by
  place. Workers read the files by path: every worker must see them at the same path (one
  machine, or shared storage).
- **Decision points.** One task per partition folds its traces with the live
  featurizer (:func:`stopserve.training.labels.decision_part`); the client assembles
  the parts (:func:`~stopserve.training.labels.assemble_decision_points`: cost unit,
  groups and cost scales chosen over all of them, as on one machine). The feature
  matrix of each part also stays on the worker that built it.
- **Boosters.** ``lightgbm.dask`` estimators train on those worker-side parts; a fold's
  rows are taken from each part where it lives, so grouped folds hold exactly as on one
  machine (folds are drawn over groups, and a row is in a fold or not). LightGBM's Dask
  interface has no early stopping (lightgbm issue 3712): each booster trains its full
  rounds and is cut at the iteration LightGBM's early stopping would have kept,
  found from its validation curve on the client (:func:`best_iteration`).
- **Replays.** The truncation replay through ``Policy.decide`` is mapped over the
  partitions (:func:`stopserve.training.replay.replay_stops`): each task re-reads its
  file and replays the policies its traces need, batch-predicting the learned boosters
  on the partition's feature rows, which stay on the workers from featurizing to the
  last replay. Policies travel as their manifest and LightGBM model text, and are
  rebuilt on the worker.
- **Failures.** A task's error names the file (and line) of the trace it was folding; a worker lost
  while LightGBM trains ends the fit with a :class:`~stopserve.errors.TrainingError`
  (LightGBM's distributed training cannot go on without it); an unreachable scheduler
  is an error after ``timeout`` seconds. Nothing is written before the fit is whole.

>>> with DaskBackend.connect("local:2") as backend:                       # doctest: +SKIP
...     PolicyLearner(backend=backend).fit(["a.jsonl", "b.jsonl"]).save("model/")
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import numpy as np

from stopserve.errors import StopServeError, TraceError, TrainingError
from stopserve.evidence import DEFAULT_EVIDENCE, Evidence
from stopserve.extras import require
from stopserve.features import FEATURE_NAMES
from stopserve.manifest import Manifest
from stopserve.objective import Objective
from stopserve.policy import Policy
from stopserve.progress import progress_bar
from stopserve.safety import SafetyConfig
from stopserve.trace import Trace, read_traces
from stopserve.training.backend import EARLY_STOPPING, FileIndex, Place, TraceSource, read_places
from stopserve.training.labels import (
    DecisionPart,
    DecisionPoints,
    FloatArray,
    IntArray,
    assemble_decision_points,
    choose_cost_unit,
    decision_part,
    feature_columns,
)
from stopserve.training.replay import replay_stops

__all__ = [
    "CONNECT_TIMEOUT",
    "TRACES_PER_PARTITION",
    "DaskBackend",
    "DaskTrainer",
    "best_iteration",
    "write_parquet",
]

#: Seconds to wait for the scheduler before giving up.
CONNECT_TIMEOUT: Final = 10.0
#: Traces held in memory (not in files) are sent to the cluster in partitions of this many.
TRACES_PER_PARTITION: Final = 2000
#: How often the client checks that no worker left while LightGBM trains (seconds).
WATCH_INTERVAL: Final = 0.25
#: How long a failed fit waits for the scheduler to report a lost worker (seconds).
LOSS_GRACE: Final = 5.0
#: Cross-entropy is computed on probabilities clipped here, as LightGBM's metric does.
_EPS: Final = 1e-15


def _require_dask() -> None:
    require("dask", "dask.array", "distributed", "lightgbm.dask", what="--dask")


# --------------------------------------------------------------------------- partitions


@dataclass(frozen=True)
class _Partition:
    """Traces one task reads: places in files (a slice of the canonical order), a whole file in its
    own order (``stopserve features``), or a list of traces sent to the cluster."""

    label: str
    places: tuple[Place, ...] | None = None
    path: str | None = None
    traces: Any = None  # a Future of list[Trace]
    n_traces: int | None = None  # None: a whole file, counted when read

    def read(self, traces: list[Trace] | None) -> Iterator[Trace]:
        if self.places is not None:
            return read_places(self.places)
        return iter(read_traces(self.path)) if self.path is not None else iter(traces or [])


class _Where:
    """Wraps a partition's traces; ``label`` names the file and line of the trace being read or folded."""

    def __init__(self, part: _Partition, traces: list[Trace] | None) -> None:
        self.label = part.label
        self._places = part.places
        self._traces = part.read(traces)

    def __iter__(self) -> Iterator[Trace]:
        for p in self._places or ():
            self.label = p.file if p.line is None else f"{p.file}:{p.line}"  # before reading it
            trace = next(self._traces, None)
            if trace is None:
                return
            yield trace
        if self._places is None:
            yield from self._traces


def _files(places: Sequence[Place]) -> str:
    """The files some places are in, for a partition's label: the first three, then how many more."""
    files = list(dict.fromkeys(p.file for p in places))
    return ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")


def _explained(exc: BaseException, label: str) -> TrainingError:
    """A worker's error as one message that names the partition (the file) once."""
    text = str(exc)
    if isinstance(exc, StopServeError):
        return TrainingError(text if label in text else f"{label}: {text}")
    return TrainingError(f"{label}: {type(exc).__name__}: {text}")


def _featurize(
    part: _Partition,
    traces: list[Trace] | None,
    labels_from_rewards: bool,
    nets: SafetyConfig | None,
    evidence: Evidence = DEFAULT_EVIDENCE,
) -> DecisionPart:
    where = _Where(part, traces)
    try:
        return decision_part(where, labels_from_rewards=labels_from_rewards, nets=nets, evidence=evidence)
    except (StopServeError, OSError) as exc:
        raise _explained(exc, where.label) from None


def _matrix(part: DecisionPart) -> FloatArray:
    return part.X


def _masked(matrix: FloatArray, unused: Sequence[int]) -> FloatArray:
    if not unused:
        return matrix
    out = matrix.copy()
    out[:, list(unused)] = np.nan  # never split on: the model reads only the features used
    return out


def _take(matrix: FloatArray, rows: IntArray) -> FloatArray:
    return matrix[rows]


def _flags(part: DecisionPart) -> tuple[bool, bool]:
    """What choosing the cost unit reads of a part."""
    return part.any_usd, part.every_costed_has_usd


# --------------------------------------------------------------------------- policies on the wire


def _rebuild_policy(
    kind: Any,
    safety: SafetyConfig,
    manifest: dict[str, Any],
    rule: SafetyConfig | None,
    models: dict[str, str],
) -> Policy:
    import lightgbm as lgb

    boosters = {name: lgb.Booster(model_str=text) for name, text in models.items()}
    m = Manifest.from_data(manifest, source="a replayed policy")
    return Policy(kind=kind, safety=safety, manifest=m, rule=rule, boosters=boosters or None)


class _PolicyPickler(pickle.Pickler):
    """Dask moves task arguments as pickles; a policy goes as its manifest and LightGBM text.

    (A live policy holds LightGBM handles and a lock, which do not pickle; what travels
    is what a model directory holds, and nothing pickled is ever stored.)
    """

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, Policy):
            models = {name: b.model_to_string() for name, b in obj.boosters.items()}
            return _rebuild_policy, (obj.kind, obj.safety, obj.manifest.to_dict(), obj.rule, models)
        return NotImplemented


def _dump_policies(objs: list[Any]) -> bytes:
    buf = io.BytesIO()
    _PolicyPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(objs)
    return buf.getvalue()


def _replay_part(
    *,
    part: _Partition,
    traces: list[Trace] | None,
    offsets: IntArray,
    table: IntArray,
    policies: bytes,
    objective: Objective | None,
    matrix: FloatArray | None,
) -> IntArray:
    objs = pickle.loads(policies)  # built by this client's _dump_policies (see _PolicyPickler)
    where = _Where(part, traces)
    try:
        return replay_stops(
            where,
            offsets,
            lambda i: [objs[k] for k in table[i]],
            objective=objective,
            X=matrix,
        )
    except (StopServeError, OSError) as exc:
        raise _explained(exc, where.label) from None


# --------------------------------------------------------------------------- early stopping, after the fact


def best_iteration(
    booster: Any, matrix: FloatArray, y: FloatArray, *, weight: FloatArray, objective: str, patience: int
) -> int:
    """The iteration LightGBM's ``early_stopping(patience)`` on these rows would have kept.

    Walks the booster's validation curve (weighted l2, or cross-entropy for the
    ``cross_entropy`` objective: LightGBM's default metric of each) tree by tree from
    one leaf-index prediction, and stops as the callback does: at the first iteration
    ``patience`` rounds past the best, keeping the best (the first of equal scores).
    """
    n_trees = int(booster.current_iteration())
    if n_trees == 0 or matrix.shape[0] == 0:
        return max(n_trees, 1)
    leaves = np.asarray(booster.predict(matrix, pred_leaf=True), dtype=np.int64).reshape(matrix.shape[0], -1)
    raw = np.zeros(matrix.shape[0])
    w = weight / weight.sum() if weight.sum() > 0 else np.full(weight.shape, 1.0 / weight.size)
    best_score, best = np.inf, 0
    for t in range(n_trees):
        col = leaves[:, t]
        values = np.array([booster.get_leaf_output(t, j) for j in range(int(col.max()) + 1)])
        raw += values[col]
        if objective == "cross_entropy":
            p = np.clip(1.0 / (1.0 + np.exp(-raw)), _EPS, 1.0 - _EPS)
            score = float(-(w * (y * np.log(p) + (1.0 - y) * np.log(1.0 - p))).sum())
        else:
            score = float((w * (y - raw) ** 2).sum())
        if score < best_score:
            best_score, best = score, t + 1
        elif t + 1 - best >= patience:
            break
    return best


# --------------------------------------------------------------------------- the backend


class DaskBackend:
    """Where the learner works when given ``--dask``: the partitions of a Dask cluster.

    Build it with :meth:`connect` (and close it, or use it as a context manager).
    """

    def __init__(self, client: Any, *, cluster: Any = None, progress: bool = False) -> None:
        self.client = client
        self.cluster = cluster
        self.progress = progress
        _quiet_lightgbm()
        if cluster is not None:
            client.register_plugin(_worker_plugin(), name="stopserve-quiet-lightgbm")
        self._matrices: list[Any] = []
        self._bounds: IntArray = np.zeros(1, dtype=np.int64)

    # ----------------------------------------------------------------- connection

    @classmethod
    def connect(
        cls,
        address: str,
        *,
        timeout: float = CONNECT_TIMEOUT,
        progress: bool = False,
        log: Callable[[str], None] | None = None,
    ) -> DaskBackend:
        """``local:N`` starts N one-thread worker processes on loopback; else connect to a scheduler.

        ``log`` (e.g. ``print`` to stderr) is told the dashboard's address.
        """
        _require_dask()
        import dask
        from distributed import Client, LocalCluster

        if address == "local" or address.startswith("local:"):
            n = int(address.partition(":")[2] or (os.cpu_count() or 1))
            with dask.config.set({"distributed.worker.daemon": False}):
                cluster = LocalCluster(
                    n_workers=n,
                    threads_per_worker=1,
                    processes=True,
                    host="127.0.0.1",
                    dashboard_address="127.0.0.1:0",
                )
            client = Client(cluster)
            if log is not None:
                link = client.dashboard_link if _has_dashboard() else "not available (pip install bokeh)"
                log(f"Dask: {n} local workers, 1 thread each; dashboard {link}")
            return cls(client, cluster=cluster, progress=progress)
        try:
            client = Client(address, timeout=timeout)
        except (OSError, TimeoutError, ValueError) as exc:
            raise TrainingError(
                f"cannot reach the Dask scheduler at {address!r} within {timeout:g} s ({exc}); start it "
                "(dask scheduler) or check the address, or use --dask local:N to start workers here"
            ) from None
        if log is not None:
            n = len(client.nthreads())
            log(f"Dask: scheduler {address}, {n} workers; dashboard {client.dashboard_link}")
        return cls(client, progress=progress)

    def close(self) -> None:
        """Close the client, and the local cluster if this backend started one."""
        self._matrices = []
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    def __enter__(self) -> DaskBackend:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ----------------------------------------------------------------- tasks

    def _partitions(self, source: TraceSource) -> list[_Partition]:
        """The source's traces in the canonical order, cut every :data:`TRACES_PER_PARTITION`."""
        if source.paths is not None:
            places = self._places(source)
            parts = []
            for start in range(0, len(places), TRACES_PER_PARTITION):
                chunk = tuple(places[start : start + TRACES_PER_PARTITION])
                label = f"traces {start}-{start + len(chunk) - 1} by id (from {_files(chunk)})"
                parts.append(_Partition(label, places=chunk, n_traces=len(chunk)))
            return parts
        traces = source.traces or []
        parts = []
        for start in range(0, len(traces), TRACES_PER_PARTITION):
            held = traces[start : start + TRACES_PER_PARTITION]
            label = f"traces {start}-{start + len(held) - 1} by id (in memory)"
            future = self.client.scatter(held, hash=False)
            parts.append(_Partition(label, traces=future, n_traces=len(held)))
        return parts

    def _places(self, source: TraceSource) -> list[Place]:
        """The source's places, each file indexed by a task on the cluster (once per source)."""

        def index(fn: Callable[[str], FileIndex], paths: list[str]) -> list[FileIndex]:
            token = _token()
            futures = [self.client.submit(fn, p, key=f"index-{i}-{token}") for i, p in enumerate(paths)]
            got: list[FileIndex] = self._gather(futures, paths, "index")
            return got

        try:
            return source.places(index)
        except TraceError as exc:  # as a task's error would be: every bad trace listed
            raise TrainingError(exc.message, exc.issues) from None

    def _gather(self, futures: list[Any], labels: list[str], what: str) -> list[Any]:
        """Every task's result, in order; the first error names its partition."""
        from distributed import as_completed

        label_of = {f.key: label for f, label in zip(futures, labels, strict=True)}
        bar = progress_bar(len(futures), desc=what, unit=" partitions", enabled=self.progress)
        try:
            for fut in as_completed(futures):
                if fut.status == "error":
                    self._raise(fut, label_of[fut.key], what)
                if bar is not None:
                    bar.update(1)
            return list(self.client.gather(futures))
        except StopServeError:
            raise
        except Exception as exc:  # the cluster went away under us: say so, not a traceback
            raise TrainingError(f"{what} on the Dask cluster failed: {type(exc).__name__}: {exc}") from None
        finally:
            if bar is not None:
                bar.close()

    def _raise(self, fut: Any, label: str, what: str) -> None:
        from distributed import KilledWorker

        exc = fut.exception()
        if isinstance(exc, TrainingError):
            raise TrainingError(str(exc)) from None
        if isinstance(exc, KilledWorker):
            raise TrainingError(
                f"{label}: every Dask worker that ran its {what} task died ({exc}); a worker short of "
                "memory is the usual cause: see the dashboard"
            ) from None
        raise _explained(exc, label) from None

    def _featurize(
        self,
        source: TraceSource | list[_Partition],
        labels_from_rewards: bool,
        nets: SafetyConfig | None,
        evidence: Evidence = DEFAULT_EVIDENCE,
    ) -> tuple[list[_Partition], list[Any]]:
        parts = self._partitions(source) if isinstance(source, TraceSource) else source
        futures = [
            self.client.submit(
                _featurize,
                p,
                p.traces,
                labels_from_rewards,
                nets,
                evidence,
                key=f"featurize-{i}-{_token()}",
            )
            for i, p in enumerate(parts)
        ]
        return parts, futures

    # ----------------------------------------------------------------- Backend

    def decision_points(
        self,
        source: TraceSource,
        *,
        cost_unit: str | None,
        labels_from_rewards: bool,
        group_by: str,
        progress: bool,
        nets: SafetyConfig | None,
        normalize_cost: bool,
        cost_scales: Mapping[str, float] | None = None,
        evidence: Evidence = DEFAULT_EVIDENCE,
    ) -> DecisionPoints:
        """One featurizing task per partition; the parts assembled here, their matrices kept there."""
        parts, futures = self._featurize(source, labels_from_rewards, nets, evidence)
        labels = [p.label for p in parts]
        got: list[DecisionPart] = self._gather(futures, labels, "decision points")
        self._matrices = [
            self.client.submit(_matrix, f, key=f"matrix-{i}-{_token()}") for i, f in enumerate(futures)
        ]
        self._bounds = np.concatenate([[0], np.cumsum([g.n_rows for g in got])]).astype(np.int64)
        del futures
        dp = assemble_decision_points(
            got,
            cost_unit=cost_unit,
            group_by=group_by,
            normalize_cost=normalize_cost,
            cost_scales=cost_scales,
        )
        return dp

    def trainer(
        self, matrix: FloatArray, weight: FloatArray, params: Mapping[str, Any], used: Sequence[str]
    ) -> DaskTrainer:
        """``lightgbm.dask`` boosters on the matrices the last :meth:`decision_points` left on the workers."""
        if int(self._bounds[-1]) != matrix.shape[0]:
            raise TrainingError(
                f"the cluster holds {int(self._bounds[-1])} decision points, the learner {matrix.shape[0]}: "
                "build the decision points with this backend first"
            )
        unused = [j for j, name in enumerate(FEATURE_NAMES) if name not in set(used)]
        masked = [
            self.client.submit(_masked, m, unused, key=f"masked-{i}-{_token()}")
            for i, m in enumerate(self._matrices)
        ]
        return DaskTrainer(
            self, matrix=matrix, weight=weight, params=params, parts=masked, bounds=self._bounds
        )

    def replay(
        self,
        source: TraceSource,
        dp: DecisionPoints,
        policies_for: Callable[[int], Sequence[Any]],
        *,
        objective: Objective | None = None,
        progress: bool = False,
    ) -> IntArray:
        """The replay through ``decide`` mapped over the partitions; stop rows as :func:`replay_decide`."""
        parts = self._partitions(source)
        counts = [p.n_traces for p in parts]
        if any(c is None for c in counts) or sum(c or 0 for c in counts) != dp.n_traces:
            raise TrainingError(
                f"replay: the partitions hold {counts} traces, the decision points {dp.n_traces}: "
                "build the decision points of these traces with this backend first"
            )
        objs: list[Any] = []
        index: dict[int, int] = {}
        rows: list[list[int]] = []
        for i in range(dp.n_traces):
            ks = []
            for pol in policies_for(i):
                k = index.get(id(pol))
                if k is None:
                    k = index[id(pol)] = len(objs)
                    objs.append(pol)
                ks.append(k)
            rows.append(ks)
        table = np.asarray(rows, dtype=np.int64)
        blob = self.client.scatter(_dump_policies(objs), broadcast=True, hash=False)
        starts = np.concatenate([[0], np.cumsum([c or 0 for c in counts])]).astype(np.int64)
        # each partition's feature rows, where the last decision_points left them: the replay
        # batch-predicts the learned boosters on them (replay_stops)
        matrices = self._matrices if len(self._matrices) == len(parts) else [None] * len(parts)
        futures = []
        for i, p in enumerate(parts):
            t0, t1 = int(starts[i]), int(starts[i + 1])
            offsets = dp.offsets[t0 : t1 + 1] - dp.offsets[t0]
            futures.append(
                self.client.submit(
                    _replay_part,
                    part=p,
                    traces=p.traces,
                    offsets=offsets,
                    table=table[t0:t1],
                    policies=blob,
                    objective=objective,
                    matrix=matrices[i],
                    key=f"replay-{i}-{_token()}",
                )
            )
        results = self._gather(futures, [p.label for p in parts], "replay")
        out = np.full((table.shape[1], dp.n_traces), -1, dtype=np.int64)
        for i, stops in enumerate(results):
            t0, t1 = int(starts[i]), int(starts[i + 1])
            out[:, t0:t1] = np.where(stops >= 0, stops + dp.offsets[t0], -1)
        return out

    # ----------------------------------------------------------------- guarded calls

    def _raise_if_lost(self, before: set[str], what: str) -> None:
        """A :class:`TrainingError` naming the workers of ``before`` that left the cluster."""
        try:
            lost = before - set(self.client.nthreads())
        except Exception as exc:  # the scheduler itself is gone
            raise TrainingError(
                f"lost the Dask scheduler while {what}: {type(exc).__name__}: {exc}"
            ) from None
        if lost:
            raise TrainingError(
                f"Dask worker {', '.join(sorted(lost))} left the cluster while {what}: LightGBM's "
                "distributed training cannot go on without it, so the fit stopped and nothing was "
                "written; run again (a worker that keeps dying is usually short of memory: see the "
                "dashboard)"
            )

    def guarded(self, fn: Callable[[], Any], what: str) -> Any:
        """``fn()``, ended with a :class:`TrainingError` if a worker leaves the cluster meanwhile."""
        before = set(self.client.nthreads())
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed to the caller's thread
                box["error"] = exc

        thread = threading.Thread(target=run, name="stopserve-dask-fit", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(WATCH_INTERVAL)
            if thread.is_alive():
                self._raise_if_lost(before, what)
        if "error" in box:
            failure = box["error"]
            if isinstance(failure, StopServeError):
                raise failure
            # a worker killed mid-fit often shows first as a socket error on the others: wait
            # for the scheduler to notice the loss, and name the worker rather than the symptom
            deadline = time.monotonic() + LOSS_GRACE
            while time.monotonic() < deadline:
                self._raise_if_lost(before, what)
                time.sleep(WATCH_INTERVAL)
            raise TrainingError(
                f"{what} failed on the cluster: {type(failure).__name__}: {failure}"
            ) from None
        return box["value"]


def _quiet_lightgbm() -> None:
    """LightGBM's messages (network set-up, "no further splits") go to a logger kept at ERROR.

    They would otherwise be printed by every worker on every fit; the local trainer runs
    LightGBM with ``verbose -1`` for the same reason.
    """
    import logging

    import lightgbm as lgb

    logger = logging.getLogger("stopserve.lightgbm")
    logger.setLevel(logging.ERROR)
    lgb.register_logger(logger)


def _quiet_local_worker() -> None:
    """A worker this backend started: LightGBM's native messages off our terminal.

    LightGBM's C++ side prints (network set-up: "Listening...", "Connected to rank 1")
    with ``printf`` from the task's thread, where no Python log callback is registered
    (the callback is thread-local), so only the worker's standard output can hold them
    back. Errors still arrive as exceptions; Dask's own logs go to standard error.
    """
    _quiet_lightgbm()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def _worker_plugin() -> Any:
    from distributed.diagnostics.plugin import WorkerPlugin

    class QuietLightGBM(WorkerPlugin):  # type: ignore[misc]
        """Every local worker, also one that restarts later, keeps LightGBM's messages to itself."""

        def setup(self, worker: Any) -> None:
            _quiet_local_worker()

    return QuietLightGBM()


def _token() -> str:
    import uuid

    return uuid.uuid4().hex[:12]


def _has_dashboard() -> bool:
    try:
        import bokeh  # noqa: F401
    except ImportError:
        return False
    return True


class DaskTrainer:
    """Trains each booster with ``lightgbm.dask`` on rows taken from the worker-side matrices."""

    def __init__(
        self,
        backend: DaskBackend,
        *,
        matrix: FloatArray,
        weight: FloatArray,
        params: Mapping[str, Any],
        parts: list[Any],
        bounds: IntArray,
    ) -> None:
        self.backend = backend
        self.matrix = matrix
        self.weight = weight
        self.params = dict(params)
        self.parts = parts
        self.bounds = bounds
        self.seconds = 0.0

    def _dask_rows(self, rows: IntArray) -> tuple[Any, list[int]]:
        import dask.array as da
        from dask.delayed import delayed

        blocks, sizes = [], []
        n_features = self.matrix.shape[1]
        for p, part in enumerate(self.parts):
            lo, hi = np.searchsorted(rows, self.bounds[p : p + 2])
            if hi > lo:
                local = rows[lo:hi] - self.bounds[p]
                block = delayed(_take, pure=True)(part, local)
                blocks.append(da.from_delayed(block, shape=(int(hi - lo), n_features), dtype=np.float64))
                sizes.append(int(hi - lo))
        return da.concatenate(blocks, axis=0), sizes

    def _fit(self, y: FloatArray, rows: IntArray, objective: str, rounds: int, seed: int) -> Any:
        import dask.array as da
        import lightgbm as lgb

        X, sizes = self._dask_rows(rows)  # noqa: N806
        chunks = (tuple(sizes),)
        params = {k: v for k, v in self.params.items() if k not in ("num_threads", "seed")}
        model = lgb.DaskLGBMRegressor(
            client=self.backend.client, objective=objective, n_estimators=rounds, random_state=seed, **params
        )
        with warnings.catch_warnings():
            # "Parameter n_jobs will be ignored": lightgbm.dask sets threads from each worker's own
            warnings.simplefilter("ignore", UserWarning)
            model.fit(
                X,
                da.from_array(y[rows], chunks=chunks),
                sample_weight=da.from_array(self.weight[rows], chunks=chunks),
                feature_name=list(FEATURE_NAMES),
            )
        return model.booster_

    def train(
        self, target: Any, train_rows: IntArray, valid_rows: IntArray | None, rounds: int, seed: int
    ) -> tuple[Any, int]:
        """A booster cut at its best iteration on ``valid_rows`` (all rounds without them); that iteration."""
        import lightgbm as lgb

        train_rows = np.sort(np.asarray(train_rows, dtype=np.int64))
        if target.rows is not None:
            train_rows = train_rows[target.rows[train_rows]]
            if valid_rows is not None:
                valid_rows = valid_rows[target.rows[valid_rows]]
        if train_rows.size == 0:
            raise TrainingError(f"no rows to train {target.name!r} on in this fold")
        t0 = time.perf_counter()
        booster = self.backend.guarded(
            lambda: self._fit(target.y, train_rows, target.objective, rounds, seed),
            f"LightGBM trained {target.name!r} on {train_rows.size:,} rows",
        )
        self.seconds += time.perf_counter() - t0
        best = booster.current_iteration()
        if valid_rows is not None and valid_rows.size:
            best = best_iteration(
                booster,
                self.matrix[valid_rows],
                target.y[valid_rows],
                weight=self.weight[valid_rows],
                objective=target.objective,
                patience=EARLY_STOPPING,
            )
        # served policies evaluate every tree: keep exactly the trees early stopping would keep
        return lgb.Booster(model_str=booster.model_to_string(num_iteration=best)), int(best)


# --------------------------------------------------------------------------- Parquet


def _write_part(part: DecisionPart, unit: str, path: str, label: str) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        dp = assemble_decision_points([part], cost_unit=unit)
    except StopServeError as exc:
        raise _explained(exc, label) from None
    cols = feature_columns(dp)
    table = pa.table(
        {name: pa.array(np.asarray(v).tolist() if name == "trace_id" else v) for name, v in cols.items()}
    )
    table = table.replace_schema_metadata({"stopserve.source": label, "stopserve.cost_unit": unit})
    pq.write_table(table, path)
    return dp.n_rows


def write_parquet(
    source: TraceSource,
    out_dir: str | Path,
    *,
    cost_unit: str | None = None,
    labels_from_rewards: bool = False,
    backend: DaskBackend | None = None,
) -> tuple[int, int, str]:
    """Decision points as ``out_dir/part-NNNNN.parquet``, one per input file; (rows, files, cost unit).

    Each file's traces in its own order, as ``stopserve features`` writes its CSV (an export,
    not a fit: nothing here depends on the order).

    The columns of ``stopserve features`` CSV (:func:`~stopserve.training.labels.feature_columns`),
    the cost unit chosen over every file. Written to a temporary folder beside
    ``out_dir`` and renamed into place: a failure leaves nothing. With a ``backend``,
    each file is featurized and written by a task on the cluster (the workers must see
    ``out_dir``).
    """
    require("dask", "pyarrow", what="--parquet")
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TrainingError(
            f"{out}: exists and is not an empty folder; give a new folder for the Parquet files (--parquet)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        files = [_Partition(str(p), path=str(p)) for p in source.paths or []]
        if backend is None:
            parts = [_featurize(f, None, labels_from_rewards, None) for f in files] or [
                decision_part(iter(source), labels_from_rewards=labels_from_rewards)
            ]
            labels = [f.label for f in files] or ["traces (in memory)"]
            unit = choose_cost_unit([_flags(part) for part in parts], cost_unit)
            rows = [
                _write_part(part, unit, str(tmp / f"part-{i:05d}.parquet"), label)
                for i, (part, label) in enumerate(zip(parts, labels, strict=True))
            ]
        else:
            partitions, futures = backend._featurize(files or source, labels_from_rewards, None)
            labels = [p.label for p in partitions]
            flags = backend._gather(
                [
                    backend.client.submit(_flags, f, key=f"flags-{i}-{_token()}")
                    for i, f in enumerate(futures)
                ],
                labels,
                "decision points",
            )
            unit = choose_cost_unit(flags, cost_unit)
            writes = [
                backend.client.submit(
                    _write_part,
                    f,
                    unit,
                    str(tmp / f"part-{i:05d}.parquet"),
                    label,
                    key=f"parquet-{i}-{_token()}",
                )
                for i, (f, label) in enumerate(zip(futures, labels, strict=True))
            ]
            rows = backend._gather(writes, labels, "parquet")
        if sum(rows) == 0:
            raise TrainingError("no traces: the input holds no valid trace to featurize")
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sum(rows), len(rows), unit
