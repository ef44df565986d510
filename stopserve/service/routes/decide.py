"""``POST /v1/runs/{run_id}/decide``, ``/v1/decide``, ``/v1/decide:batch``: the hot path.

Plain ``async def`` routes that read their bodies themselves
(:func:`~stopserve.service.body.read_body`: count limits while the body streams in,
validation from bytes) and answer ``orjson`` bytes; the engine decides inline on the
event loop (CPU-bound, cheaper than a hop to a worker thread; only the wait for the
decision log is awaited).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from stopserve.api import (
    BatchDecideRequest,
    BatchDecideResponse,
    DecideRequest,
    DecideResponse,
    StatelessDecideRequest,
)
from stopserve.error_table import openapi_responses
from stopserve.service.body import body_doc, gone, json_response, read_body
from stopserve.service.deps import RUN_ID_PARAMETER, get_engine

__all__ = ["router"]

router = APIRouter(tags=["decide"], responses=openapi_responses())


@router.post(
    "/v1/runs/{run_id:path}/decide",
    response_model=DecideResponse,
    summary="Continue or stop this run? (the first call creates it)",
    openapi_extra=body_doc(DecideRequest, RUN_ID_PARAMETER),
)
async def decide(request: Request) -> Response:
    """Send the events since the last call; events already seen are ignored (safe retries)."""
    run_id: str = request.path_params["run_id"]
    body = await read_body(request, DecideRequest, run_id)
    return json_response(await get_engine(request).decide(run_id, body)) if body is not None else gone()


@router.post(
    "/v1/decide",
    response_model=DecideResponse,
    summary="Stateless: decide on a whole trace prefix",
    openapi_extra=body_doc(StatelessDecideRequest),
)
async def decide_stateless(request: Request) -> Response:
    """For callers that keep their own state; nothing is stored but the decision log line."""
    body = await read_body(request, StatelessDecideRequest)
    return json_response(await get_engine(request).decide_stateless(body)) if body is not None else gone()


@router.post(
    "/v1/decide:batch",
    response_model=BatchDecideResponse,
    summary="Decide for many runs in one request",
    openapi_extra=body_doc(BatchDecideRequest),
)
async def decide_batch(request: Request) -> Response:
    """Answers come in request order; a run's own error is reported in its slot."""
    body = await read_body(request, BatchDecideRequest)
    return json_response(await get_engine(request).decide_batch(body)) if body is not None else gone()
