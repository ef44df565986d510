"""``POST /v1/hooks/claude-code``: Claude Code's HTTP hook, answered in process (docs/hooks.md)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from stopserve.error_table import openapi_responses
from stopserve.service.body import json_response
from stopserve.service.deps import get_hooks

__all__ = ["router"]

router = APIRouter(tags=["hooks"], responses=openapi_responses())


@router.post(
    "/v1/hooks/claude-code", summary="Claude Code's HTTP hook: the hook input in, the hook's answer out"
)
async def claude_code_hook(request: Request) -> Response:
    """The same decisions and reasons as `stopserve hook claude-code` (docs/hooks.md); `{}`: no answer."""
    return json_response(await get_hooks(request).handle(await request.body(), request.query_params))
