"""The FastAPI app: ``create_app(settings)``, and :func:`serve` (what ``stopserve serve`` runs).

``create_app`` builds the app: the lifespan (the engine starts, the model loads), the
error handlers (:mod:`stopserve.service.errors`), the two ASGI layers
(:mod:`stopserve.service.middleware`) and the routers of
:data:`stopserve.service.routes.ROUTERS`, one per resource, which only adapt HTTP to
:class:`~stopserve.service.engine.Engine`. Nothing happens at import time.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request, Response

from stopserve import __version__
from stopserve.errors import ConfigError, StopServeError
from stopserve.hooks.serve import HookEndpoint
from stopserve.service.body import TooManyInBodyError, document_bodies
from stopserve.service.engine import Engine, load_policy
from stopserve.service.errors import install_error_handlers
from stopserve.service.metrics import Metrics
from stopserve.service.middleware import BodyLimit, CountRejected
from stopserve.service.routes import ROUTERS
from stopserve.service.routes.ui import ui_router
from stopserve.settings import Settings, load_settings

__all__ = ["app_from_env", "check_store", "create_app", "serve"]

_log = logging.getLogger("stopserve.service")


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
    app.state.settings = settings
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
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(CountRejected)  # added last: the outermost, it sees every answer
    for router in ROUTERS:
        app.include_router(router)
    app.include_router(ui_router(settings))  # the live page (its routes read the settings)
    document_bodies(app)  # the request models the routes read themselves, into the components
    return app


def serve(
    *,
    model_dir: str | None = None,
    host: str | None = None,
    port: int | None = None,
    log_dir: str | None = None,
    workers: int | None = None,
    no_model: bool = False,
) -> int:
    """Run the service in uvicorn until it is stopped; what is given overrides the ``STOPSERVE_``
    settings. Checks the port, the shared store and the model first (a one-line error each)."""
    import uvicorn

    overrides: dict[str, Any] = {
        "model_dir": model_dir,
        "host": host,
        "port": port,
        "log_dir": log_dir,
        "workers": workers,
    }
    if no_model:
        overrides["no_model"] = True
    settings = load_settings(**overrides)
    if settings.workers > 1 and not settings.shared_store:
        where = "workers" if workers is not None else "STOPSERVE_WORKERS"
        raise ConfigError(
            f"{where} {settings.workers}: refused without a shared run store: a run's state (turn count, "
            "safety nets, events) would live in one process, and workers would each see part of a run's "
            "calls. Set STOPSERVE_STORE=redis://host:port/db (a shared run store) for several workers, "
            "or run one worker; or run several independent sidecars, each owning its own runs."
        )
    from stopserve.service.port import check_port

    check_port(settings.host, settings.port)  # before the model loads: a busy port is said at once
    if settings.shared_store:
        check_store(settings)
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


def check_store(settings: Settings) -> None:
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
