"""FastAPI's side of the error table: the exception handlers and the one error body.

Statuses and ``type`` strings come from :mod:`stopserve.error_table` (no FastAPI
there: the client reads it too). Every error response is
:class:`stopserve.api.ErrorBody`: a stable ``type``, a message, the status and
located issues (field, file, line, trace id). Request validation errors name the
field (``body.events[3].type``); a client's mistake is never a 500.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from stopserve import errors as e
from stopserve.api import ErrorBody, ErrorDetail, ErrorIssue
from stopserve.error_table import error_detail, http_type, to_wire_issue

__all__ = ["error_response", "install_error_handlers", "validation_issues"]


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


def validation_issues(errors: Iterable[Mapping[str, Any]]) -> list[ErrorIssue]:
    """Pydantic/FastAPI errors as located issues (``body.events[0].t: ...``)."""
    return [to_wire_issue(issue) for issue in e.pydantic_issues(errors)]


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
        return error_response(status, http_type(status), str(exc.detail), headers=dict(exc.headers or {}))

    async def internal(request: Request, exc: Exception) -> JSONResponse:
        return error_response(500, "internal_error", "internal error: the server logged it")

    app.add_exception_handler(e.StopServeError, stopserve_error)
    app.add_exception_handler(RequestValidationError, request_invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, internal)
