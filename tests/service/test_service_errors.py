"""The service's error handlers: every error through the one table and the one body.

A small FastAPI app with the service's handlers installed, and routes that raise each
kind of error; the bodies are checked against :mod:`stopserve.error_table`.
"""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field

from stopserve import errors as e
from stopserve.api import ErrorBody
from stopserve.error_table import ERRORS
from stopserve.service.errors import install_error_handlers, validation_issues


class Body(BaseModel):
    n: int = Field(ge=0)
    kind: str = Field(pattern="^(a|b)$")


def app_raising() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    by_name = {kind.error.__name__: kind.error for kind in ERRORS}

    @app.get("/raise/{name}")
    def raise_it(name: str) -> None:
        raise by_name[name]("it broke", [e.Issue("bad", file="runs.jsonl", line=7, path="events[2].t")])

    @app.post("/body")
    def body(item: Body) -> dict[str, int]:
        return {"n": item.n}

    @app.get("/bug")
    def bug() -> None:
        raise RuntimeError("secret detail")

    return app


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(app_raising(), raise_server_exceptions=False)


@pytest.mark.parametrize("kind", ERRORS, ids=lambda k: k.type)
def test_each_error_answers_its_status_type_and_issues(client: TestClient, kind) -> None:
    r = client.get(f"/raise/{kind.error.__name__}")
    assert r.status_code == kind.status
    error = ErrorBody.model_validate(r.json()).error
    assert (error.type, error.status, error.message) == (kind.type, kind.status, "it broke")
    assert [(i.field, i.file, i.line, i.message) for i in error.issues] == [
        ("events[2].t", "runs.jsonl", 7, "bad")
    ]
    assert ("www-authenticate" in r.headers) == (kind.status == 401)


def test_a_request_validation_error_names_every_field(client: TestClient) -> None:
    r = client.post("/body", json={"n": -1, "kind": "c", "extra": 1})
    assert r.status_code == 422
    error = r.json()["error"]
    assert (error["type"], error["message"]) == ("validation_error", "invalid request (2 problems)")
    assert {i["field"]: i["message"] for i in error["issues"]} == {
        "body.n": "Input should be greater than or equal to 0 (got -1)",
        "body.kind": "String should match pattern '^(a|b)$' (got 'c')",
    }
    broken = client.post("/body", content=b"{not json", headers={"content-type": "application/json"})
    assert broken.status_code == 422 and broken.json()["error"]["issues"][0]["field"].startswith("body")


def test_http_errors_and_bugs_keep_the_shape(client: TestClient) -> None:
    r = client.delete("/body")
    assert r.status_code == 405 and r.json()["error"]["type"] == "method_not_allowed"
    r = client.get("/nowhere")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
    r = client.get("/bug")
    assert r.status_code == 500 and r.json()["error"]["type"] == "internal_error"
    assert "secret detail" not in r.text and "Traceback" not in r.text


def test_validation_issues_use_the_shared_formatter() -> None:
    errs = [
        {"type": "missing", "loc": ("body", "events", 0, "id"), "msg": "Field required", "input": {}},
        {"type": "literal_error", "loc": ("body", "events", 1, "type"), "input": "spwan",
         "msg": "Input should be 'spawn' or 'stop'", "ctx": {"expected": "'spawn' or 'stop'"}},
    ]  # fmt: skip
    issues = validation_issues(errs)
    assert [(i.field, i.message) for i in issues] == [
        ("body.events[0].id", "required field is missing"),
        ("body.events[1].type", "'spwan' is not one of spawn, stop"),
    ]


def test_the_service_documents_its_errors_from_the_table() -> None:
    from stopserve.service.app import create_app
    from stopserve.settings import Settings

    spec = create_app(Settings(no_model=True, log_dir=None)).openapi()
    responses = spec["paths"]["/v1/runs/{run_id}/decide"]["post"]["responses"]
    for kind in ERRORS:
        assert f"`{kind.type}`" in responses[str(kind.status)]["description"], kind.type
    assert responses["409"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
