"""Tree-ensemble evaluation for the policy: raw scores of several LightGBM models at once.

:class:`Forest` holds the boosters a policy reads and answers one feature row
(:meth:`Forest.raw_one`, the decide hot path) or many (:meth:`Forest.raw_batch`, the
trainer's replays, through LightGBM's batch predict).

Single rows are the hot path, and LightGBM's public ``Booster.predict`` pays a fixed
cost per call (~25 µs) that dwarfs walking a few hundred trees. So each booster is
compiled to machine code with `lleaves <https://github.com/siboehm/lleaves>`_ (LLVM,
through the ``llvmlite`` wheel: no C compiler needed, at build time or at run time),
installed by the ``fast`` extra (``pip install 'stopserve[fast]'``). The compiled
code is cached on disk (see :func:`default_cache_dir`), keyed by the sha256 of the
model text, the library versions and the target; it is written atomically, checked
by sha256 before it is loaded, and never a pickle. Compiled boosters are checked
against LightGBM on probe rows (NaNs, zeros, tiny and huge values) before they
serve; anything that goes wrong (lleaves missing, a compile error, a mismatch) falls
back to ``Booster.predict``, says why in :attr:`Forest.info` and logs it once.
``docs/inference.md`` has the figures.

The engine: ``"auto"`` (the default: compiled when possible, else LightGBM),
``"lleaves"`` (compiled or a :class:`~stopserve.errors.ModelError`) or
``"lightgbm"`` (never compile); ``$STOPSERVE_INFERENCE`` sets the default.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from stopserve.errors import ConfigError, Issue, ModelError

__all__ = ["ENGINES", "Forest", "InferenceInfo", "clear_compiled", "default_cache_dir", "resolve_engine"]

FloatArray = npt.NDArray[np.float64]

_log = logging.getLogger("stopserve.inference")

#: Engines a :class:`Forest` can be asked for.
ENGINES: Final = ("auto", "lleaves", "lightgbm")
ENGINE_ENV: Final = "STOPSERVE_INFERENCE"
CACHE_ENV: Final = "STOPSERVE_CACHE_DIR"
#: LightGBM reads a dense value with |x| <= kZeroThreshold (the float 1e-35) as 0 before it
#: walks a tree; compiled code compares values as given, so they are zeroed first.
ZERO_THRESHOLD: Final = float(np.float32(1e-35))
#: Compiled boosters kept in memory per process (a reload of the same model compiles nothing).
_MEMO_SIZE: Final = 32
#: A compiled booster must match LightGBM within this (relative) on every probe row.
_PROBE_RTOL: Final = 1e-9
_FAST_EXTRA: Final = "pip install 'stopserve[fast]'"


def resolve_engine(engine: str | None) -> str:
    """``engine`` checked, or ``$STOPSERVE_INFERENCE``, or ``"auto"``."""
    where = "engine"
    if engine is None:
        engine = os.environ.get(ENGINE_ENV) or "auto"
        where = ENGINE_ENV
    if engine not in ENGINES:
        raise ConfigError(
            f"{where}: expected one of {', '.join(ENGINES)}, got {engine!r}",
            [Issue(f"{engine!r} is not one of {', '.join(ENGINES)}", path=where)],
        )
    return engine


def default_cache_dir() -> Path:
    """``$STOPSERVE_CACHE_DIR``, else ``compiled`` in the user's cache directory (platformdirs)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("stopserve", appauthor=False)) / "compiled"


@dataclass(frozen=True)
class InferenceInfo:
    """How a :class:`Forest` answers single rows (served in ``GET /v1/model``'s manifest).

    ``engine`` is ``"lleaves"`` (compiled) or ``"lightgbm"`` (``Booster.predict``);
    ``detail`` says why the fallback was taken, or where the compiled code is cached;
    ``cache`` is ``"hit"`` (read from the disk cache), ``"written"`` (compiled now and
    cached), ``"reused"`` (compiled earlier in this process), ``"memory"`` (compiled,
    not cached: see ``detail``) or ``None``.
    """

    engine: str
    requested: str
    detail: str
    cache: str | None = None
    cache_dir: str | None = None
    build_s: float | None = None
    libraries: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return asdict(self)


class _Boosters:
    """LightGBM's public ``Booster.predict`` on a 1-row array: the fallback."""

    def __init__(self, boosters: Sequence[Any]) -> None:
        self._boosters = tuple(boosters)

    def raw_one(self, x: FloatArray) -> list[float]:
        row = np.asarray(x, dtype=np.float64).reshape(1, -1)
        # one thread: OpenMP's team costs more than one row's trees, and its p99 on a busy core is
        # milliseconds (bench/bench_inference.py)
        return [float(b.predict(row, raw_score=True, num_threads=1)[0]) for b in self._boosters]


class _Compiled:
    """lleaves-compiled boosters (``Model.predict`` on one row, one thread)."""

    def __init__(self, models: Sequence[Any]) -> None:
        self._models = tuple(models)

    def raw_one(self, x: FloatArray) -> list[float]:
        row = np.where(np.abs(x) <= ZERO_THRESHOLD, 0.0, x).reshape(1, -1)
        return [float(m.predict(row, n_jobs=1)[0]) for m in self._models]


class Forest:
    """Named LightGBM boosters evaluated together (raw scores, in ``names`` order).

    ``texts`` are the boosters' LightGBM model texts (as verified by
    :func:`stopserve.artifacts.load_model_dir`; default: ``model_to_string()``), what
    gets compiled and keys the cache. ``engine`` and ``cache_dir`` default to
    ``$STOPSERVE_INFERENCE`` / :func:`default_cache_dir`.
    """

    def __init__(
        self,
        boosters: Mapping[str, Any],
        n_features: int,
        *,
        texts: Mapping[str, str] | None = None,
        engine: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.names: tuple[str, ...] = tuple(boosters)
        self._boosters = dict(boosters)
        self.n_features = n_features
        requested = resolve_engine(engine)
        fallback = _Boosters([self._boosters[n] for n in self.names])
        self._raw_one: Any = fallback.raw_one
        libs = _libraries()
        if requested == "lightgbm":
            self.info = InferenceInfo("lightgbm", requested, "asked for LightGBM's Booster.predict")
            return
        t0 = time.perf_counter()
        try:
            known = texts or {}
            sources = {n: known.get(n) or b.model_to_string() for n, b in boosters.items()}
            cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
            models, status, detail = _compile_all(sources, cache)
            compiled = _Compiled([models[n] for n in self.names])
            _check_probe(compiled, fallback, n_features)
        except _UnavailableError as exc:
            self._fall_back(requested, str(exc), libs)
            return
        except Exception as exc:  # any failure of a third-party compiler: serve with LightGBM
            self._fall_back(
                requested, f"lleaves could not compile the model: {type(exc).__name__}: {exc}", libs
            )
            return
        self._raw_one = compiled.raw_one
        build = time.perf_counter() - t0
        self.info = InferenceInfo("lleaves", requested, detail, status, str(cache), round(build, 3), libs)
        _log.info(
            "inference: %d boosters compiled by lleaves (%s, %.2f s): %s",
            len(self.names),
            status,
            build,
            detail,
        )

    def _fall_back(self, requested: str, why: str, libs: dict[str, str]) -> None:
        if requested == "lleaves":
            raise ModelError(f"inference engine 'lleaves' was asked for, but {why}")
        self.info = InferenceInfo(
            "lightgbm", requested, f"{why}; using LightGBM's Booster.predict", None, None, None, libs
        )
        _warn_once(f"inference: {why}; single-row predictions use LightGBM's Booster.predict (slower)")

    def raw_one(self, x: FloatArray) -> Sequence[float]:
        """Raw scores for one feature row (floats, one per booster, in ``names`` order)."""
        result: Sequence[float] = self._raw_one(x)
        return result

    def raw_batch(self, X: FloatArray) -> FloatArray:  # noqa: N803
        """Raw scores, shape (rows, boosters), for a feature matrix (LightGBM's batch predict)."""
        X = np.asarray(X, dtype=np.float64)  # noqa: N806
        out = np.zeros((X.shape[0], len(self.names)))
        if X.shape[0]:
            for i, name in enumerate(self.names):
                out[:, i] = self._boosters[name].predict(X, raw_score=True)
        return out


# --------------------------------------------------------------------------- compiling


class _UnavailableError(Exception):
    """The compiled engine cannot be used here (a reason a user can act on)."""


_memo: OrderedDict[str, Any] = OrderedDict()
_memo_lock = threading.Lock()
_warned: set[str] = set()


def clear_compiled() -> None:
    """Forget the compiled boosters kept in memory (the next load reads the disk cache or compiles)."""
    with _memo_lock:
        _memo.clear()
    _warned.clear()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        _log.warning(message)


def _version(pkg: str) -> str:
    try:
        return version(pkg)
    except PackageNotFoundError:
        return "not installed"


def _libraries() -> dict[str, str]:
    return {p: _version(p) for p in ("lightgbm", "lleaves", "llvmlite")}


#: What the compiled code depends on besides the model text (part of the cache key).
#: One block of trees: sums in LightGBM's tree order (bit-equal scores; blocking only pays on
#: batches). No inlining: half the compile time, no measurable cost per call. A generic CPU: the
#: cached code runs on any machine of the same architecture (e.g. built into a container image).
_OPTIONS: Final[dict[str, Any]] = {
    "raw_score": True,
    "finline": False,
    "target_cpu": "generic",
    "target_cpu_features": "",
}


def _compile_all(texts: Mapping[str, str], cache_dir: Path) -> tuple[dict[str, Any], str, str]:
    """lleaves models for ``texts``; the cache status and what happened, in words."""
    try:
        import lleaves
        import llvmlite.binding as llvm
    except ImportError as exc:
        raise _UnavailableError(f"lleaves is not installed ({exc.name}; {_FAST_EXTRA})") from None
    stamp = {
        "lleaves": _version("lleaves"),
        "llvmlite": _version("llvmlite"),
        "triple": llvm.get_process_triple(),
        "options": {**_OPTIONS, "fblocksize": "num_trees"},
    }
    folder = cache_dir / "lleaves"
    writable, why_not = _writable(folder)
    models: dict[str, Any] = {}
    statuses: set[str] = set()
    for name, text in texts.items():
        data = text.encode()
        key = hashlib.sha256(
            json.dumps({**stamp, "model_sha256": hashlib.sha256(data).hexdigest()}, sort_keys=True).encode()
        ).hexdigest()
        with _memo_lock:
            model = _memo.get(key)
            if model is not None:
                _memo.move_to_end(key)
        if model is None:
            model, status = _compile_one(lleaves, data, folder / f"{key}.o", writable)
            with _memo_lock:
                _memo[key] = model
                while len(_memo) > _MEMO_SIZE:
                    _memo.popitem(last=False)
        else:
            status = "reused"
        models[name] = model
        statuses.add(status)
    # the least settled status wins: memory (not cached) > written (compiled now) > hit > reused
    status = next(s for s in ("memory", "written", "hit", "reused") if s in statuses)
    if writable:
        detail = f"compiled code cached in {folder}"
    else:
        detail = f"compiled in memory, not cached: {why_not}"
    return models, status, detail


def _writable(folder: Path) -> tuple[bool, str]:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return False, f"cannot create {folder}: {exc.strerror or exc}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return False, f"{folder} is not writable (set ${CACHE_ENV})"
    return True, ""


def _compile_one(lleaves: Any, text: bytes, target: Path, writable: bool) -> tuple[Any, str]:
    """One booster: read from the cache when its sha256 checks out, else compile (and cache)."""
    meta = target.with_suffix(".json")
    with tempfile.TemporaryDirectory(prefix="stopserve-lleaves-") as tmp:
        src = Path(tmp) / "model.txt"
        src.write_bytes(text)  # the verified text: the model folder may have changed since
        model = lleaves.Model(model_file=str(src))
        options = {**_OPTIONS, "fblocksize": max(1, model.num_trees())}
        if _cached(target, meta):
            model.compile(cache=str(target), **options)
            return model, "hit"
        if not writable:
            model.compile(cache=None, **options)
            return model, "memory"
        # lleaves writes the object file where it is told: a private name, renamed into place
        fd, part = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=".part", dir=target.parent)
        os.close(fd)
        os.unlink(part)
        try:
            model.compile(cache=part, **options)
            blob = Path(part).read_bytes()
            _atomic_write(meta, json.dumps({"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)}))
            os.replace(part, target)
        finally:
            Path(part).unlink(missing_ok=True)
        return model, "written"


def _cached(target: Path, meta: Path) -> bool:
    try:
        recorded = json.loads(meta.read_text())
        blob = target.read_bytes()
    except (OSError, ValueError):
        return False
    return isinstance(recorded, dict) and recorded.get("sha256") == hashlib.sha256(blob).hexdigest()


def _atomic_write(path: Path, text: str) -> None:
    fd, part = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(part, path)
    finally:
        Path(part).unlink(missing_ok=True)


def probe_rows(n_features: int, n: int = 48) -> FloatArray:
    """Rows that exercise every branch kind: NaNs, zeros, values LightGBM reads as 0, huge ones."""
    rng = np.random.default_rng(16)
    rows: FloatArray = rng.normal(0.0, 1.0, (n, n_features))
    rows *= rng.choice([1e-3, 1.0, 30.0, 1e6], (n, n_features))
    rows[rng.random(rows.shape) < 0.2] = np.nan
    rows[rng.random(rows.shape) < 0.15] = 0.0
    tiny = rng.random(rows.shape) < 0.1
    rows[tiny] = rng.choice([-ZERO_THRESHOLD, ZERO_THRESHOLD, -ZERO_THRESHOLD / 2], int(tiny.sum()))
    rows[0] = np.nan
    rows[1] = 0.0
    rows[2] = -ZERO_THRESHOLD
    return rows


def _check_probe(compiled: _Compiled, reference: _Boosters, n_features: int) -> None:
    for x in probe_rows(n_features):
        got = np.asarray(compiled.raw_one(x))
        want = np.asarray(reference.raw_one(x))
        if not np.allclose(got, want, rtol=_PROBE_RTOL, atol=_PROBE_RTOL):
            raise _UnavailableError(
                f"lleaves' compiled code disagrees with LightGBM on a probe row ({got.tolist()} vs "
                f"{want.tolist()})"
            )
