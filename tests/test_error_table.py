"""The one error table: complete, one type per class, and a round trip through the wire."""

from __future__ import annotations

import inspect

import pytest

from stopserve import errors
from stopserve.api import ErrorBody
from stopserve.error_table import (
    ERRORS,
    HTTP_ERRORS,
    error_detail,
    error_from_answer,
    exception_for,
    http_type,
    openapi_responses,
    status_of,
)
from stopserve.errors import Issue, RunLimitError, StopServeError

TREE = [
    cls
    for _, cls in inspect.getmembers(errors, inspect.isclass)
    if issubclass(cls, StopServeError) and cls.__module__ == errors.__name__
]


def test_every_class_of_the_tree_has_its_own_row() -> None:
    listed = [kind.error for kind in ERRORS]
    assert len(TREE) >= 18
    assert sorted(c.__name__ for c in TREE) == sorted(c.__name__ for c in listed)
    assert len(set(listed)) == len(listed)


def test_a_type_names_one_exception_in_both_tables() -> None:
    types = [kind.type for kind in ERRORS]
    assert len(set(types)) == len(types)
    seen: dict[str, type[StopServeError]] = {}
    for kind in (*ERRORS, *HTTP_ERRORS):
        assert seen.setdefault(kind.type, kind.error) is kind.error, kind.type
        assert 400 <= kind.status < 600 and kind.description


@pytest.mark.parametrize("kind", ERRORS, ids=lambda k: k.type)
def test_round_trip_through_an_error_body(kind) -> None:
    issue = Issue("bad value", file="a.jsonl", line=3, trace_id="t", path="events[0].t")
    exc = kind.error("it broke", [issue])
    assert status_of(exc) == (kind.status, kind.type)
    body = ErrorBody(error=error_detail(exc)).model_dump(mode="json")
    assert body["error"]["type"] == kind.type and body["error"]["status"] == kind.status
    back = error_from_answer(kind.status, body, "decide 'r'")
    assert type(back) is kind.error
    assert back.message == f"decide 'r': HTTP {kind.status}: it broke"
    assert back.issues == exc.issues


def test_a_subclass_elsewhere_is_answered_as_its_nearest_listed_base() -> None:
    class TooMany(RunLimitError):
        pass

    assert status_of(TooMany("x")) == (413, "run_limit")


def test_the_service_trace_validation_error_is_not_a_config_error() -> None:
    assert exception_for("trace_validation_error", 422) is errors.TraceValidationError
    assert exception_for("config_error", 422) is errors.ConfigError
    assert exception_for("run_evicted", 409) is errors.RunEvictedError
    assert exception_for("run_closed", 409) is errors.RunClosedError


def test_unknown_types_and_bodies_fall_back_on_the_status() -> None:
    assert exception_for("from_a_newer_server", 413) is errors.RunLimitError
    assert exception_for(None, 401) is errors.AuthError
    assert exception_for(None, 418) is StopServeError
    plain = error_from_answer(422, {"detail": "nope"}, "decide 'r'")
    assert type(plain) is errors.ConfigError and "nope" in plain.message
    assert http_type(405) == "method_not_allowed" and http_type(418) == "http_error"


def test_openapi_responses_list_every_status_and_type() -> None:
    responses = openapi_responses()
    assert set(responses) == {k.status for k in ERRORS} | {
        k.status for k in HTTP_ERRORS if k.type != "internal_error"
    }
    for kind in ERRORS:
        assert f"`{kind.type}`" in responses[kind.status]["description"]
        assert responses[kind.status]["model"] is ErrorBody
    assert 500 not in responses
