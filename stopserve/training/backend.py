"""Where training runs: traces read more than once, and the backend that featurizes, fits and replays.

:class:`LocalBackend` does all of it in this process; ``stopserve.training.distributed``'s
``DaskBackend`` on a Dask cluster. The learner (``stopserve.training.fit``) and evaluation
(``stopserve.training.evaluate``) talk to a :class:`Backend` only, so neither imports the
Dask one and the Dask one imports neither: the arrows run one way.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np

from stopserve.errors import TrainingError
from stopserve.evidence import DEFAULT_EVIDENCE, Evidence
from stopserve.features import FEATURE_NAMES
from stopserve.objective import Objective
from stopserve.safety import SafetyConfig
from stopserve.trace import Trace, read_traces
from stopserve.training.labels import DecisionPoints, FloatArray, IntArray, build_decision_points
from stopserve.training.replay import replay_decide

__all__ = ["EARLY_STOPPING", "Backend", "LocalBackend", "LocalTrainer", "TraceSource", "Trainer"]

#: Rounds without improvement on the held-out rows before a booster's fit stops.
EARLY_STOPPING: Final = 30


# --------------------------------------------------------------------------- traces, twice


class TraceSource:
    """Traces that can be walked more than once: a list of traces, or files read again each time.

    The learner folds the traces twice (decision points, then replays through
    ``decide``); from files nothing but one trace at a time is held in memory.
    """

    def __init__(self, traces: Iterable[Trace] | Sequence[str | Path]) -> None:
        items = list(traces)
        self._paths: list[str | Path] | None = None
        self._traces: list[Trace] | None = None
        if items and all(isinstance(x, str | Path) for x in items):
            self._paths = [x for x in items if isinstance(x, str | Path)]
        else:
            self._traces = [x for x in items if isinstance(x, Trace)]
            if len(self._traces) != len(items):
                raise TrainingError("traces must be Trace objects or paths of trace files, not a mix")

    def __iter__(self) -> Iterator[Trace]:
        if self._paths is not None:
            return iter(read_traces(self._paths, errors="all"))  # every bad trace listed, as validate does
        return iter(self._traces or [])

    @property
    def paths(self) -> list[str | Path] | None:
        """The trace files, in order; None when the traces are held in memory."""
        return None if self._paths is None else list(self._paths)

    @property
    def traces(self) -> list[Trace] | None:
        """The traces held in memory, in order; None when they are read from files."""
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
