"""Single-row raw prediction of the shipped model's boosters: LightGBM against tree compilers.

Per call, all the boosters the policy's method reads (``Policy.decide`` evaluates
them together on one feature row): LightGBM's public ``Booster.predict`` on a 1-row
array (the baseline, measured in the same run), stopserve's ``Forest.raw_one`` as it
ships, lleaves (LLVM via llvmlite: pip wheels, no C compiler), Treelite + TL2cgen
(C compiled by gcc, loaded as a shared library) through its Python ``Predictor`` and
through the generated library's C ``predict`` function, and, while they exist in the
tree, the evaluators issue 16 removes (``_FastRaw``: LightGBM's private single-row C
API; ``CompiledForest``: numpy).

Rows are real feature vectors: the benchmark's synthetic runs folded by
``RunState`` and read at every decision point. Every engine is timed in interleaved
rounds (one engine after the other, repeated), and every engine's answers are
compared with LightGBM's on all the rows (``max |diff|``; ``bit-exact`` = every row
equal to the last bit). Build = loading the model texts and compiling them (the
compilers write their artefact to the benchmark's scratch folder).
"""

from __future__ import annotations

import ctypes
import importlib.util
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
from _common import ROOT, Section, Target, load, median, parser, percentile
from _events import decision_event, event_dicts

RawOne = Callable[[np.ndarray], Any]


@dataclass
class Engine:
    """One way to get the raw scores of every booster for one row."""

    name: str
    raw_one: RawOne | None = None
    build_s: float = float("nan")
    artefact_bytes: int | None = None
    note: str = ""
    times_ns: list[int] = field(default_factory=list)
    context_ns: list[int] = field(default_factory=list)


def _version(pkg: str) -> str:
    try:
        return version(pkg)
    except PackageNotFoundError:
        return "not installed"


def feature_rows(n_runs: int) -> np.ndarray:
    """Feature vectors at every decision point of ``n_runs`` synthetic runs."""
    from stopserve.features import RunState
    from stopserve.trace import Event, is_decision_point

    rows = []
    for seed in range(n_runs):
        state = RunState()
        for d in event_dicts(300, seed=seed, prefix=f"r{seed}-"):
            ev = Event.model_validate(d)
            state.fold(ev)
            if is_decision_point(ev):
                rows.append(state.features())
    return np.asarray(rows, dtype=np.float64)


# --------------------------------------------------------------------------- engines


def lightgbm_engines(texts: dict[str, str]) -> list[Engine]:
    import lightgbm as lgb

    t0 = time.perf_counter()
    boosters = [lgb.Booster(model_str=t) for t in texts.values()]
    build = time.perf_counter() - t0

    def raw_one(x: np.ndarray) -> list[float]:
        row = x.reshape(1, -1)
        return [float(b.predict(row, raw_score=True)[0]) for b in boosters]

    def one_thread(x: np.ndarray) -> list[float]:
        row = x.reshape(1, -1)
        return [float(b.predict(row, raw_score=True, num_threads=1)[0]) for b in boosters]

    return [
        Engine("LightGBM Booster.predict, 1-row array (baseline)", raw_one, build, None, "public API"),
        Engine("LightGBM Booster.predict, num_threads=1", one_thread, build, None, "public API"),
    ]


def forest_engine(texts: dict[str, str], workdir: Path) -> Engine:
    """stopserve's Forest as it ships (its engine picked as the policy picks it)."""
    import lightgbm as lgb

    from stopserve import inference

    cache = workdir / "stopserve-cache"
    shutil.rmtree(cache, ignore_errors=True)
    boosters = {n: lgb.Booster(model_str=t) for n, t in texts.items()}
    n_feat = next(iter(boosters.values())).num_feature()
    t0 = time.perf_counter()
    try:
        forest = inference.Forest(boosters, n_feat, texts=texts, cache_dir=cache)
    except TypeError:  # the Forest before issue 16 took no texts
        forest = inference.Forest(boosters, n_feat)
    build = time.perf_counter() - t0
    info = getattr(forest, "info", None)
    engine = getattr(info, "engine", "private LightGBM C API (_FastRaw)")
    size = sum(p.stat().st_size for p in cache.rglob("*.so")) if cache.exists() else 0
    note = "as shipped"
    if info is not None:
        clear = getattr(inference, "clear_compiled", None)
        if clear is not None:
            clear()
        t1 = time.perf_counter()
        again = inference.Forest(boosters, n_feat, texts=texts, cache_dir=cache)
        note += (
            f"; {info.cache}, then a fresh load: cache {again.info.cache} in {time.perf_counter() - t1:.2f} s"
        )
    return Engine(f"stopserve Forest.raw_one ({engine})", forest.raw_one, build, size or None, note)


def fastraw_engine(texts: dict[str, str]) -> Engine:
    import lightgbm as lgb

    from stopserve import inference

    cls = getattr(inference, "_FastRaw", None)
    if cls is None:
        return Engine("_FastRaw (LightGBM private C API)", note="removed by issue 16 (private API)")
    boosters = {n: lgb.Booster(model_str=t) for n, t in texts.items()}
    t0 = time.perf_counter()
    fast = cls(boosters, next(iter(boosters.values())).num_feature())
    return Engine(
        "_FastRaw (LightGBM private C API)", fast.raw_one, time.perf_counter() - t0, None, "private API"
    )


def numpy_engine(texts: dict[str, str]) -> Engine:
    import lightgbm as lgb

    from stopserve import inference

    cls = getattr(inference, "CompiledForest", None)
    if cls is None:
        return Engine("CompiledForest (numpy)", note="removed by issue 16 (slower than LightGBM's predict)")
    t0 = time.perf_counter()
    boosters = {n: lgb.Booster(model_str=t) for n, t in texts.items()}
    forest = cls(
        {n: b.dump_model() for n, b in boosters.items()}, next(iter(boosters.values())).num_feature()
    )
    return Engine("CompiledForest (numpy)", forest.raw_one, time.perf_counter() - t0, None, "hand-written")


def lleaves_engine(texts: dict[str, str], workdir: Path) -> Engine:
    name = f"lleaves {_version('lleaves')} Model.predict (llvmlite {_version('llvmlite')})"
    if importlib.util.find_spec("lleaves") is None:
        return Engine(name, note="not installed: pip install 'stopserve[fast]'")
    import lleaves

    out = workdir / "lleaves"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    models = []
    t0 = time.perf_counter()
    try:
        for n, text in texts.items():
            src = out / f"{n}.txt"
            src.write_text(text)
            model = lleaves.Model(model_file=str(src))
            # one block: bit-exact sums in LightGBM's tree order; blocking only pays on batches
            model.compile(cache=str(out / f"{n}.o"), raw_score=True, fblocksize=model.num_trees())
            models.append(model)
    except AttributeError as exc:  # lleaves 1.3.0 on llvmlite >= 0.45 (legacy pass manager gone)
        return Engine(name, note=f"does not compile here: {exc} (needs llvmlite < 0.45)")
    build = time.perf_counter() - t0
    size = sum((out / f"{n}.o").stat().st_size for n in texts)

    def raw_one(x: np.ndarray) -> list[float]:
        # LightGBM reads |x| <= 1e-35 as 0 (kZeroThreshold); the compiled code compares as given
        row = np.where(np.abs(x) <= 1e-35, 0.0, x).reshape(1, -1)
        return [float(m.predict(row, n_jobs=1)[0]) for m in models]

    return Engine(name, raw_one, build, size, "public API; no C compiler (LLVM ships in the llvmlite wheel)")


def _tl2cgen_build(texts: dict[str, str], workdir: Path) -> tuple[list[Path], float] | str:
    if importlib.util.find_spec("tl2cgen") is None or importlib.util.find_spec("treelite") is None:
        return "not installed: pip install treelite tl2cgen"
    if shutil.which("gcc") is None:
        return "no gcc on this machine"
    import tl2cgen
    import treelite

    out = workdir / "tl2cgen"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    libs = []
    t0 = time.perf_counter()
    for n, text in texts.items():
        src = out / f"{n}.txt"
        src.write_text(text)
        model = treelite.frontend.load_lightgbm_model(str(src))
        lib = out / f"{n}.so"
        tl2cgen.export_lib(
            model, toolchain="gcc", libpath=str(lib), params={"parallel_comp": 2}, verbose=False
        )
        libs.append(lib)
    return libs, time.perf_counter() - t0


def tl2cgen_engines(texts: dict[str, str], workdir: Path) -> list[Engine]:
    label = f"Treelite {_version('treelite')} + TL2cgen {_version('tl2cgen')}"
    built = _tl2cgen_build(texts, workdir)
    if isinstance(built, str):
        return [
            Engine(f"{label}: Predictor", note=built),
            Engine(f"{label}: generated C predict()", note=built),
        ]
    libs, build = built
    size = sum(p.stat().st_size for p in libs)
    import tl2cgen

    predictors = [tl2cgen.Predictor(str(p), nthread=1) for p in libs]

    def via_predictor(x: np.ndarray) -> list[float]:
        dmat = tl2cgen.DMatrix(x.reshape(1, -1), dtype="float64")
        return [float(p.predict(dmat, pred_margin=True).ravel()[0]) for p in predictors]

    # the generated library's own entry point, as TL2cgen's "deploy prediction code only"
    # guide describes it: predict(union Entry *row, int pred_margin, double *out), NaN = missing -1
    class Entry(ctypes.Union):
        _fields_ = (("missing", ctypes.c_int), ("fvalue", ctypes.c_double), ("qvalue", ctypes.c_int))

    n_feat = int(ctypes.CDLL(str(libs[0])).get_num_feature())
    row = (Entry * n_feat)()
    as_f64 = np.frombuffer(row, dtype=np.float64)
    as_i32 = np.frombuffer(row, dtype=np.int32)
    result = (ctypes.c_double * 1)()
    fns = []
    for p in libs:
        fn = ctypes.CDLL(str(p)).predict
        fn.restype = None
        fn.argtypes = (ctypes.POINTER(Entry), ctypes.c_int, ctypes.POINTER(ctypes.c_double))
        fns.append(fn)

    def via_c(x: np.ndarray) -> list[float]:
        as_f64[:] = np.where(np.abs(x) <= 1e-35, 0.0, x)
        as_i32[2 * np.flatnonzero(np.isnan(x))] = -1
        out = []
        for fn in fns:
            result[0] = 0.0
            fn(row, 1, result)
            out.append(result[0])
        return out

    return [
        Engine(f"{label}: Predictor + DMatrix", via_predictor, build, size, "public API; gcc at build time"),
        Engine(
            f"{label}: generated C predict() via ctypes",
            via_c,
            build,
            size,
            "the generated library's C interface (TL2cgen's deploy guide); gcc at build time",
        ),
    ]


# --------------------------------------------------------------------------- timing


def time_rounds(engines: list[Engine], rows: np.ndarray, rounds: int, per_round: int) -> None:
    """Interleaved rounds: every engine runs ``per_round`` calls of each kind, then the next; repeated.

    Hot: one call after the other on varying rows. In context: before each timed call, one
    fresh event is folded into a run of 1,000 events and its features read (untimed), as
    ``Policy.decide`` does: what the featurizer does to the caches counts.
    """
    from stopserve.features import RunState
    from stopserve.trace import Event

    width = rows.shape[1]  # the features the model reads (see main)

    live = [e for e in engines if e.raw_one is not None]
    prefix = [Event.model_validate(d) for d in event_dicts(1_000, seed=5, prefix="p")]
    t_end = prefix[-1].t
    states = {}
    for e in live:
        st = RunState()
        for ev in prefix:
            st.fold(ev)
        states[e.name] = st
    fresh = [Event.model_validate(decision_event(i, t_end + 1 + i * 0.01)) for i in range(rounds * per_round)]
    clock = time.perf_counter_ns
    n = len(rows)
    for e in live:  # warm up: first calls pay for lazy set-up
        assert e.raw_one is not None
        for i in range(min(n, 200)):
            e.raw_one(rows[i])
    for r in range(rounds):
        for e in live:
            fn = e.raw_one
            assert fn is not None
            start = (r * per_round) % n
            hot = e.times_ns
            for i in range(per_round):
                x = rows[(start + i) % n]
                t0 = clock()
                fn(x)
                hot.append(clock() - t0)
            st = states[e.name]
            ctx = e.context_ns
            for i in range(per_round):
                st.fold(fresh[r * per_round + i])
                x = st.features()[:width]
                t0 = clock()
                fn(x)
                ctx.append(clock() - t0)


def exactness(engine: Engine, rows: np.ndarray, reference: np.ndarray) -> tuple[float, bool]:
    assert engine.raw_one is not None
    got = np.array([engine.raw_one(x) for x in rows], dtype=np.float64)
    diff = np.abs(got - reference)
    return float(np.nanmax(diff)), bool(np.array_equal(got, reference))


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__ or "").parse_args(argv)
    sec = Section("Single-row inference: LightGBM against tree compilers", sys.argv)
    mods = [load("stopserve.policy", "Policy"), load("stopserve.inference", "Forest")]
    missing = [m for m in mods if isinstance(m, str)]
    if missing:
        for why in missing:
            sec.skip(why)
        sec.emit(args.out)
        return 0
    policy_mod = mods[0]
    assert not isinstance(policy_mod, str)
    from stopserve.artifacts import load_model_dir

    try:
        artifact = load_model_dir(ROOT / "models" / "default")
    except Exception as exc:  # a stale shipped model is worth a line, not a crash
        sec.skip(f"could not load models/default: {exc}")
        sec.emit(args.out)
        return 0
    method = artifact.manifest.method
    names = policy_mod.METHOD_MODELS.get(method, tuple(artifact.models))
    texts = {n: artifact.models[n] for n in names}
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="stopserve-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rounds, per_round, n_runs = {"tiny": (2, 100, 3), "quick": (5, 1_000, 20), "full": (10, 2_000, 40)}[
        args.size
    ]

    import lightgbm as lgb

    n_trees = sum(lgb.Booster(model_str=t).num_trees() for t in texts.values())
    # the features the model reads: the featurizer's, or their start (a model of an older one)
    width = lgb.Booster(model_str=next(iter(texts.values()))).num_feature()
    rows = np.ascontiguousarray(feature_rows(n_runs)[:, :width])
    engines = [*lightgbm_engines(texts), forest_engine(texts, workdir)]
    if args.size == "tiny":
        sec.add("Tiny size: the compilers are not built (the smoke test stays fast).", "")
    else:
        engines += [fastraw_engine(texts), numpy_engine(texts), lleaves_engine(texts, workdir)]
        engines += tl2cgen_engines(texts, workdir)
    base = engines[0]
    assert base.raw_one is not None
    reference = np.array([base.raw_one(x) for x in rows], dtype=np.float64)
    checks = {e.name: exactness(e, rows, reference) for e in engines if e.raw_one is not None}
    time_rounds(engines, rows, rounds, per_round)

    base_p50 = median(base.times_ns) / 1e3
    base_ctx = median(base.context_ns) / 1e3
    table = []
    data: dict[str, Any] = {}
    for e in engines:
        if e.raw_one is None:
            table.append([e.name, *[None] * 10, e.note])
            data[e.name] = {"note": e.note}
            continue
        p50, p99 = median(e.times_ns) / 1e3, percentile(e.times_ns, 99) / 1e3
        c50, c99 = median(e.context_ns) / 1e3, percentile(e.context_ns, 99) / 1e3
        worst, exact = checks[e.name]
        kib = None if e.artefact_bytes is None else e.artefact_bytes / 1024
        table.append(
            [e.name, p50, p99, p50 / base_p50, c50, c99, c50 / base_ctx, e.build_s, kib, worst, exact, e.note]
        )
        data[e.name] = {
            "p50_us": p50,
            "p99_us": p99,
            "ratio_p50": p50 / base_p50,
            "context_p50_us": c50,
            "context_p99_us": c99,
            "context_ratio_p50": c50 / base_ctx,
            "build_s": e.build_s,
            "artefact_bytes": e.artefact_bytes,
            "max_abs_diff": worst,
            "bit_exact": exact,
            "calls": len(e.times_ns) + len(e.context_ns),
        }
    sec.data["engines"] = data
    sec.add(
        f"Model: models/default, method `{method}`: boosters {', '.join(names)} ({n_trees:,} trees), "
        f"evaluated together per call. {len(rows):,} feature rows from {n_runs} synthetic runs. "
        f"{rounds} interleaved rounds; per round and engine, {per_round:,} hot calls (one after the other, "
        f"varying rows) and {per_round:,} calls in context (before each, one event folded into a run of "
        "1,000 events and its features read, untimed: the caches as `Policy.decide` leaves them). µs per "
        "call (all boosters), wall clock; ratios = p50 / the baseline's p50 in this run, same kind of call. "
        "Build = load + compile of all boosters (TL2cgen row: its default gcc -O3, 2 translation units per "
        "booster; the shipped Forest builds with -O1). Artefact = compiled code on disk. Max abs diff and "
        "bit-exact: every row above against the baseline's answers.",
        "",
        f"Libraries: lightgbm {_version('lightgbm')}, numpy {_version('numpy')}, treelite "
        f"{_version('treelite')}, tl2cgen {_version('tl2cgen')}, lleaves {_version('lleaves')}, llvmlite "
        f"{_version('llvmlite')}.",
        "",
    )
    sec.table(
        [
            "engine",
            "hot p50 µs",
            "hot p99 µs",
            "hot p50 / LightGBM",
            "in context p50 µs",
            "in context p99 µs",
            "in context p50 / LightGBM",
            "build s",
            "artefact KiB",
            "max abs diff",
            "bit-exact",
            "note",
        ],
        table,
    )
    shipped = next(e for e in engines if e.name.startswith("stopserve Forest"))
    row = data.get(shipped.name, {})
    if "context_ratio_p50" in row:
        compiled = "LightGBM" not in shipped.name and "lightgbm" not in shipped.name
        sec.targets.append(
            Target(
                "shipped Forest.raw_one in context: p50 / LightGBM predict p50",
                f"{row['context_ratio_p50']:.2f}x",
                "< 1x (faster than the fallback)",
                row["context_ratio_p50"] < 1.0 if compiled else None,
            )
        )
    sec.emit(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
