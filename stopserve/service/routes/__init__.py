"""The HTTP routes, one :class:`fastapi.APIRouter` per resource; :data:`ROUTERS` is what the app includes.

Each route only adapts: it parses (FastAPI's parameters, or
:func:`stopserve.service.body.read_body` for the bodies the service reads itself),
calls the engine (:func:`stopserve.service.deps.get_engine`) and serialises. No two
routes match the same path and method (``tests/service/test_service_routes.py``), so
the order of :data:`ROUTERS` does not matter: adding a resource is one more entry.
"""

from __future__ import annotations

from typing import Final

from fastapi import APIRouter

from stopserve.service.routes import admin, decide, health, hooks, model, runs

__all__ = ["ROUTERS"]

#: Every router of the service, in the order the OpenAPI document lists them.
ROUTERS: Final[tuple[APIRouter, ...]] = (
    decide.router,
    runs.router,
    hooks.router,
    model.router,
    admin.router,
    health.router,
)
