"""``GET /ui``: the live page, the report's views over the service's own logs.

Behind the admin token (``STOPSERVE_ADMIN_TOKEN``): the page shows run ids, task ids and the
snippets users log, so it is off until a token is set, and then only for who holds it. A
script sends ``Authorization: Bearer TOKEN``; a browser opens ``/ui?token=TOKEN`` once, which
sets an HttpOnly, SameSite=Strict cookie (a keyed hash of the token, not the token) for
``/ui`` and redirects to the bare URL, so the token leaves the address bar.

The route only adapts: the page is :class:`stopserve.report.live.LiveLogs`, which reads
only what was appended to the logs since the last look (bounded work per request), in a
worker thread so the event loop keeps answering decide calls. One line includes it:
``app.include_router(ui_router(settings))``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from typing import Annotated, Final

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from stopserve.errors import AuthError, ConfigError
from stopserve.settings import Settings

__all__ = ["COOKIE", "ui_router"]

COOKIE: Final = "stopserve_ui"
_bearer = HTTPBearer(auto_error=False)
_Creds = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
#: The live page reloads itself this often (seconds).
REFRESH_S: Final = 15


def _cookie_value(token: str) -> str:
    return hmac.new(token.encode("utf-8"), b"stopserve live page", hashlib.sha256).hexdigest()


def ui_router(settings: Settings) -> APIRouter:
    """The live page's routes for an app built with ``settings`` (nothing is read until a look)."""
    from stopserve.report.live import LiveLogs

    router = APIRouter(tags=["ui"], include_in_schema=False)  # a page, not the API (docs/service.md)
    token = settings.admin_token.get_secret_value() if settings.admin_token is not None else ""
    live = (
        LiveLogs(settings.log_dir, model_store=settings.resolved_model_store())
        if settings.log_dir is not None
        else None
    )

    def authorize(request: Request, credentials: HTTPAuthorizationCredentials | None) -> None:
        if not token:
            raise AuthError("the live page is disabled: set STOPSERVE_ADMIN_TOKEN, then open /ui?token=...")
        if credentials is not None:
            if hmac.compare_digest(credentials.credentials.encode("utf-8"), token.encode("utf-8")):
                return
            raise AuthError("wrong bearer token")
        cookie = request.cookies.get(COOKIE, "")
        if not hmac.compare_digest(cookie.encode("utf-8"), _cookie_value(token).encode("utf-8")):
            raise AuthError("missing or wrong token: open /ui?token=STOPSERVE_ADMIN_TOKEN once")

    def extra() -> None:
        from stopserve.extras import require

        require("report", "plotly", "jinja2", what="the live page (GET /ui)")

    @router.get("/ui", response_class=HTMLResponse, summary="The live page (admin token)")
    async def page(request: Request, credentials: _Creds) -> Response:
        """The report's views over the service's logs, read by file offset (only what is new)."""
        given = request.query_params.get("token")
        if given is not None:
            if not token or not hmac.compare_digest(given.encode("utf-8"), token.encode("utf-8")):
                raise AuthError(
                    "wrong token" if token else "the live page is disabled: set STOPSERVE_ADMIN_TOKEN"
                )
            response = RedirectResponse("/ui", status_code=303)
            response.set_cookie(COOKIE, _cookie_value(token), httponly=True, samesite="strict", path="/ui")
            return response
        authorize(request, credentials)
        extra()
        if live is None:
            raise ConfigError(
                "the service runs without a log directory (STOPSERVE_LOG_DIR is empty): nothing to show"
            )
        html = await asyncio.to_thread(live.page, plotly_src="/ui/plotly.min.js", refresh_s=REFRESH_S)
        return HTMLResponse(html, headers={"cache-control": "no-store"})

    @router.get("/ui/plotly.min.js", summary="plotly.js for the live page (MIT licence)")
    async def plotly(request: Request, credentials: _Creds) -> Response:
        """plotly.js (the report's vendored basic bundle); cached by the browser, revalidated by ETag."""
        authorize(request, credentials)
        extra()
        from stopserve.report.views import plotly_js

        js = await asyncio.to_thread(plotly_js)
        etag = '"' + hashlib.sha256(js.encode()).hexdigest()[:16] + '"'
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers={"etag": etag})
        return Response(
            js,
            media_type="text/javascript",
            headers={"etag": etag, "cache-control": "private, max-age=86400"},
        )

    return router
