"""Every code block of README.md, docs/ and examples/README.md runs as it stands, or says what it is.

The line before each fenced block is a marker (an HTML comment, not shown on GitHub):

* ``<!-- doc: run -->``: the block runs as it stands. A file's ``run`` blocks run in order
  in one scratch folder (``examples/``, ``scripts/``, ``models/`` and ``../shared`` seen as
  in a clone; ``examples/`` is a copy), as a user following the page would: bash with
  ``set -euo pipefail``, python with the test's interpreter, json parsed. Ports 8000-9999 named in
  a file are mapped to free loopback ports; a ``stopserve serve`` line starts the real
  server in the background and waits for ``/healthz``; every server started is stopped at
  the end. ``HOME`` is the scratch folder's own (``hook install`` writes nothing outside
  it). ``run slow``: only with ``-m slow``; ``run data``: skipped without
  ``../shared/data``.
* ``<!-- doc: fragment PATH -->``: part of a complete file that runs: an example under
  ``examples/`` (run by :func:`test_example_runs`; every code line of the fragment is in it,
  a ``URL = ...`` line standing for the example's, which reads ``STOPSERVE_URL``), or the
  test or script that exercises it.
* ``<!-- doc: text -->``: no command: a diagram, a synopsis, what a command prints, a file's content.
* ``<!-- doc: install -->``: the README's first block, followed by
  ``../shared/tools/fresh-clone-check`` in a fresh clone and virtual environment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from servers import LiveServer, free_port

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DOCS = [ROOT / "README.md", ROOT / "examples" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
KINDS = ("run", "fragment", "text", "install")
LINKED = ("scripts", "models", "training")  # what a block may read from the clone
COPIED = ("examples",)  # and what it may also write into (a copy: the clone stays as it is)

_MARK = re.compile(r"^<!--\s*doc:\s*(?P<spec>.*?)\s*-->$")
_FENCE = re.compile(r"^```(?P<lang>\S*)\s*$")
_PORT = re.compile(r"(?<=:)[89]\d{3}\b|(?<=--port )[89]\d{3}\b|(?<=PORT=)[89]\d{3}\b")
_SERVE = re.compile(r"^(?P<cmd>(?:\w+=\S+\s+)*stopserve serve\b[^#&]*?)\s*&?\s*(?:#.*)?$")
_COMMENT = re.compile(r"\s+#(?:\s.*)?$|^#.*$")
_FROM_IMPORT = re.compile(r"^from (\S+) import ([\w, ]+)$")
BLOCK_TIMEOUT = 600


@dataclass(frozen=True)
class Block:
    """One fenced code block and its marker."""

    doc: Path
    line: int  # of the opening fence, 1-based
    lang: str
    body: str
    kind: str | None
    args: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, each with the marker on the line before it."""
    lines = doc.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        body = "\n".join(lines[start + 1 : i]) + "\n"
        before = next((x.strip() for x in reversed(lines[:start]) if x.strip()), "")
        mark = _MARK.match(before)
        words = tuple(mark["spec"].split()) if mark else ()
        out.append(Block(doc, start + 1, fence["lang"], body, words[0] if words else None, words[1:]))
        i += 1
    return out


ALL = [b for doc in DOCS for b in blocks(doc)]


def _code_lines(text: str) -> list[str]:
    """Code lines, comments dropped; ``from m import a, b`` as one line per name (isort may merge them)."""
    lines = []
    for raw in text.splitlines():
        line = _COMMENT.sub("", raw).strip()
        if not line or line.startswith("URL ="):
            continue
        imported = _FROM_IMPORT.match(line)
        if imported:
            lines += [f"from {imported[1]} import {name.strip()}" for name in imported[2].split(",")]
        else:
            lines.append(line)
    return lines


# --------------------------------------------------------------------------- the markers


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_block_says_what_it_is(doc: Path) -> None:
    problems = []
    for b in blocks(doc):
        if b.kind not in KINDS:
            problems.append(f"{b.where}: no marker (<!-- doc: run|fragment PATH|text -->) on the line before")
        elif b.kind == "fragment":
            if len(b.args) != 1 or not (ROOT / b.args[0]).is_file():
                problems.append(
                    f"{b.where}: fragment of {' '.join(b.args)!r}: no such file in the repository"
                )
                continue
            target = ROOT / b.args[0]
            if target.parent.name == "examples" and target.suffix == ".py":
                have = set(_code_lines(target.read_text()))
                missing = [x for x in _code_lines(b.body) if x not in have]
                if missing:
                    problems.append(f"{b.where}: lines not in {b.args[0]}: {missing}")
        elif b.kind == "install" and (doc != ROOT / "README.md" or b.line != blocks(doc)[0].line):
            problems.append(f"{b.where}: only the README's first block is the install block")
        elif b.kind == "run" and b.lang not in ("bash", "python", "json"):
            problems.append(f"{b.where}: a run block is bash, python or json, not {b.lang or 'unlabelled'}")
    assert not problems, "\n".join(problems)


def test_the_readme_starts_with_the_install_block() -> None:
    first = blocks(ROOT / "README.md")[0]
    assert first.kind == "install" and "pip install" in first.body and "stopserve serve" in first.body


def test_the_docs_say_which_offline_model_each_framework_uses() -> None:
    text = (ROOT / "docs" / "integrations.md").read_text()
    for model in ("ReplayChatCompletionClient", "FakeMessagesListChatModel", "agents.models.interface.Model"):
        assert model in text
    for example in ("autogen_team.py", "langgraph_react.py", "openai_agents_run.py", "loop.py"):
        assert f"examples/{example}" in text


# --------------------------------------------------------------------------- the examples


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """``stopserve serve`` as a new user starts it: the shipped default model, no settings."""
    with LiveServer(log_dir=tmp_path_factory.mktemp("examples-log")) as srv:
        yield srv


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(example: Path, service: LiveServer, tmp_path: Path) -> None:
    env = _clean_env() | {"STOPSERVE_URL": service.url}
    proc = subprocess.run(
        [sys.executable, str(example)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "stop" in proc.stdout, f"{example.name} printed no stop:\n{out}"
    assert "degraded" not in proc.stdout, f"{example.name} did not reach the service:\n{out}"


# --------------------------------------------------------------------------- the runnable blocks


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STOPSERVE_", "CLAUDE_", "CODEX_"))}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


@dataclass
class Session:
    """A scratch folder in which one page's runnable blocks run in order, as a user would."""

    root: Path
    ports: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.work = self.root / "work"
        self.home = self.root / "home"
        self.work.mkdir(parents=True)
        self.home.mkdir()
        for name in LINKED:
            (self.work / name).symlink_to(ROOT / name)
        for name in COPIED:
            shutil.copytree(ROOT / name, self.work / name)
        if SHARED.is_dir():
            (self.root / "shared").symlink_to(SHARED)  # ../shared from the scratch folder

    def port(self, doc_port: str) -> int:
        if doc_port not in self.ports:
            self.ports[doc_port] = free_port()
        return self.ports[doc_port]

    def rewrite(self, text: str) -> str:
        return _PORT.sub(lambda m: str(self.port(m.group(0))), text)

    @property
    def env(self) -> dict[str, str]:
        port = self.port("8080")
        return _clean_env() | {
            "HOME": str(self.home),
            "STOPSERVE_PORT": str(port),
            "STOPSERVE_URL": f"http://127.0.0.1:{port}",
        }

    def bash(self, block: Block) -> subprocess.CompletedProcess[str]:
        lines = []
        for raw in self.rewrite(block.body).splitlines():
            serve = _SERVE.match(raw.strip())
            if serve:
                cmd = serve["cmd"].strip()
                given = re.search(r"--port (\d+)", cmd)
                port = given[1] if given else self.port("8080")
                lines.append(f"{cmd} >> .serve.log 2>&1 & echo $! >> .servers; _up {port}")
            else:
                lines.append(raw)
        script = "\n".join([_PRELUDE, *lines, ""])
        return self._run(["bash", "-c", script])

    def python(self, block: Block) -> subprocess.CompletedProcess[str]:
        path = self.work / f".block-{block.line}.py"
        path.write_text(self.rewrite(block.body))
        return self._run([sys.executable, str(path)])

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT,
            check=False,
        )

    def close(self) -> None:
        pids = self.work / ".servers"
        if not pids.exists():
            return
        for pid in {int(x) for x in pids.read_text().split()}:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(150):  # wait up to 15 s, then kill
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)


_PRELUDE = """set -euo pipefail
_up() {  # wait for the server just started on port $1
  for _ in $(seq 1 1200); do
    curl -sf "http://127.0.0.1:$1/healthz" >/dev/null 2>&1 && return 0
    kill -0 "$(tail -1 .servers)" 2>/dev/null || { tail -20 .serve.log; echo "serve exited"; return 1; }
    sleep 0.1
  done
  tail -20 .serve.log; echo "stopserve serve on port $1: no /healthz in 120 s"; return 1
}"""


def _runnable(slow: bool) -> list[Path]:
    docs = []
    for doc in DOCS:
        runs = [b for b in blocks(doc) if b.kind == "run"]
        if runs and (not slow or any("slow" in b.args for b in runs)):
            docs.append(doc)
    return docs


def _run_page(doc: Path, tmp_path: Path, *, slow: bool) -> None:
    session = Session(tmp_path)
    try:
        for b in blocks(doc):
            if b.kind != "run" or ("slow" in b.args and not slow):
                continue
            if "data" in b.args and not (SHARED / "data").is_dir():
                continue  # ../shared/data absent: the block says it needs it
            if b.lang == "json":
                json.loads(b.body)
                continue
            done = session.python(b) if b.lang == "python" else session.bash(b)
            out = (done.stdout + done.stderr)[-4000:]
            assert done.returncode == 0, f"{b.where}: exit {done.returncode}\n{b.body}\n--- output:\n{out}"
    finally:
        session.close()


@pytest.mark.parametrize("doc", _runnable(slow=False), ids=lambda d: str(d.relative_to(ROOT)))
def test_runnable_blocks_run(doc: Path, tmp_path: Path) -> None:
    _run_page(doc, tmp_path, slow=False)


@pytest.mark.slow
@pytest.mark.parametrize("doc", _runnable(slow=True), ids=lambda d: str(d.relative_to(ROOT)))
def test_runnable_blocks_run_with_the_slow_ones(doc: Path, tmp_path: Path) -> None:
    _run_page(doc, tmp_path, slow=True)


def test_a_serve_line_is_started_in_the_background_on_a_free_port(tmp_path: Path) -> None:
    session = Session(tmp_path)
    body = "stopserve serve --no-model --port 8081   # the service\ncurl -sf localhost:8081/healthz\n"
    try:
        done = session.bash(Block(ROOT / "README.md", 1, "bash", body, "run"))
    finally:
        session.close()
    assert done.returncode == 0, done.stdout + done.stderr
    assert session.ports["8081"] != 8081 and '"status"' in done.stdout


# --------------------------------------------------------------------------- links and the contract

_LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_local_links_resolve_inside_the_repository(doc: Path) -> None:
    bad = []
    prose = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M)
    prose = re.sub(r"`[^`]*`", "", prose)  # code is not a link
    for target in _LINK.findall(prose):
        path = (doc.parent / target.split("#")[0]).resolve()
        if not path.exists() or not path.is_relative_to(ROOT):
            bad.append(target)
    assert not bad, f"{doc.relative_to(ROOT)}: links a clone cannot follow: {bad}"


def test_the_trace_format_contract_is_in_the_repository() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "shared/spec" not in readme
    assert "The contract is\n[docs/trace-format.md](docs/trace-format.md)" in readme
    page = (ROOT / "docs" / "trace-format.md").read_text()
    assert "**This page is the contract**" in page and "shared/spec" not in page
    assert "``docs/trace-format.md``" in (ROOT / "stopserve" / "trace.py").read_text()


def test_the_readme_simulator_commands_agree_and_report_the_optimal_row(tmp_path: Path) -> None:
    """The README's simulate -> train -> evaluate block, on fewer runs: its flags agree, so
    ``evaluate`` reports the simulator's ``optimal`` row (it drops it at another lambda)."""
    (block,) = [b for b in blocks(ROOT / "README.md") if b.kind == "run" and "stopserve simulate" in b.body]
    commands = [_COMMENT.sub("", line).strip() for line in block.body.splitlines() if line.strip()]
    commands = [c.replace("--n 300", "--n 80") for c in commands if c]
    assert commands[-1].startswith("stopserve evaluate")
    commands[-1] += " --json"
    session = Session(tmp_path)
    done = session._run(["bash", "-c", "set -euo pipefail\n" + "\n".join(commands)])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(done.stdout[done.stdout.index("{") :])
    assert "optimal" in report["policies"] and "oracle" in report["policies"]
