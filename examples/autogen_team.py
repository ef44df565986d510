"""An AutoGen team stopped by stopserve (docs/integrations.md, "AutoGen").

Start the service first (``stopserve serve``: port 8080, or set ``STOPSERVE_URL``), then
``python examples/autogen_team.py``. Offline: each agent's model is autogen-ext's
``ReplayChatCompletionClient``, which answers with a scripted list of replies (no API key,
no network). The coder resubmits the same draft and the critic gives the same reply every
time: stopserve's loop detector ends the run (the exchange repeats). Swap in your own model
clients.
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

# scripted, offline models: a coder stuck on one draft, a critic repeating itself
coder = AssistantAgent("coder", model_client=ReplayChatCompletionClient(["def parse(s):  # draft 1"] * 60))
critic = AssistantAgent("critic", model_client=ReplayChatCompletionClient(["Please handle the empty string."] * 60))


async def main() -> None:
    stop = StopServeTermination(URL, budget={"max_usd": 2.0})
    team = RoundRobinGroupChat([coder, critic], termination_condition=stop | MaxMessageTermination(50))
    result = await team.run(task="Fix the failing test in utils.py")
    print(result.stop_reason)  # "stopserve: stop (loop_detected, ...), ..." when stopserve ended it
    await stop.outcome({"team": 1.0})
    await stop.aclose()


if __name__ == "__main__":
    asyncio.run(main())
