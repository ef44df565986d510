"""``/healthz``, ``/readyz``, ``/metrics``: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from stopserve.api import HealthResponse, ReadyResponse
from stopserve.service.deps import EngineDep
from stopserve.service.metrics import CONTENT_TYPE

__all__ = ["router"]

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthResponse)
def healthz() -> HealthResponse:
    """Liveness: the process answers."""
    return HealthResponse()


@router.get("/readyz", response_model=ReadyResponse, responses={503: {"model": ReadyResponse}})
def readyz(engine: EngineDep) -> JSONResponse:
    """Readiness; says when only the safety nets decide."""
    state = engine.ready()
    return JSONResponse(state.model_dump(mode="json"), status_code=200 if state.ready else 503)


@router.get("/metrics", response_class=Response)
def metrics(engine: EngineDep) -> Response:
    """Prometheus metrics."""
    engine.update_gauges()
    return Response(engine.metrics.render(), media_type=CONTENT_TYPE)
