"""ASGI apps the serving benchmark starts, all the same way (``uvicorn --factory``).

- ``stopserve_app``: the real service, ``create_app(Settings(...))``, configured from
  ``BENCH_*`` variables (model, decision log on/off, fsync policy, run store).
- ``bare_app``: a bare FastAPI endpoint on the same path accepting the same JSON body
  and answering a decide-shaped constant: the framework's floor (``async def``);
  ``bare_sync_app``: the same with a ``def`` route, which FastAPI runs in a thread pool.
- ``bare_typed_app``: as ``bare_app``, with the body declared as
  ``stopserve.api.DecideRequest`` (the model stopserve parses), so the events are
  validated in both: the baseline the serving targets are computed against.
- ``fastpath_app``: the contender the service no longer ships (issue 16): ``stopserve_app``
  with the removed ASGI fast path in front of the router, answering the run decide call
  past FastAPI's routing (same body reading, same engine call, same answer; errors through
  the app's handlers). Measured beside the shipped routes in the same run.
- ``static_app``: a raw ASGI responder with a constant body: the ceiling of uvicorn on
  this machine, which shows how far the load generator is from being the bottleneck.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

# at module level: FastAPI resolves the route's (string) annotation in this module's globals
from stopserve.api import DecideRequest, DecideResponse

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: The answer the bare apps send: the API's documented example of a decision, as the service shapes it.
DECISION: dict[str, Any] = {
    **DecideResponse.model_json_schema()["examples"][0],
    "run_id": "run",
    "model_version": "bench",
    "events_accepted": 2,
}


def stopserve_app() -> Any:
    """The service as configured by BENCH_MODEL_DIR, BENCH_LOG_DIR ('' = off), BENCH_FSYNC."""
    from stopserve.service.app import create_app
    from stopserve.settings import Settings

    model = os.environ.get("BENCH_MODEL_DIR", "")
    log_dir = os.environ.get("BENCH_LOG_DIR", "")
    settings = Settings(
        model_dir=Path(model) if model else None,
        no_model=not model,
        log_dir=Path(log_dir) if log_dir else None,
        fsync=os.environ.get("BENCH_FSYNC", "interval"),
        store=os.environ.get("BENCH_STORE") or None,
        log_level="warning",
    )
    return create_app(settings)


def fastpath_app() -> Any:
    """:func:`stopserve_app` with the ASGI fast path the service had before issue 16, innermost.

    Only the run decide call (the one ``decide.lua`` sends) takes the fast path; the rest
    goes on to the shipped routes. ``user_middleware`` is outermost first: appended, it sits
    inside the body limit, where the service had it.
    """
    import re

    import orjson
    from starlette.middleware import Middleware
    from starlette.requests import Request

    from stopserve.ids import RUN_ID_PATTERN
    from stopserve.service.body import read_and_parse

    run_id_re = re.compile(RUN_ID_PATTERN)

    class FastDecide:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and scope["method"] == "POST":
                path: str = scope["path"]
                if (
                    path.startswith("/v1/runs/")
                    and path.endswith("/decide")
                    and run_id_re.fullmatch(path[9:-7])
                ):
                    await self.serve(path[9:-7], scope, receive, send)
                    return
            await self.app(scope, receive, send)

        async def serve(self, run_id: str, scope: Scope, receive: Receive, send: Send) -> None:
            from fastapi.exceptions import RequestValidationError

            app = scope["app"]
            try:
                engine = app.state.engine
                errors: list[Any] = []
                raw, body = await read_and_parse(DecideRequest, scope, receive, engine, errors)
                if raw is None:
                    return
                if errors or body is None:
                    raise RequestValidationError(errors, body=raw)
                payload = orjson.dumps(await engine.decide(run_id, body))
            except Exception as exc:
                mro = type(exc).__mro__
                for cls in mro[: mro.index(Exception)]:  # the app's handler, bar the catch-all
                    if cls in app.exception_handlers:
                        response = await app.exception_handlers[cls](Request(scope, receive), exc)
                        await response(scope, receive, send)
                        return
                raise
            headers = [
                (b"content-length", str(len(payload)).encode()),
                (b"content-type", b"application/json"),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": payload})

    app = stopserve_app()
    app.user_middleware.append(Middleware(FastDecide))
    return app


def bare_app() -> Any:
    """FastAPI, one route, same path and body, a constant decide-shaped answer."""
    from fastapi import Body, FastAPI

    app = FastAPI()

    @app.post("/v1/runs/{run_id}/decide")
    async def decide(run_id: str, body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
        return {**DECISION, "run_id": run_id, "events_accepted": len(body.get("events", ()))}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def bare_typed_app() -> Any:
    """As :func:`bare_app`, the body declared as ``DecideRequest``: FastAPI validates the events."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/v1/runs/{run_id}/decide")
    async def decide(run_id: str, body: DecideRequest) -> dict[str, Any]:
        return {**DECISION, "run_id": run_id, "events_accepted": len(body.events)}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def bare_sync_app() -> Any:
    """As :func:`bare_app`, with a plain ``def`` route: FastAPI runs it in its worker thread pool."""
    from fastapi import Body, FastAPI

    app = FastAPI()

    @app.post("/v1/runs/{run_id}/decide")
    def decide(run_id: str, body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
        return {**DECISION, "run_id": run_id, "events_accepted": len(body.get("events", ()))}

    return app


_STATIC_BODY = b'{"action":"continue","finalize":false}'


def static_app() -> Any:
    """Raw ASGI: drain the request, answer a constant. No framework."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        more = True
        while more:
            msg = await receive()
            more = bool(msg.get("more_body"))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": _STATIC_BODY})

    return app
