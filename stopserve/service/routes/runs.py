"""``/v1/runs/{run_id}``: a live run's outcome, credit, state, and its deletion.

The outcome reads its body itself (count limits, validation from bytes) and closes the
run in the thread pool (it writes the trace log). The run's own routes take their id
through :data:`~stopserve.service.deps.RUN_PATH`, which never matches ``.../decide``,
``.../outcome`` or ``.../credit``, so no route here shadows another.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from stopserve.api import MAX_INT, MAX_NUMBER, CreditResponse, OutcomeRequest, OutcomeResponse, RunInfo
from stopserve.error_table import openapi_responses
from stopserve.service.body import body_doc, gone, json_response, read_body
from stopserve.service.deps import RUN_ID_PARAMETER, RUN_PATH, EngineDep, RunId, get_engine

__all__ = ["router"]

router = APIRouter(tags=["runs"], responses=openapi_responses())

_RUN = "/v1/runs/{run_id:" + RUN_PATH + "}"


@router.post(
    "/v1/runs/{run_id:path}/outcome",
    response_model=OutcomeResponse,
    summary="Post the final rewards: closes the run and logs its trace",
    openapi_extra=body_doc(OutcomeRequest, RUN_ID_PARAMETER),
)
async def outcome(request: Request) -> Response:
    """The complete trace (events, decisions, outcome) goes to ``traces.jsonl``, format v1."""
    run_id: str = request.path_params["run_id"]
    body = await read_body(request, OutcomeRequest, run_id)
    if body is None:
        return gone()
    done = await run_in_threadpool(get_engine(request).outcome, run_id, body)
    return json_response(done.model_dump(mode="json"))


@router.get(
    "/v1/runs/{run_id:path}/credit",
    response_model=CreditResponse,
    summary="Message-level credit of a live run's events, from the served model's value",
)
def run_credit(
    run_id: RunId,
    engine: EngineDep,
    *,
    method: Literal["td", "ablation"] = "td",
    split: Literal["tokens", "equal"] = "tokens",
    window: Literal["decision", "reward"] = "decision",
    baseline: Literal["zero", "model"] = "zero",
    lam: Annotated[float | None, Query(alias="lambda", ge=0, le=MAX_NUMBER)] = None,
    cost_share: Annotated[float | None, Query(ge=0, le=100)] = None,
    types: Annotated[str | None, Query(description="ablation: comma list of event types")] = None,
    last_k: Annotated[int | None, Query(ge=1, le=MAX_INT, description="ablation: last K points")] = None,
) -> Response:
    """What each event did to the run's value so far: TD or ablation credit (docs/credit.md)."""
    kinds = [t.strip() for t in types.split(",") if t.strip()] if types is not None else None
    return json_response(
        engine.credit(
            run_id,
            method=method,
            split=split,
            window=window,
            baseline=baseline,
            lam=lam,
            cost_share=cost_share,
            types=kinds,
            last_k=last_k,
        )
    )


@router.get(_RUN, response_model=RunInfo)
def get_run(run_id: RunId, engine: EngineDep) -> RunInfo:
    """State and current features of a live run (for debugging)."""
    return engine.run_info(run_id)


@router.delete(_RUN, status_code=204)
def delete_run(run_id: RunId, engine: EngineDep) -> Response:
    """Forget a live run without logging its trace."""
    engine.delete(run_id)
    return Response(status_code=204)
