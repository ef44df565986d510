"""Where training runs: traces read more than once, and the backend that featurizes, fits and replays.

:class:`LocalBackend` does all of it in this process; ``stopserve.training.distributed``'s
``DaskBackend`` on a Dask cluster. The learner (``stopserve.training.fit``) and evaluation
(``stopserve.training.evaluate``) talk to a :class:`Backend` only, so neither imports the
Dask one and the Dask one imports neither: the arrows run one way.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np
import orjson

from stopserve.errors import TraceFormatError, TraceValidationError, TrainingError
from stopserve.evidence import DEFAULT_EVIDENCE, Evidence
from stopserve.features import FEATURE_NAMES
from stopserve.objective import Objective
from stopserve.safety import SafetyConfig
from stopserve.trace import ReadProblems, Trace, parse_trace, read_at, read_records
from stopserve.training.labels import DecisionPoints, FloatArray, IntArray, build_decision_points
from stopserve.training.replay import replay_decide

__all__ = [
    "CHUNK_BYTES",
    "EARLY_STOPPING",
    "Backend",
    "FileIndex",
    "Indexer",
    "LocalBackend",
    "LocalTrainer",
    "Place",
    "TraceSource",
    "Trainer",
    "index_file",
    "read_places",
    "trace_key",
]

#: Rounds without improvement on the held-out rows before a booster's fit stops.
EARLY_STOPPING: Final = 30


# --------------------------------------------------------------------------- traces, twice, in one order

#: Bytes of trace JSON a walk over trace files reads ahead and holds at a time.
CHUNK_BYTES: Final = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Place:
    """Where one trace of a file is, and its key in the canonical order (:func:`trace_key`)."""

    trace_id: str
    #: sha256 of the trace's canonical JSON
    digest: str
    file: str
    line: int | None
    #: the record's ``offset`` or ``index`` (:class:`stopserve.trace.Record`)
    offset: int | None
    index: int | None
    #: bytes of its canonical JSON (what reading it ahead holds)
    size: int

    @property
    def key(self) -> tuple[str, str]:
        """Its sort key: the trace id, then the digest of its content."""
        return self.trace_id, self.digest


def trace_key(trace: Trace) -> tuple[tuple[str, str], int]:
    """A trace's sort key (its id, then the sha256 of its canonical JSON), and that JSON's size.

    Canonical: the format-v1 dump with sorted keys, so the same trace written with other
    spacing or key order has the same key; two traces sharing an id (across files, say)
    are ordered by their content, and traces of equal key are equal.
    """
    canonical = orjson.dumps(trace.dump(), option=orjson.OPT_SORT_KEYS)
    return (trace.trace_id, hashlib.sha256(canonical).hexdigest()), len(canonical)


@dataclass
class FileIndex:
    """One file's traces: the place of every valid one, and what was wrong with the rest."""

    places: list[Place]
    problems: ReadProblems


#: How :meth:`TraceSource.places` maps :func:`index_file` over the files (``map``, or a cluster's).
Indexer = Callable[[Callable[[str], FileIndex], list[str]], Iterable[FileIndex]]


def index_file(path: str) -> FileIndex:
    """Read ``path`` once: each valid trace's :class:`Place`, every problem (a task on a cluster)."""
    problems = ReadProblems()
    places = []
    for record in read_records([path], problems):
        assert record.trace is not None
        (trace_id, digest), size = trace_key(record.trace)
        places.append(Place(trace_id, digest, record.file, record.line, record.offset, record.index, size))
    return FileIndex(places, problems)


def read_places(places: Sequence[Place], *, chunk_bytes: int = CHUNK_BYTES) -> Iterator[Trace]:
    """The traces at ``places``, in that order.

    Read ahead a chunk at a time (about ``chunk_bytes`` of JSON held, one trace parsed at a
    time): each file a chunk touches is read once, its lines in file order (a seek each; a
    gzip file is decompressed up to the last line the chunk wants, so plain JSON Lines read
    fastest). Raises :class:`TrainingError` when a file no longer holds the trace it held.
    """
    start = 0
    while start < len(places):
        end, held = start + 1, places[start].size
        while end < len(places) and held + places[end].size <= chunk_bytes:
            held += places[end].size
            end += 1
        chunk = places[start:end]
        by_file: dict[str, list[int]] = {}
        for j, place in enumerate(chunk):
            by_file.setdefault(place.file, []).append(j)
        blobs: dict[int, bytes] = {}
        for file, js in by_file.items():
            try:
                got = read_at(file, [(chunk[j].offset, chunk[j].index) for j in js])
            except TraceFormatError as exc:
                raise TrainingError(f"{exc.message} (read again in training)") from None
            blobs.update(zip(js, got, strict=True))
        for j, place in enumerate(chunk):
            trace = _parse_again(blobs.pop(j), place)
            yield trace
        start = end


def _parse_again(blob: bytes, place: Place) -> Trace:
    where = place.file if place.line is None else f"{place.file}:{place.line}"
    try:
        trace = parse_trace(orjson.loads(blob), file=place.file, line=place.line)
    except (orjson.JSONDecodeError, TraceValidationError):
        trace = None
    if trace is None or trace.trace_id != place.trace_id:
        raise TrainingError(
            f"{where}: trace {place.trace_id!r} is no longer there: the file changed while training read it"
        )
    return trace


class TraceSource:
    """Traces that can be walked more than once, in one canonical order whatever the input order.

    A list of traces, or trace files. Every walk gives the traces sorted by trace id, then
    by the sha256 of their canonical JSON (:func:`trace_key`; duplicate ids across files
    exist), so the same traces in any file order and any line order give the same decision
    points, the same folds and, given a seed, the same model (``docs/training.md``).

    From files, the first walk reads each file once (:func:`index_file`: validation, every
    bad trace listed as ``stopserve validate`` lists them, and each trace's key and place);
    the places are kept (a few hundred bytes a trace) and every walk reads the traces back
    in key order (:func:`read_places`): no more than a chunk of their JSON and one parsed
    trace is held at a time. Traces given in memory are held, sorted once.
    """

    def __init__(self, traces: Iterable[Trace] | Sequence[str | Path]) -> None:
        items = list(traces)
        self._paths: list[str | Path] | None = None
        self._traces: list[Trace] | None = None
        self._places: list[Place] | None = None
        if items and all(isinstance(x, str | Path) for x in items):
            self._paths = [x for x in items if isinstance(x, str | Path)]
        else:
            held = [x for x in items if isinstance(x, Trace)]
            if len(held) != len(items):
                raise TrainingError("traces must be Trace objects or paths of trace files, not a mix")
            keys = [trace_key(t)[0] for t in held]
            self._traces = [held[i] for i in sorted(range(len(held)), key=keys.__getitem__)]

    def __iter__(self) -> Iterator[Trace]:
        if self._paths is not None:
            return read_places(self.places())
        return iter(self._traces or [])

    def __len__(self) -> int:
        return len(self.places()) if self._paths is not None else len(self._traces or [])

    def places(self, index: Indexer = map) -> list[Place]:
        """Every trace's place in the files, in the canonical order; empty for traces in memory.

        Built on the first call (``index(index_file, paths)``: the builtin ``map``, or a
        cluster's map) and kept. Raises :class:`~stopserve.errors.TraceValidationError`
        listing every invalid or unreadable trace, as ``read_traces(errors="all")`` does.
        """
        if self._paths is None:
            return []
        if self._places is None:
            problems = ReadProblems()
            places: list[Place] = []
            for got in index(index_file, [str(p) for p in self._paths]):
                places += got.places
                problems.merge(got.problems)
            problems.raise_if_any()
            places.sort(key=lambda p: p.key)
            self._places = places
        return self._places

    @property
    def paths(self) -> list[str | Path] | None:
        """The trace files, as given; None when the traces are held in memory."""
        return None if self._paths is None else list(self._paths)

    @property
    def traces(self) -> list[Trace] | None:
        """The traces held in memory, in the canonical order; None when they are read from files."""
        return None if self._traces is None else list(self._traces)


# --------------------------------------------------------------------------- where the work runs


class Trainer(Protocol):
    """Trains boosters on row subsets of the learner's decision points."""

    seconds: float

    def train(
        self, target: Any, train_rows: IntArray, valid_rows: IntArray | None, rounds: int, seed: int
    ) -> tuple[Any, int]:
        """A booster cut at its best iteration (early stopping on ``valid_rows``), and that iteration."""
        ...


class Backend(Protocol):
    """Where the learner builds decision points, trains boosters and replays policies.

    :class:`LocalBackend` (the default) does all of it in this process;
    ``stopserve.training.distributed.DaskBackend`` on a Dask cluster. Both give the
    same decision points and replays; the boosters agree up to LightGBM's distributed
    binning and bagging (``docs/distributed.md``).
    """

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
        """:func:`stopserve.training.labels.build_decision_points` of the source's traces."""
        ...

    def trainer(
        self, matrix: FloatArray, weight: FloatArray, params: Mapping[str, Any], used: Sequence[str]
    ) -> Trainer:
        """A trainer on the last decision points built (``matrix``: their features, ``used`` masked)."""
        ...

    def replay(
        self,
        source: TraceSource,
        dp: DecisionPoints,
        policies_for: Callable[[int], Sequence[Any]],
        *,
        objective: Objective | None = None,
        progress: bool = False,
    ) -> IntArray:
        """:func:`stopserve.training.replay.replay_decide` on the source's traces."""
        ...


class LocalBackend:
    """Everything in this process: one pass over the traces, one binned matrix."""

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
        """:func:`stopserve.training.labels.build_decision_points` of the source's traces."""
        return build_decision_points(
            iter(source),
            cost_unit=cost_unit,
            labels_from_rewards=labels_from_rewards,
            group_by=group_by,
            progress=progress,
            nets=nets,
            normalize_cost=normalize_cost,
            cost_scales=cost_scales,
            evidence=evidence,
        )

    def trainer(
        self, matrix: FloatArray, weight: FloatArray, params: Mapping[str, Any], used: Sequence[str]
    ) -> Trainer:
        """Boosters on row subsets of ``matrix``, binned once."""
        return LocalTrainer(matrix, weight, params)

    def replay(
        self,
        source: TraceSource,
        dp: DecisionPoints,
        policies_for: Callable[[int], Sequence[Any]],
        *,
        objective: Objective | None = None,
        progress: bool = False,
    ) -> IntArray:
        """:func:`stopserve.training.replay.replay_decide` on the source's traces, in order."""
        return replay_decide(iter(source), dp, policies_for, objective=objective, progress=progress)


# --------------------------------------------------------------------------- LightGBM in this process


class LocalTrainer:
    """Trains boosters on row subsets of one binned matrix (bins computed once)."""

    def __init__(self, matrix: FloatArray, weight: FloatArray, params: Mapping[str, Any]) -> None:
        import lightgbm as lgb

        self._lgb = lgb
        self.weight = weight
        self.params = dict(params)
        self.seconds = 0.0
        self._ref = lgb.Dataset(
            matrix,
            label=np.zeros(matrix.shape[0]),
            feature_name=list(FEATURE_NAMES),
            free_raw_data=False,
            params={"verbose": -1, "max_bin": self.params.get("max_bin", 255)},
        ).construct()

    def _dataset(self, rows: IntArray, y: FloatArray) -> Any:
        ds = self._ref.subset(rows)  # type: ignore[arg-type]  # an index array works and avoids a list
        ds.construct()
        ds.set_label(y[rows])
        ds.set_weight(self.weight[rows])
        return ds

    def train(
        self, target: Any, train_rows: IntArray, valid_rows: IntArray | None, rounds: int, seed: int
    ) -> tuple[Any, int]:
        """A booster cut at its best iteration (early stopping on ``valid_rows``), and that iteration."""
        if target.rows is not None:
            train_rows = train_rows[target.rows[train_rows]]
            if valid_rows is not None:
                valid_rows = valid_rows[target.rows[valid_rows]]
        params = {**self.params, "objective": target.objective, "seed": seed}
        params.pop("max_bin", None)
        train_set = self._dataset(train_rows, target.y)
        callbacks: list[Any] = []
        valid_sets: list[Any] = []
        if valid_rows is not None and valid_rows.size:
            valid_sets = [self._dataset(valid_rows, target.y)]
            callbacks = [self._lgb.early_stopping(EARLY_STOPPING, verbose=False)]
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            booster = self._lgb.train(
                params, train_set, num_boost_round=rounds, valid_sets=valid_sets, callbacks=callbacks
            )
        self.seconds += time.perf_counter() - t0
        best = booster.best_iteration if booster.best_iteration > 0 else booster.current_iteration()
        # served policies evaluate every tree: keep exactly the trees the fit chose
        cut = self._lgb.Booster(model_str=booster.model_to_string(num_iteration=best))
        return cut, int(best)
