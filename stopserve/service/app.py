"""The FastAPI app: ``create_app(settings)`` and the ``stopserve serve`` command.

Routes only adapt HTTP to :class:`~stopserve.service.engine.Engine`: parse,
call, serialise. Nothing happens at import time; the model loads in the lifespan.

The decide calls are the hot path, served by plain ``async def`` FastAPI routes
that take the :class:`~fastapi.Request` and read the body themselves (``_body``):
bytes through the count-limited reader, ``Model.model_validate_json`` (no
``json.loads``, no dict walk), the engine's coroutine deciding inline on the event
loop (CPU-bound, cheaper than a hop to a worker thread; only the wait for the
decision log is awaited) and an ``orjson`` :class:`~fastapi.Response`. Errors go
through the app's exception handlers like any route's; the request models are
documented with the public ``openapi_extra`` and added to the schema's components
(``_document_bodies``). Issue 16 measured these routes against the ASGI fast path
they replaced (``bench/bench_serve.py``, bench/RESULTS.md). The other routes are
plain ``def`` functions in the thread pool.

Hostile bodies cost little: the body limit holds while the body streams in, and
above :data:`SMALL_BODY` bytes the events (and batch runs) are counted as they
arrive (``ijson``, C parser, chunk by chunk), so a body over the count limits is
refused (413, connection closed) after the first few thousand events, before any
validation; a large body under the limits is validated and folded in a worker
thread, not on the event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hmac
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, TypeVar

import ijson
import orjson
from fastapi import Depends, FastAPI, Path, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.models import OpenAPI
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, StringConstraints, TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from stopserve import __version__
from stopserve.api import (
    MAX_INT,
    MAX_NUMBER,
    BatchDecideRequest,
    BatchDecideResponse,
    ChallengerInfo,
    ChallengerRequest,
    CreditResponse,
    DecideRequest,
    DecideResponse,
    HealthResponse,
    ModelInfo,
    OutcomeRequest,
    OutcomeResponse,
    ReadyResponse,
    ReloadRequest,
    ReloadResponse,
    RunInfo,
    StatelessDecideRequest,
)
from stopserve.error_table import openapi_responses
from stopserve.errors import AuthError, ConfigError, Issue, RunLimitError, StopServeError
from stopserve.hooks.serve import HookEndpoint
from stopserve.ids import RUN_ID_PATTERN
from stopserve.service.engine import Engine, load_policy
from stopserve.service.errors import error_response, install_error_handlers
from stopserve.service.metrics import CONTENT_TYPE, Metrics
from stopserve.service.routes.ui import ui_router
from stopserve.settings import Settings, load_settings

__all__ = ["app_from_env", "create_app", "serve_command"]

_log = logging.getLogger("stopserve.service")

#: Bodies up to this size are validated inline on the event loop; larger ones in a worker thread.
SMALL_BODY: Final = 16 * 1024

_RUN_ID_DOC: Final = "The run's id (letters, digits, . _ : @ + -; at most 256, no '/'); it is the trace_id."
RunId = Annotated[str, Path(pattern=RUN_ID_PATTERN, description=_RUN_ID_DOC, examples=["run-42"])]
#: The same parameter, documented alike, checked by the route (:func:`_body`) rather than by FastAPI,
#: so that a bad id and a bad body are reported together, as for any FastAPI body route.
RunIdOfBody = Annotated[
    str, Path(description=_RUN_ID_DOC, examples=["run-42"], json_schema_extra={"pattern": RUN_ID_PATTERN})
]
_run_id: Final[TypeAdapter[str]] = TypeAdapter(Annotated[str, StringConstraints(pattern=RUN_ID_PATTERN)])

#: Every error a route may answer, from the one table (status -> body and ``type`` strings).
_ERRORS: Final = openapi_responses()

_bearer = HTTPBearer(auto_error=False, description="STOPSERVE_ADMIN_TOKEN")


_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class _HttpLayer:
    """A pure ASGI middleware that acts on HTTP requests only (lifespan and the rest pass)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        """Handle one HTTP request."""
        raise NotImplementedError


class _BodyLimit(_HttpLayer):
    """Refuse request bodies above ``max_bytes`` (declared or streamed) with a 413."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    async def http(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        limit = self.max_bytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit:
                    response = error_response(
                        413, "payload_too_large", f"request body of {declared} bytes exceeds {limit} bytes"
                    )
                    await response(scope, receive, send)
                    return
        seen = 0

        async def limited() -> MutableMapping[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise StarletteHTTPException(413, f"request body exceeds {limit} bytes")
            return message

        await self.app(scope, limited, send)


class _CountRejected(_HttpLayer):
    """Count every response of status 400 or above in ``stopserve_rejected_requests``, by status.

    The outermost layer: it also sees the 413s of :class:`_BodyLimit` and the errors
    FastAPI answers itself (404, 405, 422), not only those the engine raises.
    """

    async def http(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        async def counted(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                engine = getattr(scope["app"].state, "engine", None)
                if engine is not None:
                    engine.metrics.count_rejected(message["status"])
            await send(message)

        await self.app(scope, receive, counted)


_M = TypeVar("_M", bound=BaseModel)


def _parse_body(model: type[_M], raw: bytes, scope: MutableMapping[str, Any], errors: list[Any]) -> _M | None:
    """The body as ``model``, validated from bytes; problems are appended to ``errors`` (loc ``body...``)."""
    if not raw:
        errors.append({"type": "missing", "loc": ("body",), "msg": "Field required", "input": None})
        return None
    if not _json_content(scope):
        msg = "Expected a JSON body (Content-Type: application/json)"
        errors.append({"type": "content_type", "loc": ("body",), "msg": msg, "input": None})
        return None
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors.extend(_located(exc, "body"))
        return None


def _located(exc: ValidationError, *where: str) -> list[Any]:
    """pydantic's errors as FastAPI reports them: each ``loc`` under ``where`` (``body``, ``path.run_id``)."""
    return [{**err, "loc": (*where, *err["loc"])} for err in exc.errors(include_url=False)]


class TooManyInBodyError(RunLimitError):
    """A body over a count limit, found while it was read: 413, and the connection is closed."""


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


#: Bytes counted in one go (about a millisecond of parsing); a large chunk is cut into slices.
_SLICE: Final = 16 * 1024


async def _read_and_parse(
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
    limits = _count_limits(model, engine)
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
            if limits and size > SMALL_BODY:
                # counted on the event loop, in slices with a yield between them: a worker
                # thread would trade the GIL with the loop and slow small requests more
                if counter is None:
                    counter = _BodyCounter(limits)
                    await counter.feed(b"".join(chunks))
                else:
                    await counter.feed(chunk)
        if not message.get("more_body", False):
            break
    raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if len(raw) <= SMALL_BODY:
        return raw, _parse_body(model, raw, scope, errors)
    return raw, await engine.offload(_parse_body, model, raw, scope, errors)


async def _body(request: Request, model: type[_M], run_id: str | None = None) -> _M | None:
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
    raw, body = await _read_and_parse(model, request.scope, request.receive, _engine(request), errors)
    if errors:
        raise RequestValidationError(errors, body=raw)
    return body


def _gone() -> Response:
    return Response(status_code=400)  # the client went away: nobody reads this


#: Where a request model's schema sits in the OpenAPI document.
_SCHEMA_REF: Final = "#/components/schemas/{model}"


def _body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """The ``openapi_extra`` of a route that reads ``model`` from its JSON body itself."""
    ref = _SCHEMA_REF.format(model=model.__name__)
    return {"requestBody": {"content": {"application/json": {"schema": {"$ref": ref}}}, "required": True}}


def _document_bodies(app: FastAPI, models: Sequence[type[BaseModel]]) -> None:
    """Add ``models`` (and the models they use) to the app's OpenAPI components.

    FastAPI's documented way to extend the schema: wrap ``app.openapi``, which builds
    the document once and caches it.
    """
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
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


def _json_content(scope: MutableMapping[str, Any]) -> bool:
    """No Content-Type, or a JSON one (as FastAPI accepts: application/json, application/*+json)."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            mime: bytes = value.split(b";", 1)[0].strip().lower()
            return mime == b"application/json" or (
                mime.startswith(b"application/") and mime.endswith(b"+json")
            )
    return True


def _json(data: Any) -> Response:
    return Response(orjson.dumps(data), media_type="application/json")


def _engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


EngineDep = Annotated[Engine, Depends(_engine)]


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the service app; the model loads and the logs open when it starts."""
    settings = settings if settings is not None else Settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = Engine(settings, Metrics())
        await asyncio.to_thread(engine.start)
        # what exists now (modules, the model) lives as long as the process: keep it out
        # of the garbage collector's full collections, whose pauses are the p99 tail
        gc.collect()
        gc.freeze()
        app.state.engine = engine
        app.state.hooks = HookEndpoint(settings.hook_state_dir, engine.decide_body)

        async def ticker() -> None:
            period = min(settings.fsync_interval_s, 5.0)
            while True:
                await asyncio.sleep(period)
                await asyncio.to_thread(engine.tick)

        task = asyncio.create_task(ticker())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await engine.aclose()
            engine.close()

    app = FastAPI(
        title="stopserve",
        version=__version__,
        summary="Continue or stop? Learned stop decisions for multi-agent LLM runs, with safety nets.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    generic = app.exception_handlers[StopServeError]

    async def too_many(request: Request, exc: Exception) -> Response:
        # the rest of the body was not read: close the connection rather than drain it
        response = generic(request, exc)
        if not isinstance(response, Response):
            response = await response
        response.headers["connection"] = "close"
        return response

    app.add_exception_handler(TooManyInBodyError, too_many)
    if settings.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"], allow_headers=["*"]
        )
    app.add_middleware(_BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(_CountRejected)  # added last: the outermost, it sees every answer

    # the decide routes (and outcome) read their bodies themselves (count limits while the body
    # streams in, validation from bytes): their request models are documented by reference
    _document_bodies(app, (DecideRequest, StatelessDecideRequest, BatchDecideRequest, OutcomeRequest))

    @app.post(
        "/v1/runs/{run_id:path}/decide",
        response_model=DecideResponse,
        responses=_ERRORS,
        tags=["decide"],
        summary="Continue or stop this run? (the first call creates it)",
        openapi_extra=_body_doc(DecideRequest),
    )
    async def decide(request: Request, run_id: RunIdOfBody) -> Response:
        """Send the events since the last call; events already seen are ignored (safe retries)."""
        body = await _body(request, DecideRequest, run_id)
        return _json(await _engine(request).decide(run_id, body)) if body is not None else _gone()

    @app.post(
        "/v1/decide",
        response_model=DecideResponse,
        responses=_ERRORS,
        tags=["decide"],
        summary="Stateless: decide on a whole trace prefix",
        openapi_extra=_body_doc(StatelessDecideRequest),
    )
    async def decide_stateless(request: Request) -> Response:
        """For callers that keep their own state; nothing is stored but the decision log line."""
        body = await _body(request, StatelessDecideRequest)
        return _json(await _engine(request).decide_stateless(body)) if body is not None else _gone()

    @app.post(
        "/v1/decide:batch",
        response_model=BatchDecideResponse,
        responses=_ERRORS,
        tags=["decide"],
        summary="Decide for many runs in one request",
        openapi_extra=_body_doc(BatchDecideRequest),
    )
    async def decide_batch(request: Request) -> Response:
        """Answers come in request order; a run's own error is reported in its slot."""
        body = await _body(request, BatchDecideRequest)
        return _json(await _engine(request).decide_batch(body)) if body is not None else _gone()

    @app.post(
        "/v1/runs/{run_id:path}/outcome",
        response_model=OutcomeResponse,
        responses=_ERRORS,
        tags=["runs"],
        summary="Post the final rewards: closes the run and logs its trace",
        openapi_extra=_body_doc(OutcomeRequest),
    )
    async def outcome(request: Request, run_id: RunIdOfBody) -> Response:
        """The complete trace (events, decisions, outcome) goes to ``traces.jsonl``, format v1."""
        body = await _body(request, OutcomeRequest, run_id)
        if body is None:
            return _gone()
        done = await run_in_threadpool(_engine(request).outcome, run_id, body)
        return _json(done.model_dump(mode="json"))

    @app.post(
        "/v1/hooks/claude-code",
        responses=_ERRORS,
        tags=["hooks"],
        summary="Claude Code's HTTP hook: the hook input in, the hook's answer out",
    )
    async def claude_code_hook(request: Request) -> Response:
        """The same decisions and reasons as `stopserve hook claude-code` (docs/hooks.md); `{}`: no answer."""
        hooks: HookEndpoint = request.app.state.hooks
        return _json(await hooks.handle(await request.body(), request.query_params))

    # before the run routes: their {run_id:path} would take "x/decide" as an id and answer 422
    @app.api_route(
        "/v1/runs/{run_id:path}/decide", methods=["GET", "HEAD", "DELETE"], include_in_schema=False
    )
    @app.api_route(
        "/v1/runs/{run_id:path}/outcome", methods=["GET", "HEAD", "DELETE"], include_in_schema=False
    )
    def post_only() -> Response:
        raise StarletteHTTPException(405, headers={"Allow": "POST"})

    # before the run route: its {run_id:path} would take ".../credit" as an id (and refuse it)
    @app.get(
        "/v1/runs/{run_id:path}/credit",
        response_model=CreditResponse,
        responses=_ERRORS,
        tags=["runs"],
        summary="Message-level credit of a live run's events, from the served model's value",
    )
    def run_credit(
        run_id: RunId,
        engine: EngineDep,
        *,
        method: Literal["td", "ablation"] = "td",
        split: Literal["tokens", "equal"] = "tokens",
        window: Literal["decision", "reward"] = "decision",
        baseline: Literal["zero", "model"] = "zero",
        lam: Annotated[float | None, Query(alias="lambda", ge=0, le=MAX_NUMBER)] = None,
        cost_share: Annotated[float | None, Query(ge=0, le=100)] = None,
        types: Annotated[str | None, Query(description="ablation: comma list of event types")] = None,
        last_k: Annotated[int | None, Query(ge=1, le=MAX_INT, description="ablation: last K points")] = None,
    ) -> Response:
        """What each event did to the run's value so far: TD or ablation credit (docs/credit.md)."""
        kinds = [t.strip() for t in types.split(",") if t.strip()] if types is not None else None
        return _json(
            engine.credit(
                run_id,
                method=method,
                split=split,
                window=window,
                baseline=baseline,
                lam=lam,
                cost_share=cost_share,
                types=kinds,
                last_k=last_k,
            )
        )

    @app.get("/v1/runs/{run_id:path}", response_model=RunInfo, responses=_ERRORS, tags=["runs"])
    def get_run(run_id: RunId, engine: EngineDep) -> RunInfo:
        """State and current features of a live run (for debugging)."""
        return engine.run_info(run_id)

    @app.delete("/v1/runs/{run_id:path}", status_code=204, responses=_ERRORS, tags=["runs"])
    def delete_run(run_id: RunId, engine: EngineDep) -> Response:
        """Forget a live run without logging its trace."""
        engine.delete(run_id)
        return Response(status_code=204)

    @app.get("/v1/model", response_model=ModelInfo, tags=["model"])
    def model(engine: EngineDep) -> ModelInfo:
        """The model served: kind, version, manifest and model card."""
        return engine.model_info()

    reload_body = {"content": {"application/json": {"schema": ReloadRequest.model_json_schema()}}}

    @app.post(
        "/v1/admin/reload",
        response_model=ReloadResponse,
        responses=_ERRORS,
        tags=["admin"],
        openapi_extra={"requestBody": {"required": False, **reload_body}},
    )
    async def reload(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> ReloadResponse:
        """Load a model and swap it in atomically; a model failing its checks is refused.

        The token is checked before the body is read: without it, nothing is parsed.
        """
        _authorize(settings, credentials)
        raw = await request.body()
        body: ReloadRequest | None = None
        if raw.strip():
            errors: list[Any] = []
            body = _parse_body(ReloadRequest, raw, request.scope, errors)
            if errors:
                raise RequestValidationError(errors, body=raw)
        engine = _engine(request)
        return await run_in_threadpool(engine.reload, body.model_dir if body is not None else None)

    challenger_body = {"content": {"application/json": {"schema": ChallengerRequest.model_json_schema()}}}

    @app.post(
        "/v1/admin/challengers",
        response_model=ChallengerInfo,
        responses=_ERRORS,
        tags=["admin"],
        openapi_extra={"requestBody": {"required": True, **challenger_body}},
    )
    async def add_challenger(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> ChallengerInfo:
        """Load a model directory as a shadow challenger: it decides on every live call, never acted on.

        Its decisions are logged next to the champion's (``challengers`` in decisions.jsonl);
        ``GET /v1/model`` and ``/metrics`` show how often it agrees and where it would stop.
        """
        _authorize(settings, credentials)
        raw = await request.body()
        errors: list[Any] = []
        body = _parse_body(ChallengerRequest, raw, request.scope, errors)
        if errors or body is None:
            raise RequestValidationError(errors, body=raw)
        return await run_in_threadpool(_engine(request).add_challenger, body.model_dir, body.name)

    @app.delete("/v1/admin/challengers/{name}", status_code=204, responses=_ERRORS, tags=["admin"])
    def remove_challenger(
        name: str,
        engine: EngineDep,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> Response:
        """Stop a challenger deciding in the shadow."""
        _authorize(settings, credentials)
        engine.remove_challenger(name)
        return Response(status_code=204)

    @app.get("/healthz", response_model=HealthResponse, tags=["health"])
    def healthz() -> HealthResponse:
        """Liveness: the process answers."""
        return HealthResponse()

    @app.get(
        "/readyz", response_model=ReadyResponse, responses={503: {"model": ReadyResponse}}, tags=["health"]
    )
    def readyz(engine: EngineDep) -> JSONResponse:
        """Readiness; says when only the safety nets decide."""
        state = engine.ready()
        return JSONResponse(state.model_dump(mode="json"), status_code=200 if state.ready else 503)

    @app.get("/metrics", tags=["health"], response_class=Response)
    def metrics(engine: EngineDep) -> Response:
        """Prometheus metrics."""
        engine.update_gauges()
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE)

    app.include_router(ui_router(settings))
    return app


def _authorize(settings: Settings, credentials: HTTPAuthorizationCredentials | None) -> None:
    token = settings.admin_token.get_secret_value() if settings.admin_token is not None else ""
    if not token:
        raise AuthError("admin endpoints are disabled: set STOPSERVE_ADMIN_TOKEN to enable them")
    given = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(given.encode("utf-8"), token.encode("utf-8")):
        raise AuthError("missing or wrong bearer token")


def serve_command(args: argparse.Namespace) -> int:
    """``stopserve serve``: options override STOPSERVE_ settings; runs uvicorn."""
    import uvicorn

    overrides: dict[str, Any] = {
        "model_dir": getattr(args, "model", None),
        "host": getattr(args, "host", None),
        "port": getattr(args, "port", None),
        "log_dir": getattr(args, "log_dir", None),
        "workers": getattr(args, "workers", None),
    }
    if getattr(args, "no_model", False):
        overrides["no_model"] = True
    settings = load_settings(**overrides)
    if settings.workers > 1 and not settings.shared_store:
        where = "--workers" if overrides["workers"] is not None else "STOPSERVE_WORKERS"
        raise ConfigError(
            f"{where} {settings.workers}: refused without a shared run store: a run's state (turn count, "
            "safety nets, events) would live in one process, and workers would each see part of a run's "
            "calls. Set STOPSERVE_STORE=redis://host:port/db (a shared run store) for several workers, "
            "or run one worker; or run several independent sidecars, each owning its own runs."
        )
    from stopserve.service.port import check_port

    check_port(settings.host, settings.port)  # before the model loads: a busy port is said at once
    if settings.shared_store:
        _check_store(settings)
    path = settings.resolved_model_dir()
    # check the model now, so a bad one is a one-line CLI error rather than a worker traceback
    if path is not None:
        if not path.exists():
            from stopserve.errors import ModelNotFoundError

            raise ModelNotFoundError(f"{path}: no such model directory")
        load_policy(path)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    print(
        f"stopserve {__version__}: serving {'model ' + str(path) if path else 'safety nets only (no model)'} "
        f"on http://{settings.host}:{settings.port}",
        flush=True,
    )
    # a worker thread validating a large body hands the GIL back to the event loop within 1 ms
    # (the default 5 ms would be the p99 of every small request meanwhile)
    sys.setswitchinterval(0.001)
    if settings.workers > 1:
        # each worker process builds its app from the environment: the options go there too
        for name, value in overrides.items():
            if value is not None:
                os.environ[f"STOPSERVE_{name.upper()}"] = str(value).lower() if value is True else str(value)
        uvicorn.run(
            "stopserve.service.app:app_from_env",
            factory=True,
            workers=settings.workers,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            access_log=settings.access_log,
        )
        return 0
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.access_log,
    )
    return 0


def app_from_env() -> FastAPI:
    """The app of one ``--workers`` process: settings from the ``STOPSERVE_`` environment."""
    settings = load_settings()
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    sys.setswitchinterval(0.001)
    return create_app(settings)


def _check_store(settings: Settings) -> None:
    """Reach the shared run store now: an unreachable one is a one-line error, not a worker traceback."""
    from stopserve.service.store import StoreUnavailableError
    from stopserve.service.stores import open_store

    store = open_store(settings, load_safety=dict)
    try:
        store.ping()
    except StoreUnavailableError as exc:
        raise ConfigError(f"STOPSERVE_STORE: {exc}") from None
    finally:
        store.close_store()
