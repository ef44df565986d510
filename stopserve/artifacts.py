"""Model directory I/O: LightGBM text models, ``manifest.json`` and ``MODEL_CARD.md``.

A model directory holds::

    manifest.json    a :class:`~stopserve.manifest.Manifest` (format stopserve.model/2):
                     kind, method, objective, gates, safety config, base rule, margins,
                     feature names in order, training-data fingerprint, cross-validated
                     metrics, library versions, created time, and the sha256 of every
                     other file
    g.txt k.txt s.txt   LightGBM text models (none for a pure-heuristic policy)
    MODEL_CARD.md    generated from the manifest

Loading parses the manifest (format 2, or format 1 converted: a bad or unknown field is
an error naming it), reads every file it lists once (only those: ``MODEL_CARD.md``
too), checks its sha256 against the manifest and the feature names against
:data:`stopserve.features.FEATURE_NAMES`, never follows a link out of the
directory, and refuses with :class:`~stopserve.errors.ModelIntegrityError` (or
:class:`~stopserve.errors.ModelNotFoundError`) otherwise. No pickle: models are
LightGBM text, everything else is JSON.

Writing is atomic: the new directory is built beside the old one, fsynced, and
swapped in with one ``renameat2(RENAME_EXCHANGE)`` where the kernel has it, so a
crash at any point leaves a whole model (old or new) at the path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import json
import math
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Final

from stopserve.errors import ModelError, ModelIntegrityError, ModelNotFoundError
from stopserve.manifest import MODEL_FORMAT, MODEL_FORMAT_V1, Manifest, ModelEntry

__all__ = [
    "CARD_FILE",
    "MANIFEST_FILE",
    "MODEL_FORMAT",
    "ModelArtifact",
    "library_versions",
    "load_model_dir",
    "reads_features",
    "render_model_card",
    "save_model_dir",
    "sha256_bytes",
]

MANIFEST_FILE: Final = "manifest.json"
CARD_FILE: Final = "MODEL_CARD.md"
#: Model files are small (kilobytes to a few MB); bound what a load may read.
MAX_MODEL_FILE_BYTES: Final = 256 * 1024 * 1024


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def library_versions() -> dict[str, str]:
    """Versions of the libraries a model depends on (recorded in the manifest)."""
    out = {"python": platform.python_version()}
    for name in ("stopserve", "lightgbm", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "unknown"
    return out


@dataclass(frozen=True)
class ModelArtifact:
    """A loaded, verified model directory: its manifest and the text of each model.

    ``models`` maps a model name (``"q"``, ``"s"``, ``"k"``, ``"c"``) to its LightGBM
    text; :mod:`stopserve.policy` turns them into boosters.
    """

    path: Path
    manifest: Manifest
    models: dict[str, str] = field(default_factory=dict)
    card: str | None = None  # MODEL_CARD.md, when the manifest lists (and so hashes) it

    @property
    def kind(self) -> str:
        """``"model"``, ``"heuristic"`` or ``"none"``."""
        return self.manifest.kind


def _json_default(obj: Any) -> Any:
    # numpy scalars and arrays appear in metrics; JSON has no NaN, so NaN becomes null
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _clean(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if hasattr(obj, "tolist"):
        return _clean(obj.tolist())
    return obj


def _dumps(obj: Any) -> bytes:
    return (json.dumps(_clean(obj), indent=2, sort_keys=False, default=_json_default) + "\n").encode()


def save_model_dir(
    out_dir: str | os.PathLike[str],
    manifest: Manifest | Mapping[str, Any],
    models: Mapping[str, str] | None = None,
) -> Path:
    """Write a model directory atomically and return its path.

    ``manifest`` is a :class:`~stopserve.manifest.Manifest` or its JSON data (format 2
    unless it says ``stopserve.model/1``: then it is converted); ``files``, ``created``,
    ``libraries`` and each model's ``file`` are filled in here. ``models`` maps a model
    name to LightGBM text (``booster.model_to_string()``), written as ``<name>.txt``. The
    manifest is always written in format 2. An existing model directory at ``out_dir`` is
    replaced; any other non-empty folder is refused.
    """
    out = Path(out_dir)
    if out.exists():
        if not out.is_dir():
            raise ModelError(f"{out}: exists and is not a folder; refusing to overwrite")
        if any(out.iterdir()) and not (out / MANIFEST_FILE).exists():
            raise ModelError(f"{out}: non-empty folder that is not a model directory; refusing to overwrite")
    if not isinstance(manifest, Manifest):
        manifest = Manifest.from_data({"format": MODEL_FORMAT, **manifest}, source="the manifest to save")
    models = dict(models or {})
    if manifest.kind == "model" and not models:
        raise ModelError("a model-kind directory needs at least one model file")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        files: dict[str, str] = {}
        entries = dict(manifest.models)
        for name, text in models.items():
            if not name.isidentifier():
                raise ModelError(f"model name must be an identifier, got {name!r}")
            data = text.encode()
            fname = f"{name}.txt"
            (tmp / fname).write_bytes(data)
            files[fname] = sha256_bytes(data)
            entries[name] = (entries.get(name) or ModelEntry()).model_copy(update={"file": fname})
        full = manifest.updated(
            models=entries,
            created=manifest.created or datetime.now(UTC).isoformat(timespec="seconds"),
            libraries=manifest.libraries or library_versions(),
            files={},
        )
        card = render_model_card(full).encode()
        (tmp / CARD_FILE).write_bytes(card)
        files[CARD_FILE] = sha256_bytes(card)
        (tmp / MANIFEST_FILE).write_bytes(_dumps(full.updated(files=files).to_dict()))
        for name in os.listdir(tmp):
            _fsync(tmp / name)
        _fsync(tmp)
        if out.exists():
            _swap_in(tmp, out)  # tmp now holds the old model
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.rename(out)
        _fsync(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_RENAME_EXCHANGE: Final = 2
_AT_FDCWD: Final = -100


def _swap_in(new: Path, out: Path) -> None:
    """Put ``new`` at ``out``; afterwards ``new`` holds what ``out`` held.

    Linux: one ``renameat2(RENAME_EXCHANGE)``, so ``out`` is a whole model at every
    instant. Elsewhere (or a file system without it): two renames, the old model
    kept beside as ``.<name>.old-*`` until the new one is in place.
    """
    if sys.platform == "linux":
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        renameat2 = getattr(libc, "renameat2", None)
        if renameat2 is not None:
            rc = renameat2(
                _AT_FDCWD, os.fsencode(new), _AT_FDCWD, os.fsencode(out), ctypes.c_uint(_RENAME_EXCHANGE)
            )
            if rc == 0:
                return
            err = ctypes.get_errno()
            if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise OSError(err, os.strerror(err), str(out))
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    old.rmdir()
    out.rename(old)
    new.rename(out)
    old.rename(new)


def _read(path: Path, root: Path | None = None) -> bytes:
    if root is not None:
        # a listed file may be a link inside the directory, never to a file outside it
        real = path.resolve()
        if not real.is_relative_to(root.resolve()):
            raise ModelIntegrityError(f"{path}: links to {real}, outside the model directory; refused")
    try:
        size = path.stat().st_size
        if size > MAX_MODEL_FILE_BYTES:
            raise ModelIntegrityError(f"{path}: {size} bytes, above the {MAX_MODEL_FILE_BYTES} byte limit")
        return path.read_bytes()
    except FileNotFoundError:
        raise ModelNotFoundError(f"{path}: file not found (listed in the manifest)") from None
    except OSError as exc:
        raise ModelNotFoundError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def load_model_dir(
    path: str | os.PathLike[str], *, feature_names: Sequence[str] | None = None
) -> ModelArtifact:
    """Read and verify a model directory.

    Every file listed in the manifest must exist with the recorded sha256, the
    manifest's feature names must be ``feature_names`` (default:
    :data:`stopserve.features.FEATURE_NAMES`) in order, or their start (a model of a featurizer
    that had fewer features: :func:`reads_features`), and every model the
    manifest names must be present. Raises :class:`ModelNotFoundError` or
    :class:`ModelIntegrityError` naming the file and what is wrong.
    """
    root = Path(path)
    if not root.is_dir():
        raise ModelNotFoundError(f"{root}: model directory not found")
    mpath = root / MANIFEST_FILE
    if not mpath.is_file():
        raise ModelNotFoundError(f"{mpath}: no manifest.json: not a model directory")
    try:
        data = json.loads(_read(mpath, root))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelIntegrityError(f"{mpath}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelIntegrityError(f"{mpath}: must hold a JSON object")
    if data.get("format") in (MODEL_FORMAT, MODEL_FORMAT_V1) and not isinstance(data.get("files"), dict):
        raise ModelIntegrityError(f"{mpath}: files: missing or not an object of sha256 digests")
    manifest = Manifest.from_data(data, source=str(mpath))
    blobs: dict[str, bytes] = {}
    for fname, digest in manifest.files.items():
        if "/" in fname or "\\" in fname or fname.startswith("."):
            raise ModelIntegrityError(f"{mpath}: files: bad file name {fname!r}")
        data_ = _read(root / fname, root)
        actual = sha256_bytes(data_)
        if actual != digest:
            raise ModelIntegrityError(
                f"{root / fname}: sha256 mismatch: manifest says {str(digest)[:12]}..., "
                f"file has {actual[:12]}... (file changed or corrupted)"
            )
        blobs[fname] = data_
    if feature_names is None:
        from stopserve.features import FEATURE_NAMES

        feature_names = FEATURE_NAMES
    recorded = manifest.feature_names
    if manifest.kind == "model" and not reads_features(recorded or [], feature_names):
        raise ModelIntegrityError(
            f"{mpath}: feature_names: {_feature_diff(list(recorded or []), list(feature_names))}; "
            "the model was trained with another featurizer version: retrain it"
        )
    models: dict[str, str] = {}
    for name, entry in manifest.models.items():
        listed = entry.file
        if listed is None or listed not in blobs:
            raise ModelIntegrityError(f"{mpath}: models.{name}.file: {listed!r} is not a listed, hashed file")
        try:
            models[name] = blobs[listed].decode()
        except UnicodeDecodeError:
            raise ModelIntegrityError(f"{root / listed}: not a LightGBM text model (not UTF-8)") from None
    if manifest.kind == "model" and not models:
        raise ModelIntegrityError(f"{mpath}: kind is 'model' but no model files are listed")
    card = blobs.get(CARD_FILE)
    text = card.decode("utf-8", "replace") if card is not None else None
    return ModelArtifact(path=root, manifest=manifest, models=models, card=text)


def reads_features(recorded: Sequence[str], names: Sequence[str]) -> bool:
    """Whether a model trained on features ``recorded`` reads the vectors of featurizer ``names``.

    Features are only ever added at the end (``stopserve.features``), so a model of an older
    featurizer reads the first ``len(recorded)`` values of a newer one's vector: its names must
    be a prefix of ``names``, in order. Any other difference is a featurizer the model never saw.
    """
    return bool(recorded) and list(recorded) == list(names[: len(recorded)])


def _feature_diff(recorded: list[str], expected: list[str]) -> str:
    if len(recorded) != len(expected):
        missing = [n for n in expected if n not in recorded][:5]
        extra = [n for n in recorded if n not in expected][:5]
        return (
            f"model has {len(recorded)} features, this stopserve computes {len(expected)} "
            f"(missing {missing}, unknown {extra})"
        )
    for i, (a, b) in enumerate(zip(recorded, expected, strict=True)):
        if a != b:
            return f"feature {i} is {a!r} in the model but {b!r} here"
    return "differ"


# --------------------------------------------------------------------------- model card


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if value is None:
        return "n/a"
    return str(value)


def _margins(m: Manifest) -> str:
    return ", ".join("none" if x is None else f"{x:.4g}" for x in (m.margins.stop, m.margins.continue_))


def _scale(m: Manifest) -> str:
    if m.cost_scale.kind == "per_run":
        return "per run (lambda from each run's own expected total cost: for systems not seen in training)"
    return f"fixed (mean behavior-run cost {_fmt(m.cost_scale.mean_behavior_cost)})"


def _features(m: Manifest) -> str:
    used, names = m.features_used, m.feature_names or []
    if used is None:
        return "n/a"
    return "all" if len(used) == len(names) else f"{len(used)} of {len(names)} (see manifest features_used)"


def _gates(m: Manifest) -> str:
    g = m.gates
    model = f", the model's own from turn {g.model_min_turns}" if m.kind == "model" else ""
    rule = m.base_rule is not None and m.base_rule.config.quality_met is not None
    reward = f", the base rule's reward threshold from turn {g.reward_rule_min_turns}" if rule else ""
    return f"stops other than a budget or a loop from turn {g.veto_min_turns}{model}{reward}"


def _when_it_stops(m: Manifest) -> list[str]:
    """The card's plain-words section: what stops a run served by this policy."""
    safety = m.nets()
    overrules = set(m.overrules)
    model = m.kind == "model"
    lines = ["## When it stops a run", ""]
    caps = [
        f"{k} {getattr(safety, k):g}"
        for k in ("max_turns", "max_seconds", "max_tokens", "max_usd")
        if getattr(safety, k)
    ]
    lines.append(
        f"- **budgets** (always win): {', '.join(caps) or 'none of its own'}, and the run's own budget"
    )
    loop = safety.loop
    if loop.enabled:
        patterns = ", ".join(
            f"{p} {getattr(loop, p)}" for p in type(loop).model_fields if p != "enabled" and getattr(loop, p)
        )
        may = (
            "may be overruled by the model where going on pays"
            if model and "loop" in overrules
            else "always stops"
        )
        lines.append(f"- **the loop detector** ({patterns}): {may}")
    else:
        lines.append("- **the loop detector**: off (tuned: it cut runs that paid to go on)")
    if safety.quality_met is None:
        lines.append("- **quality_met**: off")
    else:
        may = "may be overruled" if model and "quality_met" in overrules else "always stops"
        lines.append(f"- **quality_met**: a quality reward of {safety.quality_met:g} or more {may}")
    rule = m.base_rule
    if rule is not None and rule.text and rule.config.quality_met is not None:
        lines.append(f"- **its base rule**: {rule.text} (a quality target tuned on your runs)")
    if m.proposals == "refuse":
        lines.append("- **a proposed stop** is not taken as a reason to stop: the rules and the model decide")
    else:
        may = ", unless the model expects going on to pay" if model and "proposed" in overrules else ""
        lines.append(f"- **a proposed stop** is taken{may}")
    if model:
        if m.stop_on == "evidence":
            ev = m.served_evidence
            lines.append(
                "- **the model** stops a run on its own only where its value of going on is below its "
                "stop margin AND the run shows a stall: a loop pattern "
                f"{ev.repeat} times in a row, {ev.quiet_steps} steps with nothing new, "
                f"or {ev.reward_steps} steps with no better reward. A run that keeps doing new "
                "things and reports no reward is never stopped by the model"
            )
        else:
            lines.append("- **the model** stops a run where its value of going on is below its stop margin")
    if m.censored == "unknown":
        lines.append(
            '- runs that ended at a cap trained only the cost still to come: not "nothing more to gain"'
        )
    return [*lines, ""]


def _by_dataset_table(cv: Mapping[str, Any]) -> list[str]:
    """Per data set: the cross-validated policy against the logged runs (value, success, cost saved)."""
    by = cv.get("by_dataset_figures")
    if not isinstance(by, Mapping) or not by:
        return []
    held_out = cv.get("group_by") == "dataset"
    lines = [
        "Each data set as the cross-validated policy decided it"
        + (" (a policy fitted and tuned without that data set):" if held_out else ":"),
        "",
        "| data set | runs | ended at a cap | behavior value | value | oracle | gap closed | success "
        "lost | cost saved | cost of failed runs saved |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d, row in by.items():
        b, lrn, o = row.get("behavior", {}), row.get("learned", {}), row.get("oracle", {})
        gap = o.get("value", 0) - b.get("value", 0)
        closed = (lrn.get("value", 0) - b.get("value", 0)) / gap if gap > 1e-12 else None
        saved = 1 - lrn.get("cost", 0) / b["cost"] if b.get("cost") else None
        fail = 1 - lrn.get("cost_failed", 0) / b["cost_failed"] if b.get("cost_failed") else None
        lost = b.get("success", 0) - lrn.get("success", 0)
        lines.append(
            f"| {d} | {row.get('runs')} | {row.get('censored')} | {_fmt(b.get('value'))} | "
            f"{_fmt(lrn.get('value'))} | {_fmt(o.get('value'))} | {_pct(closed)} | {lost * 100:.2f} pt | "
            f"{_pct(saved)} | {_pct(fail)} |"
        )
    return [*lines, ""]


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _floors_section(guard: Mapping[str, Any]) -> list[str]:
    """The card's floors section: what success (and value) the policy may lose, and what it loses."""
    if "success_floor" not in guard:
        return []  # trained before the floors were the default
    success, value = guard.get("success_floor"), guard.get("value_floor")
    if success is None and value is None:
        return [
            "## Success floor",
            "",
            "Off (`--max-success-loss 0`): any loss of success may be traded for cost.",
            "",
        ]
    lines = ["## Success floor", ""]
    limits = []
    if success is not None:
        limits.append(f"{100 * float(success):g} point(s) of success")
    if value is not None:
        limits.append(f"{float(value):g} of value")
    unless = (
        ", whatever it saves (strict, `--strict-floor`)"
        if guard.get("success_floor_strict")
        else ", unless the value it gains there is at least the success it loses (it would still beat the "
        "logged runs were cost worth half as much)"
    )
    lines.append(
        f"No policy that loses more than {' or '.join(limits)} against the logged runs in cross-validation "
        f"(in any data set, at their own stop) may ship{unless}: the heuristic "
        "is chosen among those within, never-stop included, and the learned model ships only within."
    )
    lines.append("")
    for who in ("learned", "heuristic"):
        if f"{who}_success_loss" in guard:
            ok = "within" if guard.get(f"{who}_within_floors") else "**outside: refused**"
            if guard.get(f"{who}_success_paid"):
                ok = "within: the value it gains pays for the success it loses twice over"
            lines.append(
                f"- {who}: success loss {_fmt(guard[f'{who}_success_loss'])}, "
                f"value loss {_fmt(guard.get(f'{who}_value_loss'))} ({ok})"
            )
    lines.append("")
    return lines


def render_model_card(manifest: Manifest) -> str:
    """The ``MODEL_CARD.md`` text for a manifest (what it is, how it was trained, how good)."""
    m = manifest
    kind = m.kind
    objective = "none (cost is free)" if m.objective is None else m.objective.describe()
    lines = [
        f"# Model card: {m.model_version or 'unnamed'}",
        "",
        "Generated by `stopserve train` from `manifest.json`; do not edit by hand.",
        "",
        "| | |",
        "|---|---|",
        f"| kind | {kind} |",
        f"| method | {_fmt(m.method)} |",
        f"| base rule | {_fmt(None if m.base_rule is None else m.base_rule.text)} |",
        f"| margins (stop, continue) | {_margins(m)} |",
        f"| gates | {_gates(m)} |",
        f"| cost unit | {m.cost_unit} |",
        f"| cost scale | {_scale(m)} |",
        f"| default objective | {objective} |",
        f"| features read | {_features(m)} |",
        f"| created | {_fmt(m.created)} |",
        "",
    ]
    if kind == "heuristic":
        lines += [
            "**This directory holds a tuned heuristic, not a learned model**: the learned policy did not",
            "beat the best tuned heuristic with error bars, so the heuristic ships instead (see the guard).",
            "",
        ]
    elif kind == "model":
        lines += [
            "The policy starts from its base rule and deviates where the learned value of continuing",
            "clears a margin: it continues through a rule (or proposed) stop when V > the continue margin",
            "and stops a run the rule lets go on when V < minus the stop margin (`none`: never).",
            "",
        ]
    lines += _when_it_stops(m)
    guard = m.guard
    if isinstance(guard, Mapping):
        lines += _floors_section(guard)
        lines += ["## Never worse than a tuned heuristic", ""]
        lines += [f"- {k}: {_fmt(v)}" for k, v in guard.items()]
        lines.append("")
    data = m.training_data
    if isinstance(data, Mapping):
        lines += ["## Training data", ""]
        lines += [f"- {k}: {_fmt(v)}" for k, v in data.items()]
        lines.append("")
    cv = m.cv
    if isinstance(cv, Mapping):
        lines += ["## Cross-validated metrics", ""]
        table = cv.get("policies")
        if isinstance(table, Mapping) and table:
            lines += ["| policy | value | success | cost |", "|---|---|---|---|"]
            for name, row in table.items():
                if isinstance(row, Mapping):
                    lines.append(
                        f"| {name} | {_fmt(row.get('value'))} | {_fmt(row.get('success'))} | "
                        f"{_fmt(row.get('cost'))} |"
                    )
            lines.append("")
        lines += [f"- {k}: {_fmt(v)}" for k, v in cv.items() if not isinstance(v, Mapping | list)]
        lines.append("")
        by = cv.get("by_dataset")
        if isinstance(by, Mapping) and by:
            names = list(next(iter(by.values())))
            lines += ["Cross-validated value by data set:", ""]
            lines += ["| data set | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
            for d, row in by.items():
                lines.append(f"| {d} | " + " | ".join(_fmt(row.get(n)) for n in names) + " |")
            lines.append("")
        lines += _by_dataset_table(cv)
    imp = m.feature_importance
    if isinstance(imp, Mapping) and imp:
        lines += ["## Top features (gain share, all models)", ""]
        for name, share in list(imp.items())[:10]:
            lines.append(f"- {name}: {_fmt(share)}")
        lines.append("")
    safety = None if m.safety is None else m.to_dict()["safety"]
    if safety is not None:
        lines += [
            "## Safety config (budgets always win; the loop detector and quality_met are rules)",
            "",
            "```json",
        ]
        lines.append(json.dumps(_clean(safety), indent=2))
        lines += ["```", ""]
    libs = m.libraries
    if isinstance(libs, Mapping):
        lines += ["## Libraries", "", ", ".join(f"{k} {v}" for k, v in libs.items()), ""]
    return "\n".join(lines)
