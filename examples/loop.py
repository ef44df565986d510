"""A hand-written orchestrator loop that asks stopserve at every turn (README, "In your orchestrator").

Start the service first (``stopserve serve``: port 8080, or set ``STOPSERVE_URL``), then
``python examples/loop.py``. The agent is scripted, offline: ``run_tool`` runs the same
failing test again and again, the stuck loop the service's loop detector ends. Put your
own agent's step in ``run_tool``.
"""

from __future__ import annotations

import os
import uuid

from stopserve.client import EventRecorder, StopClient

URL = os.environ.get("STOPSERVE_URL", "http://127.0.0.1:8080")


def run_tool(command: str) -> tuple[str, bool, int]:
    """One step of your agent: (its output, whether it succeeded, the tokens it cost). Scripted here."""
    return "FAILED tests/test_utils.py::test_parse - ValueError: empty string", False, 350


def main() -> None:
    run_id, command, score = f"loop-{uuid.uuid4().hex[:8]}", "pytest tests/test_utils.py", 0.0
    client, rec = StopClient(URL, timeout=2.0), EventRecorder(agent="orchestrator")
    for step in range(100):
        output, ok, n_tokens = run_tool(command)  # your agent loop
        rec.tool_use("bash", content=command, tokens=n_tokens)  # ids, clock, content hashes
        rec.returned("bash", content=output, error=not ok)
        decision = client.decide(run_id, rec.drain())
        if decision.action == "stop":  # finalize: give your best answer now
            break
    client.outcome(run_id, {"team": score})  # the service logs the whole trace
    print(f"stopped at turn {decision.turn}: {decision.reason} ({decision.pattern or decision.safety_net})")


if __name__ == "__main__":
    main()
