"""Run the REAL Claude Code and Codex CLI binaries headless against the scripted model.

The binaries come from the npm packages pinned in ``tests/harness/package.json`` (the
one place their versions are named), installed by ``.ci/run`` (or by hand:
``npm ci --prefix .harness`` after copying ``package.json`` and ``package-lock.json``
there) into ``<repo>/.harness/node_modules``, or wherever ``STOPSERVE_HARNESS_BIN``
(a folder holding ``claude`` and ``codex``) points.

Each run gets its own ``HOME`` (and ``CODEX_HOME``), the hooks installed with
``stopserve hook install`` as a user runs it, and a scripted model on loopback
(:mod:`scripted`). Nothing leaves the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripted import ModelServer, Step, View

__all__ = [
    "PINNED",
    "HarnessRun",
    "binary",
    "hook_records",
    "install_hooks",
    "run_claude",
    "run_codex",
]

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex"}
#: the versions the tests are written against (package.json is the one place they are named)
PINNED: dict[str, str] = {
    name: json.loads((Path(__file__).parent / "package.json").read_text())["dependencies"][package]
    for name, package in PACKAGES.items()
}


def binary(name: str) -> Path | None:
    """The installed ``claude`` or ``codex`` binary, or None."""
    where = os.environ.get("STOPSERVE_HARNESS_BIN")
    folder = Path(where) if where else ROOT / ".harness" / "node_modules" / ".bin"
    path = folder / name
    return path if path.exists() else None


def installed_version(name: str) -> str | None:
    """The installed package's version (its package.json), or None."""
    path = binary(name)
    if path is None:
        return None
    manifest = path.resolve().parents[1] / "package.json"  # node_modules/<pkg>/bin/<exe>
    if not manifest.exists():
        manifest = path.parent.parent / PACKAGES[name] / "package.json"
    try:
        return str(json.loads(manifest.read_text())["version"])
    except (OSError, KeyError, ValueError):
        return None


@dataclass
class HarnessRun:
    """What one headless run did."""

    rc: int
    stdout: str
    stderr: str
    seconds: float
    events: list[dict[str, Any]]
    model: ModelServer
    home: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> list[Step]:
        """The steps the scripted model answered to the harness's main loop."""
        return self.model.steps

    def tool_calls(self) -> int:
        """Tool calls the model asked for (each ran or was refused)."""
        from scripted import Tool

        return sum(1 for s in self.steps if isinstance(s, Tool))

    def result(self) -> dict[str, Any]:
        """Claude Code's final ``result`` message (stream-json)."""
        found = [e for e in self.events if e.get("type") == "result"]
        assert found, f"no result message; stderr: {self.stderr[-2000:]}"
        return found[-1]

    def user_messages(self) -> list[str]:
        """What the user is shown besides the model's words: Claude Code's informational
        system messages (stream-json), Codex's error items and its stderr lines."""
        shown = [str(e.get("content")) for e in self.events if e.get("type") == "system" and "content" in e]
        shown += [
            str(e["item"].get("message"))
            for e in self.events
            if e.get("type") == "item.completed" and e.get("item", {}).get("type") == "error"
        ]
        return shown + self.stderr.splitlines()


def _env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
    }
    env.update(extra)
    return env


def install_hooks(harness: str, home: Path, *args: str, codex_home: Path | None = None) -> str:
    """``stopserve hook install <harness> ARGS`` as the user runs it (their HOME): its output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STOPSERVE_", "CODEX_", "CLAUDE_"))}
    env["HOME"] = str(home)
    if codex_home is not None:
        env["CODEX_HOME"] = str(codex_home)
    proc = subprocess.run(
        [sys.executable, "-m", "stopserve", "hook", "install", harness, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _events(stdout: str) -> list[dict[str, Any]]:
    out = []
    for raw in stdout.splitlines():
        line = raw.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def run_claude(
    home: Path,
    script: Callable[[View], Step],
    *,
    prompt: str = "Read the config and report what it says.",
    settings: dict[str, Any] | None = None,
    install: Sequence[str] | None = None,
    timeout: float = 120.0,
) -> HarnessRun:
    """``claude -p PROMPT --output-format stream-json`` with its own HOME, hooks installed
    with ``stopserve hook install claude-code INSTALL`` (when given)."""
    exe = binary("claude")
    assert exe is not None
    work = home / "work"
    work.mkdir(parents=True, exist_ok=True)
    if settings is not None:
        (home / ".claude").mkdir(parents=True, exist_ok=True)
        (home / ".claude" / "settings.json").write_text(json.dumps(settings))
    installed = install_hooks("claude-code", home, *install) if install is not None else ""
    with ModelServer(script) as model:
        env = _env(
            home,
            {
                "ANTHROPIC_BASE_URL": model.url,
                "ANTHROPIC_API_KEY": "sk-ant-test-dummy",
                "IS_SANDBOX": "1",  # Claude Code refuses --dangerously-skip-permissions as root otherwise
                "DISABLE_AUTOUPDATER": "1",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            },
        )
        argv = [
            str(exe),
            "-p",
            prompt,
            "--output-format",
            "stream-json",
            "--verbose",
            "--dangerously-skip-permissions",
            "--debug-file",
            str(home / "claude-debug.log"),
        ]
        start = time.monotonic()
        proc = subprocess.run(
            argv,
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        seconds = time.monotonic() - start
    return HarnessRun(
        proc.returncode,
        proc.stdout,
        proc.stderr,
        seconds,
        _events(proc.stdout),
        model,
        home,
        {"install": installed},
    )


def codex_config(model_url: str) -> str:
    """An isolated ``config.toml``: the scripted model as a Responses-API provider."""
    return (
        'model = "gpt-5.5"\n'
        'model_provider = "scripted"\n'
        'approval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\n'
        "[model_providers.scripted]\n"
        'name = "scripted"\n'
        f'base_url = "{model_url}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "SCRIPTED_API_KEY"\n'
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n"
    )


def run_codex(
    home: Path,
    script: Callable[[View], Step],
    *,
    prompt: str = "Read the config and report what it says.",
    install: Sequence[str] | None = None,
    bypass_trust: bool = True,
    before: Callable[[Path], None] | None = None,
    timeout: float = 120.0,
) -> HarnessRun:
    """``codex exec --json PROMPT`` with its own HOME and CODEX_HOME, hooks installed with
    ``stopserve hook install codex INSTALL`` (when given); ``bypass_trust`` adds
    ``--dangerously-bypass-hook-trust`` (without it Codex runs only trusted hooks)."""
    exe = binary("codex")
    assert exe is not None
    work = home / "work"
    work.mkdir(parents=True, exist_ok=True)
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    with ModelServer(script) as model:
        config = codex_home / "config.toml"
        if not config.exists():
            config.write_text(codex_config(model.url))
        else:  # a later run in the same home: the model moved to a new port
            text = config.read_text()
            head, _, rest = text.partition('base_url = "')
            config.write_text(head + f'base_url = "{model.url}/v1' + rest[rest.index('"') :])
        installed = (
            install_hooks("codex", home, *install, codex_home=codex_home) if install is not None else ""
        )
        if before is not None:
            before(codex_home)
        env = _env(home, {"CODEX_HOME": str(codex_home), "SCRIPTED_API_KEY": "dummy"})
        argv = [str(exe), "exec", "--json", "--skip-git-repo-check"]
        if bypass_trust:
            argv.append("--dangerously-bypass-hook-trust")
        start = time.monotonic()
        proc = subprocess.run(
            [*argv, prompt],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        seconds = time.monotonic() - start
    return HarnessRun(
        proc.returncode,
        proc.stdout,
        proc.stderr,
        seconds,
        _events(proc.stdout),
        model,
        home,
        {"install": installed},
    )


def hook_records(state: Path) -> list[dict[str, Any]]:
    """The hook's decision records (``decisions.jsonl`` in its state dir)."""
    path = state / "decisions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def which_node() -> str | None:
    """``node`` on PATH (the Codex launcher is a node script)."""
    return shutil.which("node")
