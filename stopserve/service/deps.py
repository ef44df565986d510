"""What the routes depend on: the engine, the hook endpoint, the admin check, the run id.

Every route reaches the service through these FastAPI dependencies (``Depends``) or
the path parameters below; none holds state of its own. The admin check is one
dependency (:func:`require_admin`) the admin router declares once for all its routes.

Run paths: ``{run_id:path}`` takes any text, so that an id with a slash (``a%2Fb``)
is refused by its pattern (422 naming ``path.run_id``) rather than missed (404). The
run's own routes (``GET``/``DELETE /v1/runs/{run_id}``) use :data:`RUN_PATH`
instead, which never matches a path ending in one of :data:`RUN_ACTIONS`: those are
routes of their own (``.../decide``, ``.../outcome``, ``.../credit``), whatever order
the routers are included in. ``tests/service/test_service_routes.py`` checks that no two
routes of the app match the same path and method.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Any, Final

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.convertors import Convertor, register_url_convertor

from stopserve.errors import AuthError
from stopserve.hooks.serve import HookEndpoint
from stopserve.ids import RUN_ID_PATTERN
from stopserve.service.engine import Engine
from stopserve.settings import Settings

__all__ = [
    "RUN_ACTIONS",
    "RUN_ID_PARAMETER",
    "RUN_PATH",
    "EngineDep",
    "HooksDep",
    "RunId",
    "get_engine",
    "get_hooks",
    "require_admin",
]

#: The sub-resources of a run, each its own route ``/v1/runs/{run_id}/<action>``.
RUN_ACTIONS: Final = ("decide", "outcome", "credit")


class _RunPathConvertor(Convertor[str]):
    """A run id of the run's own routes: any text (slashes too), bar a path ending in ``/<action>``."""

    regex = r"[^/]*|.*/(?!(?:" + "|".join(RUN_ACTIONS) + r")$)[^/]*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


#: The path convertor name of the run's own routes: ``"/v1/runs/{run_id:" + RUN_PATH + "}"``.
RUN_PATH: Final = "run_path"
register_url_convertor(RUN_PATH, _RunPathConvertor())

_RUN_ID_DOC: Final = "The run's id (letters, digits, . _ : @ + -; at most 256, no '/'); it is the trace_id."
RunId = Annotated[str, Path(pattern=RUN_ID_PATTERN, description=_RUN_ID_DOC, examples=["run-42"])]
#: The same parameter as the routes that read it themselves document it (``openapi_extra``, as FastAPI
#: would from :data:`RunId`): the decide and outcome routes take it from ``request.path_params`` and
#: check it with their body (:func:`~stopserve.service.body.read_body`), so that a bad id and a bad
#: body are reported together, and no per-request parameter solving is paid on the hot path.
RUN_ID_PARAMETER: Final[dict[str, Any]] = {
    "name": "run_id",
    "in": "path",
    "required": True,
    "description": _RUN_ID_DOC,
    "schema": {
        "type": "string",
        "pattern": RUN_ID_PATTERN,
        "title": "Run Id",
        "description": _RUN_ID_DOC,
        "examples": ["run-42"],
    },
}


def get_engine(request: Request) -> Engine:
    """The app's engine (created by the lifespan)."""
    engine: Engine = request.app.state.engine
    return engine


def get_hooks(request: Request) -> HookEndpoint:
    """The app's Claude Code hook endpoint (created by the lifespan)."""
    hooks: HookEndpoint = request.app.state.hooks
    return hooks


EngineDep = Annotated[Engine, Depends(get_engine)]
HooksDep = Annotated[HookEndpoint, Depends(get_hooks)]

_bearer = HTTPBearer(auto_error=False, description="STOPSERVE_ADMIN_TOKEN")


def require_admin(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """The admin check: ``Authorization: Bearer $STOPSERVE_ADMIN_TOKEN``; off without a token.

    Resolved before the route runs, so a refused call's body is never read.
    """
    settings: Settings = request.app.state.settings
    token = settings.admin_token.get_secret_value() if settings.admin_token is not None else ""
    if not token:
        raise AuthError("admin endpoints are disabled: set STOPSERVE_ADMIN_TOKEN to enable them")
    given = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(given.encode("utf-8"), token.encode("utf-8")):
        raise AuthError("missing or wrong bearer token")
