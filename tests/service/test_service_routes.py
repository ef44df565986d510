"""The HTTP layer's shape: routers per resource, no two routes for one path, the admin check once."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from test_service_app import TOKEN, make_client, turn_events

from stopserve.service.app import create_app
from stopserve.service.deps import RUN_ACTIONS, require_admin
from stopserve.service.routes import ROUTERS, admin
from stopserve.settings import Settings

#: The operations of the OpenAPI document as they were before the routers (create_app's closures).
OPERATIONS = {
    ("/healthz", "get"),
    ("/metrics", "get"),
    ("/readyz", "get"),
    ("/v1/admin/challengers", "post"),
    ("/v1/admin/challengers/{name}", "delete"),
    ("/v1/admin/reload", "post"),
    ("/v1/decide", "post"),
    ("/v1/decide:batch", "post"),
    ("/v1/hooks/claude-code", "post"),
    ("/v1/model", "get"),
    ("/v1/runs/{run_id}", "delete"),
    ("/v1/runs/{run_id}", "get"),
    ("/v1/runs/{run_id}/credit", "get"),
    ("/v1/runs/{run_id}/decide", "post"),
    ("/v1/runs/{run_id}/outcome", "post"),
}

#: Values a path parameter is tried with: plain ids, a run named after an action, a slashed id.
SAMPLES = ("x", "run-42", *RUN_ACTIONS, "a/b")


def routes() -> list[APIRoute]:
    return [r for router in ROUTERS for r in router.routes if isinstance(r, APIRoute)]


def sample_paths(route: APIRoute) -> list[str]:
    names = re.findall(r"{([^}:]+)[^}]*}", route.path)
    paths = []
    for values in itertools.product(SAMPLES, repeat=len(names)):
        path = route.path
        for name, value in zip(names, values, strict=True):
            path = re.sub("{" + name + "[^}]*}", value, path, count=1)
        paths.append(path)
    return paths


def test_the_openapi_document_has_the_same_operations() -> None:
    spec = create_app(Settings(no_model=True, log_dir=None)).openapi()
    assert {(p, m) for p, ops in spec["paths"].items() for m in ops} == OPERATIONS


def test_no_two_routes_take_the_same_path_and_method() -> None:
    """Route order cannot matter: no route matches a path another route of the same method is for."""
    found = routes()
    assert len(found) >= len(OPERATIONS)
    for mine, other in itertools.permutations(found, 2):
        if not mine.methods & other.methods:
            continue
        for path in sample_paths(mine):
            if mine.path_regex.fullmatch(path):
                assert not other.path_regex.fullmatch(path), (path, mine.path, other.path)


def test_the_check_above_finds_a_shadowing_route() -> None:
    """The old patterns, ``/v1/runs/{run_id:path}`` beside ``.../credit``, are caught (the test can fail)."""
    app = FastAPI()

    @app.get("/v1/runs/{run_id:path}/credit")
    def credit() -> None: ...

    @app.get("/v1/runs/{run_id:path}")
    def get_run() -> None: ...

    a, b = (r for r in app.router.routes if isinstance(r, APIRoute))
    assert b.path_regex.fullmatch(sample_paths(a)[0])


@pytest.mark.parametrize("order", [ROUTERS, tuple(reversed(ROUTERS))], ids=["as shipped", "reversed"])
def test_the_answers_do_not_depend_on_the_router_order(order: tuple[object, ...], tmp_path: Path) -> None:
    import stopserve.service.app as app_module

    original = app_module.ROUTERS
    app_module.ROUTERS = order  # type: ignore[assignment]
    try:
        with make_client(tmp_path) as c:
            assert c.post("/v1/runs/r1/decide", json={"events": turn_events(0)}).status_code == 200
            # the credit route answers (with no model: it says credit needs one), not the run's own route
            assert c.get("/v1/runs/r1/credit").json()["error"]["type"] == "model_error"
            assert c.get("/v1/runs/r1").json()["run_id"] == "r1"
            assert c.get("/v1/runs/decide").json()["error"]["type"] == "run_not_found"  # a run named so
            assert c.get("/v1/runs/r1/decide").status_code == 405
            assert c.delete("/v1/runs/r1/outcome").status_code == 405
            assert c.get("/v1/runs/a%2Fb").status_code == 422  # a slashed id is refused by its pattern
            assert c.delete("/v1/runs/r1").status_code == 204
    finally:
        app_module.ROUTERS = original


def test_every_admin_route_depends_on_the_admin_check(tmp_path: Path) -> None:
    assert admin.router.routes
    for route in admin.router.routes:
        assert isinstance(route, APIRoute)
        assert require_admin in [d.call for d in route.dependant.dependencies], route.path
    with make_client(tmp_path, admin_token=TOKEN) as c:
        # refused before the body is read: a broken body without the token is a 401, not a 422
        for path in ("/v1/admin/reload", "/v1/admin/challengers"):
            r = c.post(path, content=b"{not json", headers={"Content-Type": "application/json"})
            assert r.status_code == 401, (path, r.text)
            assert r.json()["error"]["type"] == "unauthorized"
        assert c.delete("/v1/admin/challengers/x").status_code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        r = c.post(
            "/v1/admin/challengers",
            content=b"{not json",
            headers={**auth, "Content-Type": "application/json"},
        )
        assert r.status_code == 422 and r.json()["error"]["type"] == "validation_error"


def test_a_router_is_one_include(tmp_path: Path) -> None:
    """What a new resource needs: an APIRouter added to the app (as the report's ``/ui`` will be)."""
    from fastapi import APIRouter

    extra = APIRouter(tags=["ui"])

    @extra.get("/ui/ping")
    def ping() -> dict[str, str]:
        return {"ok": "yes"}

    app = create_app(Settings(no_model=True, log_dir=tmp_path / "logs"))
    app.include_router(extra)
    with TestClient(app) as c:
        assert c.get("/ui/ping").json() == {"ok": "yes"}
        assert c.post("/v1/runs/r/decide", json={"events": turn_events(0)}).status_code == 200
