"""Message-level credit of a live run, under the served model (``GET /v1/runs/{id}/credit``, docs/credit.md).

The run's events so far are read back from its journal and credited by the offline
code (:mod:`stopserve.training.credit`, imported on first use: the service does not
load the trainer otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, cast

from stopserve.policy import Policy
from stopserve.service.decider import objective_of
from stopserve.service.runs import Runs
from stopserve.trace import Event, Topology, Trace

__all__ = ["CREDIT_ABLATION_LAST_K", "live_credit"]

#: Decision points an ablation of a live run reads back by default (one refold per event).
CREDIT_ABLATION_LAST_K: Final = 10


def live_credit(
    runs: Runs,
    policy: Policy,
    run_id: str,
    *,
    method: str = "td",
    split: str = "tokens",
    window: str = "decision",
    baseline: str = "zero",
    lam: float | None = None,
    cost_share: float | None = None,
    types: Sequence[str] | None = None,
    last_k: int | None = None,
) -> dict[str, Any]:
    """Credit of the live run ``run_id``'s events so far (a ``CreditResponse`` as data).

    ``lam`` / ``cost_share`` (one of them) default to the run's own, then the model's. An ablation
    reads the last :data:`CREDIT_ABLATION_LAST_K` decision points unless ``last_k`` says.
    """
    from stopserve.training.credit import aggregate, credit_trace  # offline code: loaded on first use

    run = runs.lookup(run_id)
    with run.lock:
        texts = list(run.events)
        task_id, topology, budget = run.task_id, run.topology, run.budget
        asked = objective_of(lam, cost_share, objective_of(run.lam, run.cost_share))
    if method == "ablation" and last_k is None:
        last_k = CREDIT_ABLATION_LAST_K
    trace = Trace.model_construct(
        trace_id=run_id,
        task_id=task_id,
        topology=cast(Topology | None, topology),  # checked when the run was created
        budget=budget,
        events=[Event.model_validate_json(text) for text in texts],
    )
    report = credit_trace(
        policy,
        trace,
        method=method,
        split=split,
        window=window,
        baseline=baseline,
        objective=asked,
        types=types,
        last_k=last_k,
    )
    data = report.to_dict()
    data["run_id"] = data.pop("trace_id")
    data["model_version"] = policy.model_version
    data["aggregates"] = {by: aggregate([report], by) for by in ("agent", "role", "type", "agent_type")}
    return data
