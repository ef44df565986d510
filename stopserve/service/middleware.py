"""The app's two ASGI layers: the body size limit and the count of rejected requests.

Pure ASGI middleware (no ``BaseHTTPMiddleware``: it would copy every request), acting
on HTTP requests only; lifespan and the rest pass through.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException

from stopserve.service.errors import error_response

__all__ = ["BodyLimit", "CountRejected"]

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


class BodyLimit(_HttpLayer):
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


class CountRejected(_HttpLayer):
    """Count every response of status 400 or above in ``stopserve_rejected_requests``, by status.

    The outermost layer: it also sees the 413s of :class:`BodyLimit` and the errors
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
