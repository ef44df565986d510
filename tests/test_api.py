"""The wire models (stopserve.api): names on the wire, bounds, and run ids."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from stopserve import api
from stopserve.api import (
    MAX_ID_CHARS,
    MAX_INT,
    MAX_TEXT_CHARS,
    BatchDecideRequest,
    DecideRequest,
    ErrorBody,
    OutcomeRequest,
    StatelessDecideRequest,
)
from stopserve.errors import field_path

EVENT: dict[str, Any] = {"id": "e1", "t": 0.5, "type": "return", "agent": "a"}


def fields_of(exc: ValidationError) -> list[str]:
    return [field_path(err["loc"]) for err in exc.errors()]


def test_wire_names_and_defaults() -> None:
    req = DecideRequest.model_validate({"events": [EVENT], "lambda": 0.2, "prior_events": 3})
    assert (req.lam, req.prior_events, req.proposed_stop, req.events[0].id) == (0.2, 3, False, "e1")
    assert req.model_dump(by_alias=True, exclude_none=True)["lambda"] == 0.2
    assert DecideRequest.model_validate({}).events == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"events": [{**EVENT, "id": "x" * (MAX_ID_CHARS + 1)}]}, "events[0].id"),
        ({"events": [{**EVENT, "content_ref": "h" * (MAX_TEXT_CHARS + 1)}]}, "events[0].content_ref"),
        ({"events": [{**EVENT, "tokens": MAX_INT + 1}]}, "events[0].tokens"),
        ({"events": [{**EVENT, "sketch": "mh1:" + "f" * 129}]}, "events[0].sketch"),
        ({"events": [{**EVENT, "t": -1}]}, "events[0].t"),
        (
            {"events": [{**EVENT, "progress": {"tests_passed": MAX_INT + 1}}]},
            "events[0].progress.tests_passed",
        ),
        ({"events": [{**EVENT, "progress": {"exit_code": -MAX_INT - 1}}]}, "events[0].progress.exit_code"),
        ({"events": [{**EVENT, "progress": {"error": "x" * 129}}]}, "events[0].progress.error"),
        ({"events": [{**EVENT, "progress": {"loop": True}}]}, "events[0].progress.loop"),
        ({"lambda": -0.1}, "lambda"),
        ({"cost_share": 101}, "cost_share"),
        ({"budget": {"max_turns": -1}}, "budget.max_turns"),
        ({"surprise": 1}, "surprise"),
        ({"prior_events": -1}, "prior_events"),
    ],
)
def test_out_of_bounds_names_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        DecideRequest.model_validate(body)
    assert fields_of(err.value) == [field]


@pytest.mark.parametrize("run_id", ["a/b", "", "run 1", "x" * 257, "é"])
def test_run_ids_in_bodies_follow_the_one_pattern(run_id: str) -> None:
    with pytest.raises(ValidationError):
        BatchDecideRequest.model_validate({"runs": [{"run_id": run_id, "events": [EVENT]}]})
    with pytest.raises(ValidationError):
        StatelessDecideRequest.model_validate({"run_id": run_id, "events": [EVENT]})


def test_good_run_ids_pass() -> None:
    for run_id in ("run-42", "a.b_c:d@e+f", "x" * 256):
        batch = BatchDecideRequest.model_validate({"runs": [{"run_id": run_id, "events": [EVENT]}]})
        assert batch.runs[0].run_id == run_id


def test_a_stateless_call_needs_events_and_an_outcome_bounds_its_maps() -> None:
    with pytest.raises(ValidationError) as err:
        StatelessDecideRequest.model_validate({"events": []})
    assert fields_of(err.value) == ["events"]
    with pytest.raises(ValidationError) as err:
        OutcomeRequest.model_validate({"rewards": {f"c{i}": 1.0 for i in range(65)}})
    assert fields_of(err.value) == ["rewards"]
    with pytest.raises(ValidationError):
        OutcomeRequest.model_validate({"rewards": {"team": float("nan")}})


def test_every_model_builds_its_schema_and_its_examples_validate() -> None:
    models = [getattr(api, n) for n in api.__all__ if isinstance(getattr(api, n), type)]
    models = [m for m in models if issubclass(m, BaseModel)]
    assert len(models) >= 15
    for model in models:
        schema = model.model_json_schema()
        for example in schema.get("examples", []):
            model.model_validate(example)
    ErrorBody.model_validate(ErrorBody.model_json_schema()["examples"][0])
