"""stopserve as the ``Stop``/``SubagentStop`` and tool hook of Claude Code and Codex CLI.

The harness runs ``stopserve hook claude-code`` (or ``codex``) as a short-lived
process at each hook event, with the event's JSON on stdin. The hook reads the
transcript lines added since its last call, sends them to the service as the run's
new events, and answers in the harness's own protocol: block a premature stop with
a reason the agent can act on, end a looping run from a tool hook, or stay silent.

* :mod:`stopserve.hooks.protocol`: hook input and output of both harnesses;
* :mod:`stopserve.hooks.state`: the per-run state directory (offsets, counts, logs);
* :mod:`stopserve.hooks.reason`: the reason texts, built from the decision and the transcript;
* :mod:`stopserve.hooks.run`: the hook command itself (fails open, bounded in time);
* :mod:`stopserve.hooks.install`: ``stopserve hook install|uninstall`` (settings files);
* :mod:`stopserve.hooks.report`: ``stopserve hook report`` and ``stopserve label``.

Nothing is imported here: the hook process imports only what its path needs.
"""

from typing import Final

__all__ = ["DEFAULT_MAX_BLOCKS", "DEFAULT_TIMEOUT", "DEFAULT_URL"]

#: where the hook finds the service (``--url``, ``STOPSERVE_URL``)
DEFAULT_URL: Final = "http://127.0.0.1:8080"
#: seconds one hook call may take in all before it lets the agent stop (``--timeout``)
DEFAULT_TIMEOUT: Final = 0.8
#: stops blocked in a row within one turn at most (``--max-blocks``)
DEFAULT_MAX_BLOCKS: Final = 2
