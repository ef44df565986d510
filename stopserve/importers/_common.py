"""Helpers every importer shares: finding files, loading JSON with located errors,
and turning a converted dict into a valid :class:`Trace`.

Importing this module stays light (no pydantic): the ``stopserve hook`` process maps
transcript lines with the same helpers the importers use."""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson

from stopserve.errors import ImporterError, Issue, TraceValidationError

if TYPE_CHECKING:
    from stopserve.trace import Trace

__all__ = [
    "CHARS_PER_TOKEN",
    "MAX_FILE_BYTES",
    "OnError",
    "fail",
    "finish",
    "is_json_lines",
    "iter_files",
    "iter_json_records",
    "json_records",
    "load_json",
    "report",
]

#: Called with each source an importer skips; without it the importer raises instead.
OnError = Callable[[ImporterError], None] | None

#: The documented estimate when a source has no token counts: one token per 4 characters.
CHARS_PER_TOKEN: Final = 4

#: One foreign JSON document above this size is refused (bounds memory per run).
MAX_FILE_BYTES: Final = 256 * 1024 * 1024


def fail(
    message: str,
    *,
    file: str | os.PathLike[str] | None = None,
    line: int | None = None,
    path: str | None = None,
    trace_id: str | None = None,
) -> ImporterError:
    """An :class:`ImporterError` whose single issue names file, line and field."""
    issue = Issue(message, file=None if file is None else str(file), line=line, trace_id=trace_id, path=path)
    where = str(Issue("", file=issue.file, line=line, trace_id=trace_id)).rstrip(": ")
    return ImporterError(f"{where}: cannot import" if where else "cannot import", [issue])


def report(err: ImporterError, on_error: OnError) -> None:
    """Raise ``err``, or hand it to ``on_error`` so the caller can count the skip and go on."""
    if on_error is None:
        raise err
    on_error(err)


def iter_files(
    sources: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    suffixes: tuple[str, ...],
    *,
    skip_names: Iterable[str] = (),
    skip_dirs: Iterable[str] = (),
) -> Iterator[Path]:
    """Files named by ``sources``: files as given, folders searched recursively (sorted).

    In a folder, files named in ``skip_names`` and everything under a sub-folder named in
    ``skip_dirs`` are passed over. Raises :class:`ImporterError` for a source that does not
    exist or a folder with no match.
    """
    if isinstance(sources, str | os.PathLike):
        sources = [sources]
    skip = set(skip_names)
    skip_in = set(skip_dirs)
    for source in sources:
        path = Path(source)
        if path.is_file():
            yield path
        elif path.is_dir():
            found = False
            for child in sorted(path.rglob("*")):
                name = child.name.lower()
                if not name.endswith(suffixes) or name in skip or not child.is_file():
                    continue
                if skip_in and not skip_in.isdisjoint(child.relative_to(path).parts[:-1]):
                    continue
                found = True
                yield child
            if not found:
                raise fail(f"no {' or '.join(suffixes)} files in this folder", file=path)
        else:
            raise fail("no such file or folder", file=path)


def _open(path: Path) -> Any:
    with path.open("rb") as fh:
        magic = fh.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else path.open("rb")


def load_json(path: Path, *, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """Parse one JSON document (gzip allowed) or raise an :class:`ImporterError` naming file and line."""
    try:
        with _open(path) as fh:
            blob = fh.read(max_bytes + 1)
    except (OSError, EOFError) as exc:
        raise fail(f"cannot read: {exc}", file=path) from exc
    if len(blob) > max_bytes:
        raise fail(f"file larger than {max_bytes} bytes: refused to bound memory", file=path)
    if not blob.strip():
        raise fail("file is empty", file=path)
    if b"\x00" in blob[:8192]:
        raise fail("binary content (NUL byte): not a JSON file", file=path)
    try:
        return orjson.loads(blob)
    except orjson.JSONDecodeError as exc:
        raise fail(f"not valid JSON: {exc.msg} (column {exc.colno})", file=path, line=exc.lineno) from exc


def is_json_lines(path: Path) -> bool:
    """Whether ``path`` is read as JSON Lines (``.jsonl``/``.ndjson``, optionally ``.gz``)."""
    return path.name.lower().removesuffix(".gz").endswith((".jsonl", ".ndjson"))


def json_records(data: Any, path: Path) -> Iterator[tuple[None, Any]]:
    """The records of one JSON document: each item of a list (an empty one is an error), else itself."""
    if not isinstance(data, list):
        yield None, data
        return
    if not data:
        raise fail("file holds an empty list", file=path)
    for item in data:
        yield None, item


def iter_json_records(path: Path, *, max_bytes: int = MAX_FILE_BYTES) -> Iterator[tuple[int | None, Any]]:
    """Yield ``(line, object)`` from a JSON Lines file, or ``(None, document)`` from a JSON file.

    JSON Lines (by suffix ``.jsonl``/``.ndjson``, optionally ``.gz``) stream a line at a
    time. A ``.json`` holding a list yields each item. A line that is not JSON is
    yielded as an :class:`ImporterError` naming file and line (the caller skips it
    or stops); an unreadable file raises.
    """
    if not is_json_lines(path):
        yield from json_records(load_json(path, max_bytes=max_bytes), path)
        return
    try:
        fh = _open(path)
    except OSError as exc:
        raise fail(f"cannot read: {exc}", file=path) from exc
    with fh:
        lineno = 0
        seen = False
        while True:
            try:
                line = fh.readline(max_bytes + 1)
            except (OSError, EOFError) as exc:
                raise fail(f"cannot read: {exc}", file=path, line=lineno + 1) from exc
            if not line:
                break
            lineno += 1
            if not line.strip():
                continue
            seen = True
            if len(line) > max_bytes:
                raise fail(f"line longer than {max_bytes} bytes", file=path, line=lineno)
            if b"\x00" in line:
                raise fail("binary content (NUL byte): not JSON Lines", file=path, line=lineno)
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                yield lineno, fail(f"not valid JSON: {exc.msg} (column {exc.colno})", file=path, line=lineno)
                continue
            yield lineno, obj
        if not seen:
            raise fail("file is empty", file=path)


def finish(data: dict[str, Any], *, file: str | os.PathLike[str], line: int | None = None) -> Trace:
    """Validate a converted trace; a conversion that breaks format v1 becomes an :class:`ImporterError`."""
    from stopserve.trace import parse_trace  # pydantic: only when a trace is built, not on the hook path

    try:
        return parse_trace(data, file=str(file), line=line)
    except TraceValidationError as exc:
        raise ImporterError(f"{exc.message}: cannot import", exc.issues) from exc
