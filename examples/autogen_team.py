"""An AutoGen team stopped by stopserve (docs/integrations.md, "AutoGen").

Start the service first (``stopserve serve``: port 8080, or set ``STOPSERVE_URL``), then
``python examples/autogen_team.py``. Offline: each agent's model is autogen-ext's
``ReplayChatCompletionClient``, which answers with a scripted list of replies (no API key,
no network). The coder resubmits the same draft and the critic gives the same reply every
time: at the loop's threshold stopserve first nudges the coder (``stop.nudging``: its next
model request ends with the nudge), and when the exchange still repeats, its loop detector
ends the run. Swap in your own model clients.
"""

from __future__ import annotations

import asyncio
import os

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_ext.models.replay import ReplayChatCompletionClient

from stopserve.integrations.autogen import StopServeTermination

URL = os.environ.get("STOPSERVE_URL", "http://127.0.0.1:8080")


async def main() -> None:
    stop = StopServeTermination(URL, budget={"max_usd": 2.0})
    # scripted, offline models: a coder stuck on one draft (nudged through its client), a critic
    # repeating itself
    coder_model = ReplayChatCompletionClient(["def parse(s):  # draft 1"] * 60)
    coder = AssistantAgent("coder", model_client=stop.nudging(coder_model))
    critic = AssistantAgent(
        "critic", model_client=ReplayChatCompletionClient(["Please handle the empty string."] * 60)
    )
    team = RoundRobinGroupChat([coder, critic], termination_condition=stop | MaxMessageTermination(50))
    result = await team.run(task="Fix the failing test in utils.py")
    print(result.stop_reason)  # "stopserve: stop (loop_detected, ...), ..." when stopserve ended it
    await stop.outcome({"team": 1.0})
    await stop.aclose()


if __name__ == "__main__":
    asyncio.run(main())
