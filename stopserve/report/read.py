"""Reading the logs: which files a log directory holds, and their records, every problem named.

A log directory is the service's (``decisions.jsonl``, ``traces.jsonl``, their rotated files,
the model store under ``models/``) or the hook's state directory (``decisions.jsonl`` of hook
calls, ``labels.jsonl``); one directory may hold both. Each line is one JSON object; a line
that is not (torn by a crash, cut short, a foreign file) becomes a :class:`Problem` naming the
file and line, and reading goes on: nothing readable is lost to one bad line.

:func:`read_records` reads whole lines from a byte offset and says where it stopped, so a
follower (the live page) reads only what was appended since.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import orjson

from stopserve.service.log import log_files

__all__ = [
    "BLOCK_BYTES",
    "Chunk",
    "LogFiles",
    "Problem",
    "RecordKind",
    "Sink",
    "classify",
    "find_logs",
    "model_units",
    "read_champion",
    "read_records",
]

#: Bytes read at a time (lines are split inside a block; a longer line spans blocks).
BLOCK_BYTES: Final = 1 << 20
#: A line longer than this is not read whole (a service line is at most a few KiB, a trace
#: line at most the run's byte cap, 16 MiB by default): it is a problem, skipped.
MAX_LINE_BYTES: Final = 64 << 20

RecordKind = Literal["decision", "trace", "hook", "label", "promotion"]
#: Where each record read goes (the summarizer's ``add``).
Sink = Callable[[RecordKind, dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class Problem:
    """Something that could not be read: where (file, line or byte offset) and what."""

    file: str
    line: int | None
    message: str
    offset: int | None = None

    def __str__(self) -> str:
        if self.line is not None:
            return f"{self.file}:{self.line}: {self.message}"
        if self.offset is not None:
            return f"{self.file} (at byte {self.offset}): {self.message}"
        return f"{self.file}: {self.message}"


def classify(rec: Mapping[str, Any]) -> RecordKind | None:
    """What a log record is, from its shape; None: not a stopserve record."""
    kind = rec.get("kind")
    if kind == "decision" and "run_id" in rec and "action" in rec:
        return "decision"
    if kind in ("promotion", "refusal", "rollback"):
        return "promotion"
    if "trace_id" in rec and isinstance(rec.get("events"), list):
        return "trace"
    if "harness" in rec and ("session_id" in rec or "error" in rec):
        return "hook"
    if "session_id" in rec and "reward" in rec:
        return "label"
    return None


@dataclass
class LogFiles:
    """The files of one log directory, each log's oldest first."""

    root: Path
    decisions: list[Path] = field(default_factory=list)
    traces: list[Path] = field(default_factory=list)
    labels: list[Path] = field(default_factory=list)
    store: Path | None = None

    @property
    def promotions(self) -> Path | None:
        """The model store's promotions log, if there is one."""
        if self.store is None:
            return None
        path = self.store / "promotions.jsonl"
        return path if path.is_file() else None

    @property
    def champion(self) -> Path | None:
        """The model store's champion pointer, if there is one."""
        if self.store is None:
            return None
        path = self.store / "champion.json"
        return path if path.is_file() else None

    def all(self) -> list[Path]:
        """Every log file found."""
        extra = [p for p in (self.promotions,) if p is not None]
        return [*self.decisions, *self.traces, *self.labels, *extra]


def _hook_files(path: Path) -> list[Path]:
    """A hook state log: ``<name>.1`` (rotated at 32 MB) then ``<name>``."""
    return [p for p in (path.with_name(path.name + ".1"), path) if p.is_file()]


def find_logs(root: Path, *, model_store: Path | None = None) -> LogFiles:
    """The log files under ``root`` (not recursive; the model store: ``model_store`` or ``root/models``)."""
    decisions = _hook_files(root / "decisions.jsonl")
    rotated = [p for p in log_files(root / "decisions.jsonl") if p not in decisions]
    store = model_store if model_store is not None else root / "models"
    return LogFiles(
        root=root,
        decisions=[*rotated, *decisions],
        traces=log_files(root / "traces.jsonl"),
        labels=_hook_files(root / "labels.jsonl"),
        store=store if store.is_dir() else None,
    )


@dataclass
class Chunk:
    """What :func:`read_records` read: how many records, the problems, and where it stopped."""

    records: int = 0
    problems: list[Problem] = field(default_factory=list)
    #: the offset after the last whole line read (where the next read starts)
    end: int = 0
    #: lines read (the next line's number is ``first_line + lines``)
    lines: int = 0
    #: a last line without its newline was left unread (``partial="leave"``)
    partial: bool = False


def read_records(
    path: Path,
    sink: Sink,
    start: int = 0,
    *,
    stop: int | None = None,
    first_line: int | None = 1,
    partial: Literal["read", "leave"] = "read",
) -> Chunk:
    """Hand each record of ``path`` from byte ``start`` up to ``stop`` (default: its end) to ``sink``.

    ``first_line`` is the number of the line at ``start`` (None when unknown: problems then
    name the byte offset). A last line without a newline is read and reported as cut short
    (``partial="read"``: a finished log), or left for the next read (``"leave"``: a log being
    written). A missing file reads as nothing.
    """
    chunk = Chunk(end=start)
    name = str(path)
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return chunk
    except OSError as exc:
        chunk.problems.append(Problem(name, None, f"cannot read: {exc.strerror or exc}"))
        return chunk
    with fh:
        try:
            size = os.fstat(fh.fileno()).st_size
        except OSError:
            size = 0
        stop = size if stop is None else min(stop, size)
        if start > stop:  # the file was cut or replaced: nothing new at this offset
            return chunk
        fh.seek(start)
        pos = start
        line_no = first_line
        carry = b""
        skipping = False  # inside a line longer than MAX_LINE_BYTES
        while pos < stop:
            block = fh.read(min(BLOCK_BYTES, stop - pos))
            if not block:
                break
            pos += len(block)
            data = carry + block if carry else block
            lines = data.split(b"\n")
            carry = lines.pop()
            line_start = pos - len(data)
            for raw in lines:
                at = line_start
                line_start += len(raw) + 1
                if skipping:
                    skipping = False
                else:
                    _one(raw, chunk, sink, name, line_no, at)
                chunk.lines += 1
                chunk.end = line_start
                if line_no is not None:
                    line_no += 1
            if len(carry) > MAX_LINE_BYTES:
                if not skipping:
                    chunk.problems.append(
                        _problem(
                            name, line_no, pos - len(carry), f"a line over {MAX_LINE_BYTES} bytes: skipped"
                        )
                    )
                skipping = True
                carry = b""
        if carry and not skipping:
            if partial == "leave":
                chunk.partial = True
            else:
                at = pos - len(carry)
                if _one(carry, chunk, sink, name, line_no, at, quiet=True):
                    pass  # a whole record without its newline: read, nothing lost
                else:
                    chunk.problems.append(
                        _problem(name, line_no, at, "the last line is cut short (no newline): skipped")
                    )
                chunk.lines += 1
                chunk.end = pos
    return chunk


def _problem(name: str, line: int | None, offset: int, message: str) -> Problem:
    return Problem(name, line, message, None if line is not None else offset)


def _one(  # noqa: PLR0917
    raw: bytes, chunk: Chunk, sink: Sink, name: str, line: int | None, offset: int, *, quiet: bool = False
) -> bool:
    """Parse one line into ``chunk``; True when it was a record (blank lines count as read)."""
    if not raw.strip():
        return True
    try:
        rec = orjson.loads(raw)
    except orjson.JSONDecodeError:
        if not quiet:
            what = "not text" if b"\x00" in raw[:256] else "not JSON (a torn or foreign line)"
            chunk.problems.append(_problem(name, line, offset, f"{what}: skipped"))
        return False
    if not isinstance(rec, dict):
        if not quiet:
            chunk.problems.append(
                _problem(name, line, offset, f"a JSON {type(rec).__name__}, not a record: skipped")
            )
        return False
    kind = classify(rec)
    if kind is None:
        if not quiet:
            keys = ", ".join(sorted(rec)[:5]) or "none"
            chunk.problems.append(
                _problem(name, line, offset, f"not a stopserve log record (its keys: {keys}): skipped")
            )
        return False
    chunk.records += 1
    sink(kind, rec)
    return True


def model_units(store: Path | None) -> dict[str, str]:
    """Model version -> the cost unit it prices cost in, for every model directory found.

    Read from the manifests (``model_version``, ``cost_unit``) of the model store's versions,
    its kept candidate, the champion's directory and the shipped default model; a manifest
    that cannot be read is passed over (the report then estimates those stops another way).
    """
    from stopserve.settings import default_model_dir

    dirs: list[Path] = []
    if store is not None:
        versions = store / "versions"
        if versions.is_dir():
            dirs.extend(p for p in versions.iterdir() if p.is_dir())
        dirs.append(store / "candidate")
        champion = read_champion(store / "champion.json")
        if champion is not None and isinstance(champion.get("path"), str):
            where = Path(champion["path"])
            dirs.append(where if where.is_absolute() else store / where)
    default = default_model_dir()
    if default is not None:
        dirs.append(default)
    units: dict[str, str] = {}
    for d in dirs:
        try:
            manifest = orjson.loads((d / "manifest.json").read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        if isinstance(manifest, dict):
            version, unit = manifest.get("model_version"), manifest.get("cost_unit")
            if isinstance(version, str) and isinstance(unit, str):
                units[version] = unit
    return units


def read_champion(path: Path) -> dict[str, Any] | None:
    """The model store's champion pointer, or None when there is none (or it cannot be read)."""
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
