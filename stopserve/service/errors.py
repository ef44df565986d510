"""The ONE table from :mod:`stopserve.errors` classes to HTTP statuses, and the one error body.

Every error response is :class:`stopserve.api.ErrorBody`: a stable ``type``, a
message, the status and located issues (field, file, line, trace id). Request
validation errors name the field (``body.events[3].type``); a client's mistake
is never a 500.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from stopserve import errors as e
from stopserve.api import ErrorBody, ErrorDetail, ErrorIssue

__all__ = ["STATUS", "error_detail", "error_response", "install_error_handlers", "status_of"]

#: Most specific class first; the first ``isinstance`` match wins.
STATUS: Final[tuple[tuple[type[e.StopServeError], int, str], ...]] = (
    (e.TraceFormatError, 422, "trace_format_error"),
    (e.TraceValidationError, 422, "trace_validation_error"),
    (e.TraceError, 422, "trace_error"),
    (e.ImporterError, 422, "importer_error"),
    (e.ConfigError, 422, "config_error"),
    (e.ModelNotFoundError, 404, "model_not_found"),
    (e.ModelIntegrityError, 422, "model_integrity_error"),
    (e.ModelError, 422, "model_error"),
    (e.RunNotFoundError, 404, "run_not_found"),
    (e.RunClosedError, 409, "run_closed"),
    (e.RunEvictedError, 409, "run_evicted"),
    (e.RunLimitError, 413, "run_limit"),
    (e.RunError, 409, "run_error"),
    (e.TrainingError, 422, "training_error"),
    (e.AuthError, 401, "unauthorized"),
    (e.StopServeError, 400, "bad_request"),
)

_HTTP_TYPES: Final[Mapping[int, str]] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "too_many_requests",
    503: "unavailable",
}


def status_of(exc: e.StopServeError) -> tuple[int, str]:
    """Status code and type name of a stopserve error."""
    for cls, status, name in STATUS:
        if isinstance(exc, cls):
            return status, name
    return 400, "bad_request"  # unreachable: StopServeError closes the table


def error_detail(exc: e.StopServeError) -> ErrorDetail:
    """The error body's detail for a stopserve error."""
    status, name = status_of(exc)
    issues = [
        ErrorIssue(field=i.path, message=i.message, file=i.file, line=i.line, trace_id=i.trace_id)
        for i in exc.issues
    ]
    return ErrorDetail(type=name, message=exc.message, status=status, issues=issues)


def error_response(
    status: int,
    kind: str,
    message: str,
    issues: Iterable[ErrorIssue] = (),
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """One JSON error response in the shared shape."""
    body = ErrorBody(error=ErrorDetail(type=kind, message=message, status=status, issues=list(issues)))
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


def _loc(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += str(part) if not out else f".{part}"
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def validation_issues(errors: Iterable[Mapping[str, Any]]) -> list[ErrorIssue]:
    """Pydantic/FastAPI errors as located issues (``body.events[0].t: ...``)."""
    out = []
    for err in errors:
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        value = err.get("input")
        if err.get("type") not in ("missing", "json_invalid") and not isinstance(value, dict | list):
            msg = f"{msg} (got {_short(value)})"
        out.append(ErrorIssue(field=_loc(err.get("loc", ())), message=msg))
    return out


def install_error_handlers(app: FastAPI) -> None:
    """Route every error through the one table and the one body."""

    async def stopserve_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, e.StopServeError)
        detail = error_detail(exc)
        headers = {"WWW-Authenticate": "Bearer"} if detail.status == 401 else None
        return JSONResponse(
            ErrorBody(error=detail).model_dump(mode="json"), status_code=detail.status, headers=headers
        )

    async def request_invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        issues = validation_issues(exc.errors())
        n = len(issues)
        return error_response(
            422, "validation_error", f"invalid request ({n} problem{'s' if n != 1 else ''})", issues
        )

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        status = exc.status_code
        kind = _HTTP_TYPES.get(status, "http_error")
        return error_response(status, kind, str(exc.detail), headers=dict(exc.headers or {}))

    async def internal(request: Request, exc: Exception) -> JSONResponse:
        return error_response(500, "internal_error", "internal error: the server logged it")

    app.add_exception_handler(e.StopServeError, stopserve_error)
    app.add_exception_handler(RequestValidationError, request_invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, internal)
