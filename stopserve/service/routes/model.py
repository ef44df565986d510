"""``GET /v1/model``: the model served."""

from __future__ import annotations

from fastapi import APIRouter

from stopserve.api import ModelInfo
from stopserve.service.deps import EngineDep

__all__ = ["router"]

router = APIRouter(tags=["model"])


@router.get("/v1/model", response_model=ModelInfo)
def model(engine: EngineDep) -> ModelInfo:
    """The model served: kind, version, manifest and model card."""
    return engine.model_info()
