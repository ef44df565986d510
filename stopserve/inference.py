"""Tree-ensemble evaluation for the policy: raw scores of several LightGBM models at once.

:class:`Forest` holds the boosters a policy reads and answers one feature row
(:meth:`Forest.raw_one`, the decide hot path) or many (:meth:`Forest.raw_batch`, the
trainer's replays, through LightGBM's batch predict).

Single rows are the hot path, and LightGBM's public ``Booster.predict`` pays a fixed
cost per call (~25 µs) that dwarfs walking a few hundred trees. So each booster is
compiled to a C shared library by `Treelite <https://treelite.readthedocs.io>`_ and
`TL2cgen <https://tl2cgen.readthedocs.io>`_ (the ``fast`` extra, and gcc to build),
and called through the generated library's documented C entry point
(``predict(union Entry *row, int pred_margin, double *out)``). The libraries are
cached on disk (see :func:`default_cache_dir`), keyed by the sha256 of the model text,
the library versions, the platform and the build options; written atomically,
checked by sha256 before they are loaded, never a pickle. Compiled boosters are checked
against LightGBM on probe rows (NaNs, zeros, tiny and huge values) before they serve.
Anything that goes wrong (the extra or gcc missing, a build error, a mismatch) falls
back to ``Booster.predict``, says why in :attr:`Forest.info` and logs it once.
``docs/inference.md`` has the figures.

The engine: ``"auto"`` (the default: compiled when possible, else LightGBM),
``"tl2cgen"`` (compiled or a :class:`~stopserve.errors.ModelError`) or ``"lightgbm"``
(never compile); ``$STOPSERVE_INFERENCE`` sets the default.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import io
import json
import logging
import os
import platform
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from stopserve.errors import ConfigError, Issue, ModelError
from stopserve.extras import install_hint

__all__ = ["ENGINES", "Forest", "InferenceInfo", "clear_compiled", "default_cache_dir", "resolve_engine"]

FloatArray = npt.NDArray[np.float64]

_log = logging.getLogger("stopserve.inference")

#: Engines a :class:`Forest` can be asked for.
ENGINES: Final = ("auto", "tl2cgen", "lightgbm")
ENGINE_ENV: Final = "STOPSERVE_INFERENCE"
CACHE_ENV: Final = "STOPSERVE_CACHE_DIR"
#: LightGBM reads a dense value with |x| <= kZeroThreshold (the float 1e-35) as 0 before it
#: walks a tree; compiled code compares values as given, so they are zeroed first.
ZERO_THRESHOLD: Final = float(np.float32(1e-35))
#: Compiled boosters kept in memory per process (a reload of the same model loads nothing).
_MEMO_SIZE: Final = 32
#: A compiled booster must match LightGBM within this (relative) on every probe row.
_PROBE_RTOL: Final = 1e-9
_FAST_EXTRA: Final = install_hint("fast")
#: gcc's -O1: half the build time of TL2cgen's -O3, and no slower per call (bench/NOTES.md).
_BUILD_OPTIONS: Final = ("-O1",)
#: Cache files are readable by all (mkstemp makes them private): a cache built at image build
#: time by root serves the service's own user; only the owner writes.
_READABLE: Final = 0o644


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

    ``engine`` is ``"tl2cgen"`` (compiled) or ``"lightgbm"`` (``Booster.predict``);
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
    """TL2cgen-built shared libraries, one per booster, called through their C ``predict``.

    The row goes in as TL2cgen's ``union Entry`` array (a double per feature, whose low
    32-bit word set to -1 marks a missing value). One buffer per thread: ctypes drops
    the GIL during the call.
    """

    def __init__(self, libs: Sequence[ctypes.CDLL], n_features: int, fallback: _Boosters) -> None:
        self._libs = tuple(libs)  # keep the libraries loaded
        self._fns = []
        for lib in self._libs:
            fn = lib.predict
            fn.restype = None
            fn.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
            self._fns.append(fn)
        self._n = n_features
        self._fallback = fallback
        self._local = threading.local()

    def _buffers(self) -> tuple[int, FloatArray, npt.NDArray[np.int32], FloatArray, int]:
        buf: tuple[int, FloatArray, npt.NDArray[np.int32], FloatArray, int] | None
        buf = getattr(self._local, "buf", None)
        if buf is None:
            values = np.zeros(self._n, dtype=np.float64)  # the Entry array: a double per feature
            low = values.view(np.int32)[0::2]  # Entry.missing: the low word of each double
            out = np.zeros(1, dtype=np.float64)
            buf = self._local.buf = (values.ctypes.data, values, low, out, out.ctypes.data)
        return buf

    def raw_one(self, x: FloatArray) -> list[float]:
        row, values, low, out, out_ptr = self._buffers()
        values[:] = x
        values[np.abs(values) <= ZERO_THRESHOLD] = 0.0
        if np.count_nonzero(low == -1):
            # a value whose low word is all ones would read as missing: LightGBM answers this row
            return self._fallback.raw_one(x)
        low[np.isnan(values)] = -1
        result = []
        for fn in self._fns:
            out[0] = 0.0  # the generated predict adds to it
            fn(row, 1, out_ptr)  # pred_margin=1: raw scores
            result.append(float(out[0]))
        return result


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
            libs_by_name, status, detail = _build_all(sources, cache)
            compiled = _Compiled([libs_by_name[n] for n in self.names], n_features, fallback)
            _check_probe(compiled, fallback, n_features)
        except _UnavailableError as exc:
            self._fall_back(requested, str(exc), libs)
            return
        except Exception as exc:  # any failure of a third-party compiler: serve with LightGBM
            self._fall_back(
                requested, f"TL2cgen could not build the model: {type(exc).__name__}: {exc}", libs
            )
            return
        self._raw_one = compiled.raw_one
        build = time.perf_counter() - t0
        self.info = InferenceInfo("tl2cgen", requested, detail, status, str(cache), round(build, 3), libs)
        _log.info(
            "inference: %d boosters compiled by TL2cgen (cache %s, %.2f s): %s",
            len(self.names),
            status,
            build,
            detail,
        )

    def _fall_back(self, requested: str, why: str, libs: dict[str, str]) -> None:
        if requested == "tl2cgen":
            raise ModelError(f"inference engine 'tl2cgen' was asked for, but {why}")
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
    return {p: _version(p) for p in ("lightgbm", "treelite", "tl2cgen")}


def _build_all(texts: Mapping[str, str], cache_dir: Path) -> tuple[dict[str, ctypes.CDLL], str, str]:
    """A loaded library for each of ``texts``; the cache status and where the libraries live."""
    if sys.byteorder != "little":
        raise _UnavailableError("TL2cgen's missing-value marker is laid out for little-endian machines")
    stamp = {
        "treelite": _version("treelite"),
        "tl2cgen": _version("tl2cgen"),
        "platform": f"{sys.platform}-{platform.machine()}",
        "options": list(_BUILD_OPTIONS),
    }
    folder = cache_dir / "tl2cgen"
    writable, why_not = _writable(folder)
    libs: dict[str, ctypes.CDLL] = {}
    statuses: set[str] = set()
    for name, text in texts.items():
        data = text.encode()
        key = hashlib.sha256(
            json.dumps({**stamp, "model_sha256": hashlib.sha256(data).hexdigest()}, sort_keys=True).encode()
        ).hexdigest()
        with _memo_lock:
            lib = _memo.get(key)
            if lib is not None:
                _memo.move_to_end(key)
        if lib is None:
            lib, status = _build_one(data, folder / f"{key}.so", writable)
            with _memo_lock:
                _memo[key] = lib
                while len(_memo) > _MEMO_SIZE:
                    _memo.popitem(last=False)
        else:
            status = "reused"
        libs[name] = lib
        statuses.add(status)
    # the least settled status wins: memory (not cached) > written (built now) > hit > reused
    status = next(s for s in ("memory", "written", "hit", "reused") if s in statuses)
    if status == "memory":
        detail = f"built in a temporary folder, not cached: {why_not}"
    else:
        detail = f"shared libraries cached in {folder}"
    return libs, status, detail


def _writable(folder: Path) -> tuple[bool, str]:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return False, f"cannot create {folder}: {exc.strerror or exc}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return False, f"{folder} is not writable (set ${CACHE_ENV})"
    return True, ""


def _build_one(text: bytes, target: Path, writable: bool) -> tuple[ctypes.CDLL, str]:
    """One booster: the cached library when its sha256 checks out, else built now (and cached)."""
    meta = target.with_suffix(".json")
    if _cached(target, meta):
        return _load(target), "hit"
    try:
        import tl2cgen
        import treelite
    except ImportError as exc:
        raise _UnavailableError(f"{exc.name} is not installed ({_FAST_EXTRA})") from None
    if shutil.which("gcc") is None:
        raise _UnavailableError("no C compiler (gcc) to build the model's shared library")
    with tempfile.TemporaryDirectory(prefix="stopserve-tl2cgen-") as tmp:
        src = Path(tmp) / "model.txt"
        src.write_bytes(text)  # the verified text: the model folder may have changed since
        said = io.StringIO()  # Treelite and TL2cgen log with print(): keep stdout for the caller (--json)
        with contextlib.redirect_stdout(said):
            model = treelite.frontend.load_lightgbm_model(str(src))
        # built under a private name in the cache folder, then renamed into place
        where = target.parent if writable else Path(tmp)
        fd, part = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=".so", dir=where)
        os.close(fd)
        try:
            with contextlib.redirect_stdout(said), _native_stderr():
                tl2cgen.export_lib(
                    model,
                    toolchain="gcc",
                    libpath=part,
                    params={"parallel_comp": max(1, min(4, os.cpu_count() or 1))},
                    nthread=os.cpu_count() or 1,
                    options=list(_BUILD_OPTIONS),
                )
            for line in said.getvalue().splitlines():
                _log.debug("tl2cgen: %s", line)
            if not writable:
                return _load(Path(part)), "memory"  # a loaded library outlives its file
            blob = Path(part).read_bytes()
            _atomic_write(meta, json.dumps({"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)}))
            os.chmod(part, _READABLE)
            os.replace(part, target)
        finally:
            Path(part).unlink(missing_ok=True)
    return _load(target), "written"


#: what TL2cgen's own (older) Treelite says, from C++, about a model saved by the newer
#: Python Treelite: the format reads fine and the probe rows check the result, so it is no news
_VERSION_NOTE: Final = re.compile(
    r"originated from a newer Treelite version|Currently running Treelite version|"
    r"The model checkpoint was generated from Treelite version"
)


@contextlib.contextmanager
def _native_stderr() -> Iterator[None]:
    """Hold what native code writes to file descriptor 2 meanwhile; pass on all but the version note.

    TL2cgen writes its notes from C++, past Python's ``sys.stderr``: without this, the first
    ``stopserve serve`` printed the same three-line Treelite note once per booster.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable descriptor 2: nothing to hold
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode("utf-8", "replace")
    kept = []
    for line in text.splitlines(keepends=True):
        if _VERSION_NOTE.search(line):
            _log.debug("tl2cgen: %s", line.strip())
        else:
            kept.append(line)  # another thread's output, a compiler message: not ours to drop
    if kept:
        sys.stderr.write("".join(kept))
        sys.stderr.flush()


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    # the generated library describes itself: one output (one target, one class) in doubles,
    # thresholds in doubles; anything else would not fit the one-double buffer it writes to
    kinds = {}
    for fn_name in ("get_threshold_type", "get_leaf_output_type"):
        fn = getattr(lib, fn_name)
        fn.restype = ctypes.c_char_p
        kinds[fn_name] = fn().decode()
    lib.get_num_target.restype = ctypes.c_int32
    n_target = int(lib.get_num_target())
    classes = (ctypes.c_int32 * max(1, n_target))()
    lib.get_num_class(classes)
    shape = (n_target, list(classes))
    if set(kinds.values()) != {"float64"} or shape != (1, [1]):
        raise _UnavailableError(f"{path.name}: an unexpected generated library ({kinds}, {shape})")
    return lib


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
        os.chmod(part, _READABLE)
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
