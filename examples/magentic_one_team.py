"""A Magentic-One team stopped by its own progress ledger (docs/integrations.md, "Magentic-One").

Start the service first (``stopserve serve``: port 8080, or set ``STOPSERVE_URL``), then
``python examples/magentic_one_team.py``. Offline: the models are autogen-ext's
``ReplayChatCompletionClient`` (scripted answers, no API key, no network). The surfer says
something new every turn, so no repeat shows in the content; but the orchestrator's own
progress ledger says, round after round, that the team is in a loop: stopserve's
``orchestrator_ledger`` rule ends the run at the third such ledger, and Magentic-One writes
its final answer. Swap in your own model clients.
"""

from __future__ import annotations

import asyncio
import json
import os

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import MagenticOneGroupChat
from autogen_ext.models.replay import ReplayChatCompletionClient

from stopserve.integrations.autogen import StopServeTermination

URL = os.environ.get("STOPSERVE_URL", "http://127.0.0.1:8080")


def stuck_ledger() -> str:
    """The progress ledger a stuck orchestrator writes: no progress, in a loop."""
    answer = {
        "is_request_satisfied": False,
        "is_progress_being_made": False,
        "is_in_loop": True,
        "instruction_or_question": "search the docs for the telemetry flag",
        "next_speaker": "surfer",
    }
    return json.dumps({key: {"reason": "...", "answer": value} for key, value in answer.items()})


# the orchestrator plans (facts, plan), then writes a ledger every round (re-planning at its third stall)
client = ReplayChatCompletionClient(["facts", "plan"] + [stuck_ledger(), "facts", "plan"] * 10 + ["answer"])
surfer = AssistantAgent(
    "surfer", model_client=ReplayChatCompletionClient([f"Page {i}: nothing about it." for i in range(20)])
)


async def main() -> None:
    stop = StopServeTermination(URL)
    team = MagenticOneGroupChat([surfer], model_client=stop.read_ledger(client),
                                termination_condition=stop | MaxMessageTermination(50))
    result = await team.run(task="Find the flag that turns off telemetry")
    print(result.stop_reason)  # "stopserve: stop (loop_detected), safety net orchestrator_ledger ..."
    await stop.outcome({"team": 0.0})
    await stop.aclose()


if __name__ == "__main__":
    asyncio.run(main())
