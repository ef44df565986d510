"""Drop-in integrations: each maps a framework's own messages to format-v1 events,
asks the service each turn, and stops the framework's run the way it expects.

- :mod:`stopserve.integrations.autogen`: ``StopServeTermination`` (autogen-agentchat)
- :mod:`stopserve.integrations.langgraph`: ``StopServeRouter`` for ``add_conditional_edges``
- :mod:`stopserve.integrations.openai_agents`: ``StopServeHooks`` (openai-agents ``RunHooks``)

Each also hands the loop detector's nudge (``DecideResponse.nudge``) to the agent's next
model call: ``StopServeRouter.nudging``, ``StopServeHooks.run_config``,
``StopServeTermination.nudging``.

Each needs its framework: the ``[integrations]`` extra.
"""
