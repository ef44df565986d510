"""Training on a Dask cluster: a real LocalCluster (2 worker processes, 1 thread each, loopback).

The distributed learner must give the single-machine learner's answer up to noise, write
an ordinary model directory that serves unchanged, and fail with a clear error (file,
trace; no model directory) on bad input, an unreachable scheduler and a worker that dies
while LightGBM trains.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stopserve.errors import TrainingError
from stopserve.objective import Objective
from stopserve.policy import Policy
from stopserve.trace import read_traces
from stopserve.training.backend import LocalBackend
from stopserve.training.evaluate import evaluate
from stopserve.training.fit import PolicyLearner, TraceSource, bootstrap_diff
from stopserve.training.labels import assemble_decision_points, build_decision_points, decision_part

distributed = pytest.importorskip("distributed", reason="the [dask] extra is not installed")
pytest.importorskip("lightgbm.dask", reason="the [dask] extra is not installed")

from servers import LiveServer, free_port  # noqa: E402

from stopserve.training.distributed import DaskBackend, best_iteration  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

#: Small and quick: the comparison is about the trainer, not about the data.
# no success floor: the comparison needs a policy whose margin over behavior is wide (on these
# simulated runs the best one trades more than a point of success for cost)
LEARNER = {"folds": 3, "method": "behavior", "max_rounds": 60, "seed": 0, "floors": None}


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "stopserve", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def sim_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three files of `stopserve simulate` runs: three partitions."""
    folder = tmp_path_factory.mktemp("sim")
    files = []
    for seed in (1, 2, 3):
        path = folder / f"sim{seed}.jsonl"
        proc = _cli("simulate", "--n", "90", "--seed", str(seed), "-o", str(path))
        assert proc.returncode == 0, proc.stderr
        files.append(path)
    return files


def _local_cluster(n: int = 2) -> DaskBackend:
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=n,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        silence_logs=50,
    )
    return DaskBackend(Client(cluster), cluster=cluster)


@pytest.fixture(scope="module")
def backend() -> Iterator[DaskBackend]:
    b = _local_cluster(2)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def fitted(sim_files: list[Path], backend: DaskBackend) -> tuple[PolicyLearner, PolicyLearner]:
    """The same learner on the same files: in this process, and on the cluster."""
    files = [str(f) for f in sim_files]
    single = PolicyLearner(**LEARNER).fit(files, cost_unit="ktokens")  # type: ignore[arg-type]
    dask = PolicyLearner(**LEARNER, backend=backend).fit(files, cost_unit="ktokens")  # type: ignore[arg-type]
    return single, dask


# --------------------------------------------------------------------------- the same answer


def test_parts_built_apart_assemble_into_one_pass(sim_files: list[Path]) -> None:
    parts = [decision_part(read_traces(f)) for f in sim_files]
    for kw in ({}, {"normalize_cost": True, "group_by": "system"}, {"cost_unit": "seconds"}):
        whole = build_decision_points(read_traces(sim_files), **kw)  # type: ignore[arg-type]
        joined = assemble_decision_points(parts, **kw)  # type: ignore[arg-type]
        for name, value in vars(whole).items():
            got = getattr(joined, name)
            if isinstance(value, np.ndarray):
                assert got.dtype == value.dtype and np.array_equal(
                    got, value, equal_nan=value.dtype.kind == "f"
                ), name
            else:
                assert got == value, name


@pytest.mark.parametrize("objective", ["regression", "cross_entropy"])
def test_best_iteration_is_lightgbms_early_stopping_iteration(objective: str) -> None:
    """The cut the Dask trainer makes after the fact is the one LightGBM's callback makes."""
    import lightgbm as lgb

    rng = np.random.default_rng(3)
    X = rng.normal(size=(3000, 6))
    p = 1 / (1 + np.exp(-(X[:, 0] - 0.5 * X[:, 1])))
    y = (rng.random(3000) < p).astype(float) if objective == "cross_entropy" else p + rng.normal(0, 0.3, 3000)
    w = rng.uniform(0.5, 2.0, size=3000)
    params = {"objective": objective, "learning_rate": 0.3, "num_leaves": 15, "verbose": -1, "seed": 1,
              "deterministic": True, "num_threads": 1}  # fmt: skip
    train = lgb.Dataset(X[:2000], y[:2000], weight=w[:2000])
    valid = lgb.Dataset(X[2000:], y[2000:], weight=w[2000:], reference=train)
    stopped = lgb.train(
        params, train, 300, valid_sets=[valid], callbacks=[lgb.early_stopping(10, verbose=False)]
    )
    assert 0 < stopped.best_iteration < 290  # early stopping did stop: the comparison means something
    full = lgb.train(params, lgb.Dataset(X[:2000], y[:2000], weight=w[:2000]), 300)
    got = best_iteration(full, X[2000:], y[2000:], weight=w[2000:], objective=objective, patience=10)
    assert got == stopped.best_iteration


def test_distributed_cv_value_is_within_noise_of_the_single_machine_one(
    fitted: tuple[PolicyLearner, PolicyLearner],
) -> None:
    """Tolerance: half the width of the 95% bootstrap interval (over task groups) of the
    single-machine CV value, about two standard errors: the noise of that figure as it is
    reported. The boosters differ (LightGBM's distributed bins and bagging), so the values
    may differ by this much, not more. The test has the power to fail: the learned
    policy's margin over the logged behavior is several times the tolerance, so a trainer
    that learned nothing (misaligned rows or labels) would fall outside it.
    """
    single, dask = fitted
    assert single.dp_.n_rows == dask.dp_.n_rows and np.array_equal(single.dp_.X, dask.dp_.X, equal_nan=True)
    values = single.cv_values_["learned"]
    draws = bootstrap_diff(values, single.dp_.group, seed=0)
    lo, hi = np.quantile(draws, [0.025, 0.975])
    tolerance = float(hi - lo) / 2
    got, want = float(dask.cv_values_["learned"].mean()), float(values.mean())
    assert abs(got - want) <= tolerance, (got, want, tolerance)
    margin = want - float(single.cv_values_["behavior"].mean())
    assert margin > 2 * tolerance, (margin, tolerance)
    # the heuristics and the references are replays of the same rules: equal, not just close
    for name in ("behavior", "oracle", "loop_detector", "turn_cap"):
        assert np.allclose(dask.cv_values_[name], single.cv_values_[name]), name


def test_the_distributed_model_is_an_ordinary_model_directory_that_serves(
    fitted: tuple[PolicyLearner, PolicyLearner], sim_files: list[Path], tmp_path: Path
) -> None:
    single, dask = fitted
    paths = {}
    for name, learner in (("single", single), ("dask", dask)):
        paths[name] = learner.save(tmp_path / name)
    a = json.loads((paths["single"] / "manifest.json").read_text())
    b = json.loads((paths["dask"] / "manifest.json").read_text())
    assert a["format"] == b["format"]
    if a["kind"] == b["kind"]:  # both learned models, or both the tuned heuristic (the guard may differ)
        assert sorted(a) == sorted(b)
    assert a["training_data"]["sha256"] == b["training_data"]["sha256"]  # the same matrix and labels
    policy = Policy.load(paths["dask"])
    trace = next(iter(read_traces(sim_files[0])))
    events = [json.loads(e.model_dump_json(exclude_none=True)) for e in trace.events[:6]]
    with LiveServer(log_dir=tmp_path / "logs", model=paths["dask"]) as server:
        import httpx

        r = httpx.post(f"{server.url}/v1/runs/r1/decide", json={"events": events}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["model_version"] == policy.model_version == b["model_version"]


def test_evaluate_mapped_over_partitions_gives_the_same_report(
    fitted: tuple[PolicyLearner, PolicyLearner], sim_files: list[Path], backend: DaskBackend
) -> None:
    policy = fitted[1].policy()
    files = [str(f) for f in sim_files]
    files = files[:1]  # the sweep replays dozens of policies: one file is enough to compare
    local = evaluate(policy, files, objective=Objective(cost_share=0.3), cost_unit="ktokens", sweep=True)
    mapped = evaluate(
        policy, files, objective=Objective(cost_share=0.3), cost_unit="ktokens", sweep=True, backend=backend
    )
    assert mapped == local


def _count_single_rows() -> None:
    from stopserve.inference import Forest

    original = Forest.__dict__.get("_uncounted_raw_one", Forest.raw_one)

    def counted(forest: Forest, x: object) -> object:
        Forest._single_rows += 1  # type: ignore[attr-defined]
        return original(forest, x)

    Forest._uncounted_raw_one = original  # type: ignore[attr-defined]
    Forest._single_rows = 0  # type: ignore[attr-defined]
    Forest.raw_one = counted  # type: ignore[method-assign,assignment]


def _single_rows() -> int:
    from stopserve.inference import Forest

    count: int = Forest._single_rows  # type: ignore[attr-defined]
    Forest.raw_one = Forest._uncounted_raw_one  # type: ignore[attr-defined,method-assign]
    return count


def test_replays_on_the_workers_batch_predict_and_stop_where_decide_alone_does(
    sim_files: list[Path], backend: DaskBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stopserve.inference import Forest
    from stopserve.training.replay import replay_stops

    policy = Policy.load(ROOT / "models" / "default", engine="lightgbm")
    source = TraceSource([str(f) for f in sim_files])
    options = {"labels_from_rewards": False, "group_by": "task", "progress": False, "nets": None}
    dp = backend.decision_points(source, cost_unit="ktokens", normalize_cost=False, **options)  # type: ignore[arg-type]
    backend.client.run(_count_single_rows)
    try:
        mapped = backend.replay(source, dp, lambda i: [policy], objective=Objective(cost_share=0.3))
    finally:
        counts = backend.client.run(_single_rows)
    here = []
    original = Forest.raw_one
    monkeypatch.setattr(Forest, "raw_one", lambda f, x: here.append(1) or original(f, x))
    # no X: decide scores every row itself
    alone = replay_stops(iter(source), dp.offsets, lambda i: [policy], objective=Objective(cost_share=0.3))
    np.testing.assert_array_equal(mapped, alone)
    assert (alone >= 0).any() and len(here) > 0
    assert sum(counts.values()) == 0, counts  # on the workers every row's scores came from a batch


def test_traces_in_memory_are_partitioned_too(backend: DaskBackend, sim_files: list[Path]) -> None:
    traces = list(read_traces(sim_files[0]))
    source = TraceSource(traces)
    dp = backend.decision_points(
        source,
        cost_unit=None,
        labels_from_rewards=False,
        group_by="task",
        progress=False,
        nets=None,
        normalize_cost=False,
    )
    want = build_decision_points(iter(source))  # in the canonical order, as on one machine
    assert np.array_equal(dp.X, want.X, equal_nan=True) and np.array_equal(dp.offsets, want.offsets)
    assert dp.trace_id.tolist() == sorted(t.trace_id for t in traces)


def test_partitions_are_the_canonical_order_whatever_the_file_order(
    backend: DaskBackend, sim_files: list[Path]
) -> None:
    options = {"labels_from_rewards": False, "group_by": "task", "progress": False, "nets": None}

    def points(b: Any, files: list[Path]) -> Any:
        source = TraceSource([str(f) for f in files])
        return b.decision_points(source, cost_unit="ktokens", normalize_cost=False, **options)

    got = [points(backend, files) for files in (sim_files, sim_files[::-1])]
    here = points(LocalBackend(), sim_files[::-1])
    for dp in [*got[1:], here]:
        assert dp.trace_id.tolist() == got[0].trace_id.tolist()
        assert np.array_equal(dp.X, got[0].X, equal_nan=True) and np.array_equal(dp.q, got[0].q)


# --------------------------------------------------------------------------- Parquet


def test_features_parquet_has_the_csv_columns_and_values(
    sim_files: list[Path], backend: DaskBackend, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    from stopserve.training.distributed import write_parquet

    csv_path = tmp_path / "f.csv"
    proc = _cli("features", *map(str, sim_files), "-o", str(csv_path))
    assert proc.returncode == 0, proc.stderr
    proc = _cli("features", *map(str, sim_files), "--parquet", str(tmp_path / "local"))
    assert proc.returncode == 0, proc.stderr
    rows, files, unit = write_parquet(
        TraceSource([str(f) for f in sim_files]), tmp_path / "dask", backend=backend
    )
    assert files == 3
    header = csv_path.read_text().splitlines()[0].split(",")
    csv_rows = [line.split(",") for line in csv_path.read_text().splitlines()[1:]]
    assert rows == len(csv_rows)
    for folder in ("local", "dask"):
        parts = sorted((tmp_path / folder).glob("part-*.parquet"))
        assert [p.name for p in parts] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
        table = pq.read_table(tmp_path / folder)  # the folder reads as one data set
        assert table.column_names == header
        assert table.schema.metadata[b"stopserve.cost_unit"].decode() == unit
        got = table.to_pydict()
        assert got["trace_id"] == [r[0] for r in csv_rows]
        for j, name in enumerate(header[1:], start=1):
            assert np.allclose(
                np.asarray(got[name], dtype=float), [float(r[j]) for r in csv_rows], equal_nan=True
            )


def test_parquet_refuses_a_folder_that_holds_something(sim_files: list[Path], tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    proc = _cli("features", str(sim_files[0]), "--parquet", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "not an empty folder" in proc.stderr and "Traceback" not in proc.stderr
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


# --------------------------------------------------------------------------- bad input


def _with_bad_trace(src: Path, dst: Path, *, how: str) -> str:
    lines = src.read_text().splitlines()
    bad = json.loads(lines[5])
    if how == "invalid":
        bad["events"][2]["type"] = "spwan"
    else:  # no outcome
        bad.pop("rewards", None)
        for ev in bad["events"]:
            ev.pop("grade", None)
    lines[5] = json.dumps(bad)
    dst.write_text("\n".join(lines) + "\n")
    return str(bad["trace_id"])


@pytest.mark.parametrize("how", ["invalid", "no outcome"])
def test_a_malformed_trace_in_one_partition_names_its_file_and_trace(
    how: str, sim_files: list[Path], backend: DaskBackend, tmp_path: Path
) -> None:
    bad_file = tmp_path / "bad.jsonl"
    trace_id = _with_bad_trace(sim_files[1], bad_file, how=how)
    out = tmp_path / "model"
    learner = PolicyLearner(**LEARNER, backend=backend)  # type: ignore[arg-type]
    with pytest.raises(TrainingError) as err:
        learner.fit([str(sim_files[0]), str(bad_file)])
        learner.save(out)
    text = str(err.value)
    assert str(bad_file) in text and repr(trace_id) in text
    assert (f"{bad_file}:6:" in text) if how == "invalid" else ("no outcome" in text)
    assert not out.exists()


def test_an_unreachable_scheduler_is_a_clear_error_and_writes_nothing(
    sim_files: list[Path], tmp_path: Path
) -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    out = tmp_path / "model"
    t0 = time.monotonic()
    proc = _cli("train", str(sim_files[0]), "-o", str(out), "--dask", address, "--dask-timeout", "2")
    assert proc.returncode == 2
    assert f"cannot reach the Dask scheduler at {address!r} within 2 s" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - t0 < 60
    assert not out.exists()


@pytest.mark.parametrize("value", ["local:x", "local:0", "tcp://a b"])
def test_a_bad_dask_address_is_refused_by_the_parser(value: str, tmp_path: Path) -> None:
    proc = _cli("train", "x.jsonl", "-o", str(tmp_path / "m"), "--dask", value)
    assert proc.returncode == 2 and "--dask" in proc.stderr and "Traceback" not in proc.stderr


def test_a_worker_that_dies_while_lightgbm_trains_ends_the_fit_cleanly(
    sim_files: list[Path], tmp_path: Path
) -> None:
    b = _local_cluster(2)
    out = tmp_path / "model"
    box: dict[str, BaseException] = {}

    def fit() -> None:
        try:
            learner = PolicyLearner(**{**LEARNER, "max_rounds": 3000}, backend=b)  # type: ignore[arg-type]
            learner.fit([str(f) for f in sim_files[:2]], cost_unit="ktokens")
            learner.save(out)
        except BaseException as exc:
            box["error"] = exc

    try:
        pids: dict[str, int] = b.client.run(os.getpid)
        thread = threading.Thread(target=fit, daemon=True)
        thread.start()
        victim = None
        deadline = time.monotonic() + 240
        while victim is None and time.monotonic() < deadline and thread.is_alive():
            for worker, keys in b.client.processing().items():
                if any("_train_part" in str(k) for k in keys):
                    victim = worker
            time.sleep(0.05)
        assert victim is not None, "LightGBM never started training on the cluster"
        os.kill(pids[victim], signal.SIGKILL)
        thread.join(120)
        assert not thread.is_alive()
    finally:
        b.close()
    err = box.get("error")
    assert isinstance(err, TrainingError), repr(err)
    assert victim in str(err) and "left the cluster while LightGBM trained" in str(err)
    assert not out.exists()


# --------------------------------------------------------------------------- the commands


def test_train_and_evaluate_commands_on_a_local_cluster(sim_files: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "model"
    files = []
    for i, chunk in enumerate((slice(0, 20), slice(20, 40))):  # two small files: two partitions
        path = tmp_path / f"part{i}.jsonl"
        path.write_text("\n".join(sim_files[0].read_text().splitlines()[chunk]) + "\n")
        files.append(str(path))
    proc = _cli("train", *files, "-o", str(out), "--dask", "local:2", "--folds", "2", "--method", "behavior",
                "--no-progress", "--cost-unit", "ktokens")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Dask: 2 local workers, 1 thread each; dashboard http://127.0.0.1:" in proc.stderr
    assert "[LightGBM]" not in proc.stderr + proc.stdout
    Policy.load(out)
    proc = _cli("evaluate", *files, "--model", str(out), "--dask", "local:2", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    local = _cli("evaluate", *files, "--model", str(out), "--json")
    assert report == json.loads(local.stdout)
