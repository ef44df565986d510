"""An OpenAI Agents SDK run ended by stopserve (docs/integrations.md, "OpenAI Agents SDK").

Start the service first (``stopserve serve``: port 8080, or set ``STOPSERVE_URL``), then
``python examples/openai_agents_run.py``. Offline: the agent's model is a custom
``agents.models.interface.Model`` that answers with scripted tool calls (no API key, no
network; tracing is off). It runs the same failing test every turn: stopserve's loop
detector ends the run with a final output. Pass your own model (or none: the SDK's default
OpenAI model) instead.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, ModelResponse, Runner, Usage, function_tool, set_tracing_disabled
from agents.models.interface import Model
from agents.testing import function_call

from stopserve.integrations.openai_agents import StopServeHooks

URL = os.environ.get("STOPSERVE_URL", "http://127.0.0.1:8080")
set_tracing_disabled(True)  # offline: no trace export


class ScriptedModel(Model):
    """A model that calls ``run_tests`` on every turn (a stuck agent)."""

    def __init__(self) -> None:
        self.calls = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.calls += 1
        item = function_call("run_tests", {"path": "tests/"}, call_id=f"call{self.calls}")
        usage = Usage(requests=1, input_tokens=400, output_tokens=30, total_tokens=430)
        return ModelResponse(output=[item], usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("this example does not stream")


@function_tool
def run_tests(path: str) -> str:
    """Run the test suite at path."""
    return f"{path}: 1 failed (test_parse: ValueError: empty string)"


@function_tool
def edit_file(path: str, text: str) -> str:
    """Replace the file at path with text."""
    return f"wrote {len(text)} characters to {path}"


model = ScriptedModel()


async def main() -> None:
    hooks = StopServeHooks(URL, budget={"max_tokens": 500_000})
    agent = hooks.attach(Agent(name="coder", instructions="...", tools=[run_tests, edit_file], model=model))
    config = hooks.run_config()  # the loop detector's nudges reach the model
    result = await Runner.run(agent, "Fix the failing test", hooks=hooks, max_turns=60, run_config=config)
    print(result.final_output)  # on a stop: "stopserve: stop (...)" and the last tool output
    await hooks.outcome({"team": 1.0})
    await hooks.aclose()


if __name__ == "__main__":
    asyncio.run(main())
