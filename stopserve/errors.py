"""One exception tree for stopserve. Core modules raise these; one table
(:mod:`stopserve.error_table`) gives each its HTTP status and ``type`` string for
the service and the client, and the CLI prints them without a traceback.

::

    StopServeError
    ├── TraceError                 a trace file or trace object is bad
    │   ├── TraceFormatError       unreadable: not JSON, binary, empty, too large
    │   └── TraceValidationError   readable, but breaks the format v1 contract
    ├── ImporterError              a foreign format cannot be converted
    ├── ConfigError                a setting or a safety-net config is bad
    ├── ModelError                 a model directory cannot be used
    │   ├── ModelNotFoundError
    │   └── ModelIntegrityError    sha256 or feature names do not match
    ├── RunError                   a live run cannot take this request
    │   ├── RunNotFoundError
    │   ├── RunClosedError
    │   ├── RunEvictedError        the run store dropped it: resend its events or decide locally
    │   └── RunLimitError          too many events, runs or bytes
    ├── TrainingError              the data cannot train or evaluate a policy
    ├── HookInputError             a harness's hook input (stdin JSON) is not what its protocol says
    ├── LogUnavailableError        the service cannot write its decision or trace log
    ├── StoreUnavailableError      the shared run store cannot be reached (try again)
    └── AuthError                  admin token missing or wrong

Every error can carry :class:`Issue` objects: each names the file, line, trace
id and field path it is about, so a message reads like
``runs.jsonl:1042: trace 'abc': events[3].type: 'spwan' is not one of spawn, ...``;
:func:`pydantic_issues` makes them from a pydantic ``ValidationError.errors()`` list.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AuthError",
    "ConfigError",
    "HookInputError",
    "ImporterError",
    "Issue",
    "LogUnavailableError",
    "ModelError",
    "ModelIntegrityError",
    "ModelNotFoundError",
    "RunClosedError",
    "RunError",
    "RunEvictedError",
    "RunLimitError",
    "RunNotFoundError",
    "StopServeError",
    "StoreUnavailableError",
    "TraceError",
    "TraceFormatError",
    "TraceValidationError",
    "TrainingError",
    "field_path",
    "pydantic_issues",
    "pydantic_message",
]


@dataclass(frozen=True, slots=True)
class Issue:
    """One problem, located as precisely as is known.

    >>> str(Issue("bad type", file="runs.jsonl", line=3, trace_id="abc", path="events[0].type"))
    "runs.jsonl:3: trace 'abc': events[0].type: bad type"
    """

    message: str
    file: str | None = None
    line: int | None = None
    trace_id: str | None = None
    path: str | None = None

    def __str__(self) -> str:
        parts: list[str] = []
        if self.file is not None:
            parts.append(self.file if self.line is None else f"{self.file}:{self.line}")
        if self.trace_id is not None:
            parts.append(f"trace {self.trace_id!r}")
        if self.path:
            parts.append(self.path)
        parts.append(self.message)
        return ": ".join(parts)

    def to_dict(self) -> dict[str, str | int | None]:
        return {
            "file": self.file,
            "line": self.line,
            "trace_id": self.trace_id,
            "field": self.path,
            "message": self.message,
        }


class StopServeError(Exception):
    """Base of every error stopserve raises on purpose."""

    def __init__(self, message: str, issues: Sequence[Issue] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.issues: list[Issue] = list(issues)

    def __str__(self) -> str:
        if not self.issues:
            return self.message
        lines = [self.message, *(f"  {issue}" for issue in self.issues)]
        return "\n".join(lines)


class TraceError(StopServeError):
    """A trace file or trace object is bad."""


class TraceFormatError(TraceError):
    """The input cannot be read as traces at all (not JSON, binary, empty, too large)."""


class TraceValidationError(TraceError):
    """The input parses but breaks the format v1 contract; ``issues`` lists every problem."""


class ImporterError(StopServeError):
    """A foreign trace format cannot be converted."""


class ConfigError(StopServeError):
    """A setting or a safety-net configuration is invalid."""


class ModelError(StopServeError):
    """A model directory cannot be used."""


class ModelNotFoundError(ModelError):
    """The model directory or one of its files does not exist."""


class ModelIntegrityError(ModelError):
    """A model file's sha256 or the feature names do not match the manifest."""


class RunError(StopServeError):
    """A live run cannot take this request."""


class RunNotFoundError(RunError):
    """No live run has this id (never created, closed, evicted or expired)."""


class RunClosedError(RunError):
    """The run already received its outcome."""


class RunEvictedError(RunError):
    """The service no longer holds this run (evicted, expired, or a restart): it will not start it over.

    The caller resends every event of the run with ``prior_events: 0``, or decides locally.
    """


class RunLimitError(RunError):
    """A bound was hit: events or bytes per run, events per request, runs per batch."""


class TrainingError(StopServeError):
    """The traces given cannot train or evaluate a policy (says what is missing)."""


class HookInputError(StopServeError):
    """A Claude Code or Codex hook input is not what the harness's protocol says."""


class LogUnavailableError(StopServeError):
    """The service cannot write its decision or trace log: it does not answer what it cannot log."""


class StoreUnavailableError(StopServeError):
    """The shared run store cannot be reached, or a run's updates kept conflicting: try again."""


class AuthError(StopServeError):
    """An admin endpoint was called without the right bearer token."""


# --------------------------------------------------------------------------- pydantic errors as issues
# One formatter for every pydantic validation error stopserve reports (a trace, a safety
# config, a request body, settings, a client argument): plain dicts in, so no pydantic here.


def field_path(loc: Iterable[int | str], *, prefix: str = "", skip: Container[str] = ()) -> str:
    """A pydantic ``loc`` as a field path: ``("events", 3, "type")`` -> ``events[3].type``.

    ``skip`` drops the names pydantic puts in a path for the member of a union it tried.

    >>> field_path(("events", 3, "type"), prefix="body")
    'body.events[3].type'
    """
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part not in skip:
            out += f".{part}" if out else str(part)
    return out


def pydantic_message(err: Mapping[str, Any]) -> str:
    """One pydantic error as a short sentence, with the value it got when that helps.

    >>> err = {"type": "literal_error", "input": "spwan", "ctx": {"expected": "'spawn' or 'stop'"}}
    >>> pydantic_message(err)
    "'spwan' is not one of spawn, stop"
    """
    kind = err.get("type")
    value = err.get("input")
    if kind in ("literal_error", "enum"):
        expected = str((err.get("ctx") or {}).get("expected", ""))
        expected = expected.replace("'", "").replace(" or ", ", ")
        return f"{value!r} is not one of {expected}"
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown field"
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    if kind in _NO_VALUE or value is None or isinstance(value, dict | list):
        return msg
    return f"{msg} (got {_short(value)})"


_NO_VALUE = frozenset({"value_error", "assertion_error", "json_invalid"})


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def pydantic_issues(
    errors: Iterable[Mapping[str, Any]],
    *,
    prefix: str = "",
    skip: Container[str] = (),
    file: str | None = None,
    line: int | None = None,
    trace_id: str | None = None,
) -> list[Issue]:
    """Pydantic's ``exc.errors()`` as located issues (see :func:`field_path`, :func:`pydantic_message`)."""
    return [
        Issue(
            pydantic_message(err),
            file=file,
            line=line,
            trace_id=trace_id,
            path=field_path(err.get("loc", ()), prefix=prefix, skip=skip) or None,
        )
        for err in errors
    ]
