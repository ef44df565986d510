"""``/v1/admin/...``: model reload and shadow challengers, behind the admin token.

Every route here depends on :func:`~stopserve.service.deps.require_admin`, declared
once on the router: FastAPI resolves it before the route runs, so without the token
nothing is parsed.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from starlette.concurrency import run_in_threadpool

from stopserve.api import ChallengerInfo, ChallengerRequest, ReloadRequest, ReloadResponse
from stopserve.error_table import openapi_responses
from stopserve.service.body import inline_body_doc, read_optional, read_required
from stopserve.service.deps import EngineDep, get_engine, require_admin

__all__ = ["router"]

router = APIRouter(tags=["admin"], responses=openapi_responses(), dependencies=[Depends(require_admin)])


@router.post(
    "/v1/admin/reload",
    response_model=ReloadResponse,
    openapi_extra=inline_body_doc(ReloadRequest, required=False),
)
async def reload(request: Request) -> ReloadResponse:
    """Load a model and swap it in atomically; a model failing its checks is refused.

    The token is checked before the body is read: without it, nothing is parsed.
    """
    body = await read_optional(request, ReloadRequest)
    engine = get_engine(request)
    return await run_in_threadpool(engine.reload, body.model_dir if body is not None else None)


@router.post(
    "/v1/admin/challengers",
    response_model=ChallengerInfo,
    openapi_extra=inline_body_doc(ChallengerRequest, required=True),
)
async def add_challenger(request: Request) -> ChallengerInfo:
    """Load a model directory as a shadow challenger: it decides on every live call, never acted on.

    Its decisions are logged next to the champion's (``challengers`` in decisions.jsonl);
    ``GET /v1/model`` and ``/metrics`` show how often it agrees and where it would stop.
    """
    body = await read_required(request, ChallengerRequest)
    return await run_in_threadpool(get_engine(request).add_challenger, body.model_dir, body.name)


@router.delete("/v1/admin/challengers/{name}", status_code=204)
def remove_challenger(name: str, engine: EngineDep) -> Response:
    """Stop a challenger deciding in the shadow."""
    engine.remove_challenger(name)
    return Response(status_code=204)
