"""Log directories written by a REAL ``stopserve serve`` fed real decide and outcome calls.

:func:`drive` sends the runs a report must show (each a few calls over HTTP): a loop the
loop detector stops (its events carry a ``snippet`` the user logged), a run a turn budget
stops, runs that end on their own with a reward, and one still open. The server is the
shipped default model (so decisions carry ``v_stop`` and ``cost_to_go``) unless told
``no_model``. :func:`promote` writes a retrain's verdicts with the model store's own writer.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from stopserve.model_store import ModelStore

__all__ = ["LOOP_REF", "drive", "promote"]

LOOP_REF = "sha256:aaaa000011112222"
RESULT_REF = "sha256:bbbb000011112222"
SNIPPET = "pytest tests/test_io.py -x"


def _loop(c: httpx.Client, run_id: str) -> dict[str, Any]:
    t = 0.0
    answer: dict[str, Any] = {}
    for i in range(12):
        events = [
            {
                "id": f"{run_id}-u{i}",
                "t": t,
                "type": "tool_use",
                "agent": "coder",
                "tool": "bash",
                "content_ref": LOOP_REF,
                "tokens": 500,
                "snippet": SNIPPET,
            },
            {
                "id": f"{run_id}-r{i}",
                "t": t + 1,
                "type": "return",
                "agent": "bash",
                "tool": "bash",
                "content_ref": RESULT_REF,
                "error": True,
                "tokens": 200,
            },
        ]
        t += 2
        # the loop detector at its threshold, no nudges: the loop is the rule's (the model would
        # otherwise stop it first, at the same step)
        body = {"events": events, "safety": {"loop": {"nudge": 0}}}
        answer = c.post(f"/v1/runs/{run_id}/decide", json=body).raise_for_status().json()
        if answer["action"] == "stop":
            break
    return answer


def _steps(c: httpx.Client, run_id: str, n: int, *, safety: dict[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {}
    for i in range(n):
        events = [
            {
                "id": f"{run_id}-u{i}",
                "t": 2.0 * i,
                "type": "tool_use",
                "agent": "coder",
                "tool": "bash",
                "content_ref": f"sha256:{i + 1:016x}",
                "tokens": 600,
            },
            {
                "id": f"{run_id}-r{i}",
                "t": 2.0 * i + 1,
                "type": "return",
                "agent": "bash",
                "tool": "bash",
                "content_ref": f"sha256:{i + 1001:016x}",
                "tokens": 200,
            },
        ]
        body: dict[str, Any] = {"events": events}
        if safety is not None:
            body["safety"] = safety
        answer = c.post(f"/v1/runs/{run_id}/decide", json=body).raise_for_status().json()
        if answer["action"] == "stop":
            break
    return answer


def drive(url: str, *, prefix: str = "", ok_runs: int = 3) -> dict[str, dict[str, Any]]:
    """Send the runs; each run id's last answer."""
    last: dict[str, dict[str, Any]] = {}
    with httpx.Client(base_url=url, timeout=30) as c:
        last[f"{prefix}loop-1"] = _loop(c, f"{prefix}loop-1")
        c.post(f"/v1/runs/{prefix}loop-1/outcome", json={"rewards": {"team": 0.0}}).raise_for_status()
        last[f"{prefix}budget-1"] = _steps(c, f"{prefix}budget-1", 10, safety={"max_turns": 4})
        c.post(f"/v1/runs/{prefix}budget-1/outcome", json={"rewards": {"team": 1.0}}).raise_for_status()
        for k in range(ok_runs):
            rid = f"{prefix}ok-{k}"
            last[rid] = _steps(c, rid, 6 + k)
            c.post(f"/v1/runs/{rid}/outcome", json={"rewards": {"team": 1.0}}).raise_for_status()
        last[f"{prefix}open-1"] = _steps(c, f"{prefix}open-1", 2)
    return last


def promote(store_dir: Path, model_dir: Path) -> None:
    """Two retrains' verdicts in the model store: a refusal, then a promotion of ``model_dir``."""
    store = ModelStore(store_dir)

    def evidence(champion: float, candidate: float, runs: int) -> dict[str, Any]:
        est = {
            name: {"dr": v, "dr_ci90": [v - 0.02, v + 0.02], "ips": v, "ips_ci90": [v - 0.03, v + 0.03]}
            for name, v in (("champion", champion), ("candidate", candidate))
        }
        d = candidate - champion
        return {
            "judged_on": {"runs": runs},
            "estimates": est,
            "difference": {"policy": "candidate", "estimator": "dr", "mean": d, "ci90": [d - 0.01, d + 0.01]},
            "candidate": {"version": "cand-1"},
        }

    refused = evidence(0.30, 0.29, 60)
    store.log({"kind": "refusal", "reason": "not better on the 60 held-out runs", "evidence": refused})
    time.sleep(0.01)
    better = {**evidence(0.31, 0.36, 90), "reason": "better"}
    store.promote(model_dir, version="cand-2", previous=None, evidence=better)
