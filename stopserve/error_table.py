"""The one table of errors on the wire: each error, its HTTP status and its ``type`` string.

The service answers every :class:`~stopserve.errors.StopServeError` from it (status,
body, and the OpenAPI responses of its routes); the client turns an error answer back
into the exception of that ``type``, so a :class:`~stopserve.errors.TraceValidationError`
raised in the service is a ``TraceValidationError`` in the caller too.

No FastAPI here (pydantic only, through :mod:`stopserve.api`): the client imports it.

>>> status_of(RunEvictedError("gone"))
(409, 'run_evicted')
>>> exception_for("trace_validation_error", 422).__name__
'TraceValidationError'
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from stopserve.api import ErrorBody, ErrorDetail, ErrorIssue
from stopserve.errors import (
    AuthError,
    ConfigError,
    HookInputError,
    ImporterError,
    Issue,
    LogUnavailableError,
    ModelError,
    ModelIntegrityError,
    ModelNotFoundError,
    RunClosedError,
    RunError,
    RunEvictedError,
    RunLimitError,
    RunNotFoundError,
    StopServeError,
    StoreUnavailableError,
    TraceError,
    TraceFormatError,
    TraceValidationError,
    TrainingError,
)

__all__ = [
    "ERRORS",
    "HTTP_ERRORS",
    "ErrorKind",
    "error_detail",
    "error_from_answer",
    "exception_for",
    "http_type",
    "openapi_responses",
    "status_of",
    "to_issue",
    "to_wire_issue",
]


@dataclass(frozen=True, slots=True)
class ErrorKind:
    """One row: the ``type`` string, the HTTP status, the exception and what it means."""

    type: str
    status: int
    error: builtins.type[StopServeError]  # builtins: the field above shadows the name here
    description: str


#: Every class of the :mod:`stopserve.errors` tree (a test keeps it complete). A subclass
#: defined elsewhere is answered as its nearest base listed here.
ERRORS: Final[tuple[ErrorKind, ...]] = (
    ErrorKind("bad_request", 400, StopServeError, "the request cannot be served"),
    ErrorKind("trace_error", 422, TraceError, "a trace is bad"),
    ErrorKind("trace_format_error", 422, TraceFormatError, "input not readable as traces"),
    ErrorKind("trace_validation_error", 422, TraceValidationError, "events break format v1 (time order)"),
    ErrorKind("importer_error", 422, ImporterError, "a foreign format cannot be converted"),
    ErrorKind("config_error", 422, ConfigError, "a setting or safety-net config is invalid"),
    ErrorKind("model_error", 422, ModelError, "the model directory cannot be used"),
    ErrorKind("model_not_found", 404, ModelNotFoundError, "no such model directory"),
    ErrorKind("model_integrity_error", 422, ModelIntegrityError, "a model file fails its checks"),
    ErrorKind("run_error", 409, RunError, "the run cannot take this request"),
    ErrorKind("run_not_found", 404, RunNotFoundError, "no live run has this id"),
    ErrorKind("run_closed", 409, RunClosedError, "the run's outcome was posted"),
    ErrorKind("run_evicted", 409, RunEvictedError, "the service dropped the run: resend it whole"),
    ErrorKind("run_limit", 413, RunLimitError, "events, runs or bytes over a limit"),
    ErrorKind("training_error", 422, TrainingError, "the traces cannot train a policy"),
    ErrorKind("hook_input_error", 422, HookInputError, "a hook input breaks its protocol"),
    ErrorKind("log_unavailable", 503, LogUnavailableError, "the decision log cannot be written"),
    ErrorKind("store_unavailable", 503, StoreUnavailableError, "the shared run store cannot be reached"),
    ErrorKind("unauthorized", 401, AuthError, "missing or wrong admin token"),
)

#: Errors the HTTP layer answers itself (no StopServeError raised them), with the
#: exception a client raises for each. ``internal_error`` is a bug, never documented.
HTTP_ERRORS: Final[tuple[ErrorKind, ...]] = (
    ErrorKind("bad_request", 400, StopServeError, "malformed request"),
    ErrorKind("unauthorized", 401, AuthError, "missing or wrong admin token"),
    ErrorKind("forbidden", 403, AuthError, "forbidden"),
    ErrorKind("not_found", 404, StopServeError, "no such path"),
    ErrorKind("method_not_allowed", 405, StopServeError, "method not allowed"),
    ErrorKind("payload_too_large", 413, RunLimitError, "body over STOPSERVE_MAX_BODY_BYTES"),
    ErrorKind("unsupported_media_type", 415, ConfigError, "not a JSON body"),
    ErrorKind("validation_error", 422, ConfigError, "invalid request: each issue names the field"),
    ErrorKind("too_many_requests", 429, StopServeError, "too many requests"),
    ErrorKind("internal_error", 500, StopServeError, "a bug: the server logged it"),
    ErrorKind("unavailable", 503, StopServeError, "unavailable"),
)

_BY_CLASS: Final[Mapping[type[StopServeError], ErrorKind]] = {k.error: k for k in ERRORS}
_BY_TYPE: Final[Mapping[str, ErrorKind]] = {k.type: k for k in (*HTTP_ERRORS, *ERRORS)}
_HTTP_BY_STATUS: Final[Mapping[int, ErrorKind]] = {k.status: k for k in HTTP_ERRORS}


def _kind(exc: StopServeError) -> ErrorKind:
    for cls in type(exc).__mro__:
        kind = _BY_CLASS.get(cls)
        if kind is not None:
            return kind
    return ERRORS[0]  # unreachable: StopServeError is in the table


def status_of(exc: StopServeError) -> tuple[int, str]:
    """HTTP status and ``type`` of a stopserve error (its nearest class in :data:`ERRORS`)."""
    kind = _kind(exc)
    return kind.status, kind.type


def http_type(status: int) -> str:
    """The ``type`` of an error the HTTP layer answers with ``status`` (``http_error`` if unlisted)."""
    kind = _HTTP_BY_STATUS.get(status)
    return kind.type if kind is not None else "http_error"


def to_wire_issue(issue: Issue) -> ErrorIssue:
    """An :class:`~stopserve.errors.Issue` as the error body carries it."""
    return ErrorIssue(
        field=issue.path, message=issue.message, file=issue.file, line=issue.line, trace_id=issue.trace_id
    )


def to_issue(issue: ErrorIssue) -> Issue:
    """An error body's issue back as an :class:`~stopserve.errors.Issue`."""
    return Issue(issue.message, file=issue.file, line=issue.line, trace_id=issue.trace_id, path=issue.field)


def error_detail(exc: StopServeError) -> ErrorDetail:
    """The error body's detail for a stopserve error."""
    status, name = status_of(exc)
    return ErrorDetail(
        type=name, message=exc.message, status=status, issues=[to_wire_issue(i) for i in exc.issues]
    )


def exception_for(type_: str | None, status: int) -> type[StopServeError]:
    """The exception a client raises for an error answer: by its ``type``, else by its status."""
    kind = _BY_TYPE.get(type_) if type_ is not None else None
    if kind is None:
        kind = _HTTP_BY_STATUS.get(status)
    return kind.error if kind is not None else StopServeError


def error_from_answer(status: int, data: Any, what: str) -> StopServeError:
    """The exception for an error answer (its parsed JSON ``data``); the message says ``what`` failed."""
    try:
        detail = ErrorBody.model_validate(data).error
    except ValidationError:
        return exception_for(None, status)(f"{what}: HTTP {status}: {str(data)[:200]}")
    issues = [to_issue(i) for i in detail.issues]
    return exception_for(detail.type, status)(f"{what}: HTTP {status}: {detail.message}", issues)


def openapi_responses(kinds: Iterable[ErrorKind] | None = None) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a route: each status with the error body and the ``type`` strings it carries.

    Default: every error of the table and every HTTP-layer error a route can answer.
    """
    if kinds is None:
        kinds = (*ERRORS, *(k for k in HTTP_ERRORS if k.type != "internal_error"))
    by_status: dict[int, dict[str, str]] = {}
    for kind in kinds:
        by_status.setdefault(kind.status, {}).setdefault(kind.type, kind.description)
    return {
        status: {
            "model": ErrorBody,
            "description": "; ".join(f"`{name}`: {text}" for name, text in types.items()),
        }
        for status, types in sorted(by_status.items())
    }
