"""Request bodies the routes read themselves, and the JSON answers they send.

The decide routes (and outcome) take the :class:`~fastapi.Request` and read the body
here (:func:`read_body`): bytes through the count-limited reader,
``Model.model_validate_json`` (no ``json.loads``, no dict walk), and an ``orjson``
:class:`~fastapi.Response` back (:func:`json_response`). A body that does not validate
raises the same ``RequestValidationError`` FastAPI raises for its own body routes
(``body.events[0].t``, ``path.run_id``), so errors go through the app's handlers.
Such a route documents its request model with the public ``openapi_extra``
(:func:`body_doc`), and :func:`document_bodies` adds the models to the schema's components.

Hostile bodies cost little: the body limit holds while the body streams in
(:mod:`stopserve.service.middleware`), and above :data:`SMALL_BODY` bytes the events
(and batch runs) are counted as they arrive (``ijson``, C parser, chunk by chunk), so a
body over the count limits is refused (413, connection closed) after the first few
thousand events, before any validation; a large body under the limits is validated in
a worker thread, not on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Final, TypeVar

import ijson
import orjson
from fastapi import FastAPI, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.models import OpenAPI
from pydantic import BaseModel, StringConstraints, TypeAdapter, ValidationError

from stopserve.api import BatchDecideRequest, DecideRequest, OutcomeRequest, StatelessDecideRequest
from stopserve.errors import Issue, RunLimitError
from stopserve.ids import RUN_ID_PATTERN

if TYPE_CHECKING:
    from stopserve.service.engine import Engine

__all__ = [
    "SMALL_BODY",
    "TooManyInBodyError",
    "body_doc",
    "document_bodies",
    "gone",
    "json_response",
    "parse_body",
    "read_and_parse",
    "read_body",
]

#: Bodies up to this size are validated inline on the event loop; larger ones in a worker thread.
SMALL_BODY: Final = 16 * 1024
#: Bytes counted in one go (about a millisecond of parsing); a large chunk is cut into slices.
_SLICE: Final = 16 * 1024

_run_id: Final[TypeAdapter[str]] = TypeAdapter(Annotated[str, StringConstraints(pattern=RUN_ID_PATTERN)])

_M = TypeVar("_M", bound=BaseModel)


class TooManyInBodyError(RunLimitError):
    """A body over a count limit, found while it was read: 413, and the connection is closed."""


def json_response(data: Any) -> Response:
    """``data`` as JSON bytes (orjson), no response-model re-validation."""
    return Response(orjson.dumps(data), media_type="application/json")


def gone() -> Response:
    """The answer to a client that went away while its body was read: nobody reads it."""
    return Response(status_code=400)


def _json_content(scope: MutableMapping[str, Any]) -> bool:
    """No Content-Type, or a JSON one (as FastAPI accepts: application/json, application/*+json)."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            mime: bytes = value.split(b";", 1)[0].strip().lower()
            return mime == b"application/json" or (
                mime.startswith(b"application/") and mime.endswith(b"+json")
            )
    return True


def _located(exc: ValidationError, *where: str) -> list[Any]:
    """pydantic's errors as FastAPI reports them: each ``loc`` under ``where`` (``body``, ``path.run_id``)."""
    return [{**err, "loc": (*where, *err["loc"])} for err in exc.errors(include_url=False)]


def parse_body(model: type[_M], raw: bytes, scope: MutableMapping[str, Any], errors: list[Any]) -> _M | None:
    """The body as ``model``, validated from bytes; problems are appended to ``errors`` (loc ``body...``)."""
    if raw and not _json_content(scope):
        msg = "Expected a JSON body (Content-Type: application/json)"
        errors.append({"type": "content_type", "loc": ("body",), "msg": msg, "input": None})
        return None
    return _validated(model, raw, errors)


def _validated(model: type[_M], raw: bytes, errors: list[Any]) -> _M | None:
    """:func:`parse_body` once the content type was checked."""
    if not raw:
        errors.append({"type": "missing", "loc": ("body",), "msg": "Field required", "input": None})
        return None
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors.extend(_located(exc, "body"))
        return None


@dataclass(frozen=True, slots=True)
class _CountLimit:
    prefix: str  # ijson path of the counted objects, e.g. "runs.item.events.item"
    limit: int
    field: str
    what: str


def _count_limits(model: type[BaseModel], engine: Engine) -> tuple[_CountLimit, ...]:
    s = engine.settings
    events = "events per request; send them in several calls"
    if model is BatchDecideRequest:
        return (
            _CountLimit("runs.item", s.max_batch_runs, "runs", "runs per batch"),
            _CountLimit("runs.item.events.item", s.max_events_per_request, "runs", events),
        )
    if model in (DecideRequest, StatelessDecideRequest, OutcomeRequest):
        return (_CountLimit("events.item", s.max_events_per_request, "events", events),)
    return ()


class _BodyCounter:
    """Counts the objects at a few JSON paths of a body as its chunks arrive (ijson, C parser).

    Raises :class:`TooManyInBodyError` as soon as a count passes its limit; stops counting
    (and lets validation report) if the bytes are not JSON.
    """

    def __init__(self, limits: Sequence[_CountLimit]) -> None:
        self.limits = limits
        self.counts = [0] * len(limits)
        self._tokens: Any = ijson.utils.sendable_list()
        self._parser: Any = ijson.parse_coro(self._tokens)
        self._broken = False

    async def feed(self, chunk: bytes) -> None:
        """Count ``chunk`` in small slices, letting other requests run between them."""
        if not self.limits:
            return
        for at in range(0, len(chunk), _SLICE):
            if self._broken:
                return
            try:
                self._parser.send(chunk[at : at + _SLICE])
            except ijson.JSONError:
                self._broken = True  # not JSON: validation says where; count what came before
            self._count()
            await asyncio.sleep(0)

    def _count(self) -> None:
        tokens = self._tokens
        for i, limit in enumerate(self.limits):
            self.counts[i] += tokens.count((limit.prefix, "start_map", None))
            if self.counts[i] > limit.limit:
                what = limit.what.split(";")[0].split(" per ")[0]
                raise TooManyInBodyError(
                    f"too many {what} in one request: more than {limit.limit} "
                    "(counted while reading; the rest was not read)",
                    [Issue(f"at most {limit.limit} {limit.what}", path=limit.field)],
                )
        del tokens[:]


async def read_and_parse(
    model: type[_M],
    scope: MutableMapping[str, Any],
    receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
    engine: Engine,
    errors: list[Any],
) -> tuple[bytes | None, _M | None]:
    """Read the body under its count limits, then validate it (in a worker thread when large).

    ``(None, None)`` when the client went away. A non-JSON content type is refused
    before the body is read.
    """
    if not _json_content(scope):
        msg = "Expected a JSON body (Content-Type: application/json)"
        errors.append({"type": "content_type", "loc": ("body",), "msg": msg, "input": None})
        return b"", None
    chunks: list[bytes] = []
    size = 0
    counter: _BodyCounter | None = None
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None, None
        chunk: bytes = message.get("body", b"")
        if chunk:
            chunks.append(chunk)
            size += len(chunk)
            if size > SMALL_BODY:
                # counted on the event loop, in slices with a yield between them: a worker
                # thread would trade the GIL with the loop and slow small requests more
                if counter is None:
                    counter = _BodyCounter(_count_limits(model, engine))
                    await counter.feed(b"".join(chunks))
                else:
                    await counter.feed(chunk)
        if not message.get("more_body", False):
            break
    raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if len(raw) <= SMALL_BODY:
        return raw, _validated(model, raw, errors)
    return raw, await engine.offload(parse_body, model, raw, scope, errors)


async def read_body(request: Request, model: type[_M], run_id: str | None = None) -> _M | None:
    """The request's body as ``model``: read under its count limits, validated from bytes.

    None when the client went away; a body (or ``run_id``, a path parameter) that does
    not validate raises the same ``RequestValidationError`` (``body.events[0].t``,
    ``path.run_id``) FastAPI raises for its own body routes, every problem in one.
    """
    errors: list[Any] = []
    if run_id is not None:
        try:
            _run_id.validate_python(run_id)
        except ValidationError as exc:
            errors.extend(_located(exc, "path", "run_id"))
    engine: Engine = request.app.state.engine
    raw, body = await read_and_parse(model, request.scope, request.receive, engine, errors)
    if errors:
        raise RequestValidationError(errors, body=raw)
    return body


async def read_optional(request: Request, model: type[_M]) -> _M | None:
    """A small JSON body as ``model``, or None when it is empty (a body FastAPI does not parse for us)."""
    raw = await request.body()
    if not raw.strip():
        return None
    return _required(request, model, raw)


async def read_required(request: Request, model: type[_M]) -> _M:
    """A small JSON body as ``model``; an empty one is refused like any missing field."""
    return _required(request, model, await request.body())


def _required(request: Request, model: type[_M], raw: bytes) -> _M:
    errors: list[Any] = []
    body = parse_body(model, raw, request.scope, errors)
    if errors or body is None:
        raise RequestValidationError(errors, body=raw)
    return body


#: Where a request model's schema sits in the OpenAPI document.
_SCHEMA_REF: Final = "#/components/schemas/{model}"
#: The models :func:`body_doc` documented, by name (their schemas go into the components).
_BY_REF: dict[str, type[BaseModel]] = {}


def body_doc(model: type[BaseModel], *parameters: dict[str, Any]) -> dict[str, Any]:
    """The ``openapi_extra`` of a route that reads ``model`` from its JSON body itself (by reference),
    and the path ``parameters`` it reads itself (e.g. ``deps.RUN_ID_PARAMETER``)."""
    ref = _SCHEMA_REF.format(model=model.__name__)
    _BY_REF[ref] = model
    doc: dict[str, Any] = {
        "requestBody": {"content": {"application/json": {"schema": {"$ref": ref}}}, "required": True}
    }
    if parameters:
        doc["parameters"] = list(parameters)
    return doc


def inline_body_doc(model: type[BaseModel], *, required: bool) -> dict[str, Any]:
    """The ``openapi_extra`` of a small body read by hand, its schema inline (the admin bodies)."""
    content = {"application/json": {"schema": model.model_json_schema()}}
    return {"requestBody": {"required": required, "content": content}}


def document_bodies(app: FastAPI) -> None:
    """Add the request models the app's routes document by reference (:func:`body_doc`) to its components.

    FastAPI's documented way to extend the schema: wrap ``app.openapi``, which builds
    the document once and caches it.
    """
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            used = {ref for ref in _body_refs(schema) if ref in _BY_REF}
            for model in [model for ref, model in _BY_REF.items() if ref in used]:
                doc = model.model_json_schema(ref_template=_SCHEMA_REF)
                for name, sub in doc.pop("$defs", {}).items():
                    components.setdefault(name, sub)
                components.setdefault(model.__name__, doc)
            # as FastAPI finishes its own document (numbers as the OpenAPI model types them, no nulls)
            app.openapi_schema = jsonable_encoder(
                OpenAPI.model_validate(schema), by_alias=True, exclude_none=True
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _body_refs(schema: dict[str, Any]) -> list[str]:
    """The ``$ref`` of every operation's request body in an OpenAPI document."""
    return [
        media.get("schema", {}).get("$ref", "")
        for operations in schema.get("paths", {}).values()
        for operation in operations.values()
        for media in operation.get("requestBody", {}).get("content", {}).values()
    ]
