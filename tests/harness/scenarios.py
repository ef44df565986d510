"""The scripted models of the live scenarios, shared by both harnesses' tests and the benchmark.

Each is a function of the request view returning the next step. The loops are dumb on
purpose (the same call again and again, 30 times at most) but obey a refusal: once a
tool result says stopserve refused or stopped the call, they report and finish -- as a
model does when a hook tells it to stop calling tools.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from scripted import Say, Step, Tool, View

__all__ = ["finished", "hung_port", "loop", "subagent", "verify_then_stop"]

MAX_LOOP = 30
FAILING = "cat /nonexistent/config.yaml"
SUCCEEDING = "echo the config is empty"


def _shell(api: str, command: str) -> Tool:
    if api == "responses":
        return Tool("exec_command", {"cmd": command})
    return Tool("Bash", {"command": command, "description": "read the config"})


def _stopped(text: str) -> bool:
    return "stopserve" in text


def loop(command: str) -> Callable[[View], Step]:
    """The same shell command until told to stop (or 30 times)."""

    def script(view: View) -> Step:
        if _stopped(view.last_result) or len(view.results) >= MAX_LOOP:
            return Say("The command gives the same result every time; I am stopping here to report it.")
        return _shell(view.api, command)

    return script


def heeds_nudges(command: str) -> Callable[[View], Step]:
    """The same shell command until the agent is told it repeats itself (a nudge, anywhere in
    the request); then another command, and a finished answer."""

    def script(view: View) -> Step:
        if "try something different" not in json.dumps(view.body):
            return _shell(view.api, command) if len(view.results) < MAX_LOOP else Say("Giving up.")
        if "total " not in view.last_result:  # ls -la's first line
            return _shell(view.api, "ls -la")
        return Say("Done: the config file is missing; I listed the directory instead.")

    return script


def finished(view: View) -> Step:
    """One call, then a finished answer."""
    if not view.results:
        return _shell(view.api, SUCCEEDING)
    return Say("Done: the config is empty.")


def verify_then_stop(view: View) -> Step:
    """Write a file and say done; when told to check the work first, run the tests, then finish."""
    told = any("Not finished yet" in t for t in view.user_texts) or any(
        "Not finished yet" in r for r in view.results
    )
    if not view.results:
        if view.api == "responses":
            return Tool("apply_patch", {"patch": PATCH})
        return Tool("Write", {"file_path": "app.py", "content": "def add(a, b):\n    return a + b\n"})
    if not told:
        return Say("Done: app.py has add().")
    if not any("passed" in r for r in view.results):
        test = (
            "printf 'from app import add\\n\\ndef test_add():\\n    assert add(1, 2) == 3\\n' > test_app.py"
        )
        # this Python: the harness's shell is a login shell, whose PATH may have none with pytest
        return _shell(view.api, f"{test} && {sys.executable} -m pytest -q -p no:cacheprovider test_app.py")
    return Say("Done: app.py has add(), and its test passes (1 passed).")


PATCH = "*** Begin Patch\n*** Add File: app.py\n+def add(a, b):\n+    return a + b\n*** End Patch\n"


SUBTASK = "SUBTASK: list the files here"


def subagent(view: View) -> Step:
    """Claude Code: hand a task to a sub-agent (the Agent tool), which runs one command."""
    if view.user_texts and SUBTASK in view.user_texts[0]:
        if not view.results:
            return _shell(view.api, "ls -a")
        return Say("The folder is empty.")
    if not view.results:
        return Tool(
            "Agent",
            {"description": "list the files", "prompt": SUBTASK, "subagent_type": "general-purpose"},
        )
    return Say("Done: the sub-agent says the folder is empty.")


@contextmanager
def hung_port() -> Iterator[int]:
    """A loopback port that accepts connections and never answers (a hung service)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    held: list[socket.socket] = []
    done = threading.Event()

    def hold() -> None:
        sock.settimeout(0.2)
        while not done.is_set():
            try:
                conn, _ = sock.accept()
                held.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1]
    finally:
        done.set()
        thread.join(2)
        for conn in held:
            conn.close()
        sock.close()
