"""Progress signals read from a step's text: the one place each extractor lives.

What a tool's output or an orchestrator's answer says about progress, as an event's
``progress`` object (docs/trace-format.md, Progress): test-runner counts, the exit code,
a normalised signature of the error seen, files changed, and an orchestrator's own
verdict (Magentic-One's progress ledger). Only these numbers, flags and a hash leave
the machine, never the text.

>>> extract("======= 12 passed, 1 warning in 0.41s =======")
{'tests_passed': 12, 'tests_failed': 0, 'source': 'pytest'}
>>> extract("<returncode>0</returncode>\\n<output>\\n 2 files changed, 9 insertions(+)\\n</output>")
{'exit_code': 0, 'files_changed': 2, 'source': 'git'}
>>> extract("NameError: name 'x' is not defined")["error"]
'NameError:ab8b0e287d64'

Every extractor reads text as the real tools print it (the tests hold real output of
pytest, unittest, jest, go test, cargo test, mini-swe-agent, InterCode and MINT) and
returns ``None`` where it finds nothing: a missing signal is unknown, never 0. Long
texts are read at their head and tail (:data:`HEAD_CHARS`, :data:`TAIL_CHARS`), where
summaries, exit codes and the raised exception are; cost is linear in what is read.

Standard library only: the hook command (``stopserve hook``) imports this module.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple, TypedDict

__all__ = [
    "FIELDS",
    "HEAD_CHARS",
    "LEDGER_KEYS",
    "TAIL_CHARS",
    "WRITE_TOOLS",
    "Progress",
    "RunnerCounts",
    "error_signature",
    "extract",
    "files_changed",
    "find_exit_code",
    "ledger",
    "ledger_text",
    "normalise_error",
    "progress_fields",
    "runner_counts",
]


class Progress(TypedDict, total=False):
    """An event's ``progress`` object, in its wire form (every key optional)."""

    tests_passed: int
    tests_failed: int
    exit_code: int
    error: str
    files_changed: int
    made_progress: bool
    in_loop: bool
    source: str


#: The keys of an event's ``progress`` object, in wire order (``stopserve.trace.Progress`` has the same).
FIELDS: Final[tuple[str, ...]] = tuple(Progress.__annotations__)

#: Characters read at the start of a long text (exit-code tags come first) ...
HEAD_CHARS: Final = 4096
#: ... and at its end (test summaries and the raised exception come last).
TAIL_CHARS: Final = 65536

#: Tools that write or edit one file per call (Claude Code, the Anthropic and OpenHands editors, ...).
WRITE_TOOLS: Final = frozenset(
    {
        "Write",
        "Edit",
        "MultiEdit",
        "NotebookEdit",
        "str_replace_editor",
        "str_replace_based_edit_tool",
        "edit_file",
        "write_file",
        "create_file",
        "write_to_file",
        "replace_in_file",
    }
)
#: Commands of the editor tools that change a file (``view`` does not).
_EDITOR_WRITES: Final = ("create", "str_replace", "insert", "undo_edit")

_ANSI: Final = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _window(text: str) -> str:
    """The part of ``text`` the extractors read: all of it, or its head and tail."""
    if len(text) > HEAD_CHARS + TAIL_CHARS:
        text = text[:HEAD_CHARS] + "\n" + text[-TAIL_CHARS:]
    return _ANSI.sub("", text) if "\x1b" in text else text


# --------------------------------------------------------------------------- test runners


class RunnerCounts(NamedTuple):
    """A test runner's summary: ``passed`` (``None``: not printed), ``failed`` (failed + errored)."""

    passed: int | None
    failed: int
    source: str
    #: the failing tests' names, as printed (for the error signature)
    failing: tuple[str, ...] = ()


_PYTEST_WORDS: Final = "passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?|rerun"
_PYTEST: Final = re.compile(
    rf"^=*\s*((?:\d+ (?:{_PYTEST_WORDS})(?:, )?)+|no tests ran)\s+in [\d.]+s(?: \([^)\n]*\))?\s*=*\s*$",
    re.MULTILINE,
)
_PYTEST_PART: Final = re.compile(rf"(\d+) ({_PYTEST_WORDS})")
_PYTEST_FAILING: Final = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)
_UNITTEST: Final = re.compile(
    r"^Ran (\d+) tests? in [\d.]+s\s*\n(?:[ \t]*\n)*(OK|FAILED|NO TESTS RAN)\b(?: \(([^)\n]*)\))?",
    re.MULTILINE,
)
_UNITTEST_FAILING: Final = re.compile(r"^(?:FAIL|ERROR): (\S+ \([^)\n]+\))", re.MULTILINE)
_JEST: Final = re.compile(r"^Tests:\s+((?:\d+ \w+, )*)(\d+) total\s*$", re.MULTILINE)
_JEST_FAILING: Final = re.compile(r"^\s*● (?!Console\b)(.+?)\s*$", re.MULTILINE)
_GO_LINE: Final = re.compile(
    r"^(?:--- (PASS|FAIL|SKIP): (\S+)|(ok|FAIL)\s+\S+\s+(?:[\d.]+s|\(cached\)))", re.MULTILINE
)
_CARGO: Final = re.compile(
    r"^test result: (?:ok|FAILED)\. (\d+) passed; (\d+) failed; \d+ ignored; \d+ measured;", re.MULTILINE
)
_CARGO_FAILING: Final = re.compile(r"^test (\S+) \.\.\. FAILED\s*$", re.MULTILINE)


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    found = None
    for found in pattern.finditer(text):  # noqa: B007 - the last one is wanted
        pass
    return found


def _pytest(text: str) -> RunnerCounts | None:
    found = _last(_PYTEST, text)
    if found is None:
        return None
    counts = {
        word.rstrip("s") if word.startswith("error") else word: int(n)
        for n, word in _PYTEST_PART.findall(found.group(1))
    }
    failing = tuple(_PYTEST_FAILING.findall(text, 0, found.start()))
    return RunnerCounts(
        counts.get("passed", 0), counts.get("failed", 0) + counts.get("error", 0), "pytest", failing
    )


def _unittest(text: str) -> RunnerCounts | None:
    found = _last(_UNITTEST, text)
    if found is None:
        return None
    ran = int(found.group(1))
    detail: dict[str, int] = {}
    for part in (found.group(3) or "").split(","):
        key, _, value = part.strip().partition("=")
        if value.isdigit():
            detail[key] = int(value)
    failed = detail.get("failures", 0) + detail.get("errors", 0) + detail.get("unexpected successes", 0)
    not_passed = failed + detail.get("skipped", 0) + detail.get("expected failures", 0)
    failing = tuple(_UNITTEST_FAILING.findall(text, 0, found.start()))
    return RunnerCounts(max(0, ran - not_passed), failed, "unittest", failing)


def _jest(text: str) -> RunnerCounts | None:
    found = _last(_JEST, text)
    if found is None:
        return None
    parts = dict((word, int(n)) for n, word in re.findall(r"(\d+) (\w+)", found.group(1)))
    failing = tuple(_JEST_FAILING.findall(text, 0, found.start()))
    return RunnerCounts(parts.get("passed", 0), parts.get("failed", 0), "jest", failing)


def _go(text: str) -> RunnerCounts | None:
    passed = failed = 0
    seen = False
    failing: list[str] = []
    for found in _GO_LINE.finditer(text):
        seen = True
        verdict, name = found.group(1), found.group(2)
        if verdict == "PASS":
            passed += 1
        elif verdict == "FAIL":
            failed += 1
            failing.append(name)
    if not seen:
        return None
    # without -v, go test prints only failures and one "ok" line per package
    return RunnerCounts(passed if passed else None, failed, "go", tuple(failing))


def _cargo(text: str) -> RunnerCounts | None:
    results = _CARGO.findall(text)
    if not results:
        return None
    return RunnerCounts(
        sum(int(p) for p, _ in results),
        sum(int(f) for _, f in results),
        "cargo",
        tuple(_CARGO_FAILING.findall(text)),
    )


#: Cheap markers that say which runner may have printed a text (checked before its regex).
_RUNNERS: Final = (
    (("test result: ",), _cargo),
    (("Tests:",), _jest),
    ((" passed", " failed", " error", "no tests ran", " skipped", " deselected"), _pytest),
    (("Ran ",), _unittest),
    (("--- PASS", "--- FAIL", "--- SKIP", "ok ", "FAIL\t"), _go),
)


def runner_counts(text: str) -> RunnerCounts | None:
    """Passed and failed counts of a test run's output (pytest, unittest, jest, go test, cargo test).

    >>> runner_counts("Ran 12 tests in 0.051s\\n\\nFAILED (failures=2, skipped=1)")
    RunnerCounts(passed=9, failed=2, source='unittest', failing=())
    """
    window = _window(text)
    for markers, reader in _RUNNERS:
        if any(marker in window for marker in markers):
            found = reader(window)
            if found is not None:
                return found
    return None


# --------------------------------------------------------------------------- exit codes

_EXIT: Final = re.compile(
    r"<returncode>\s*(-?\d+)\s*</returncode>"  # mini-swe-agent
    r"|^(?:Process exited with code|Exit code:?|exit code:?|Command exited with code)\s*(-?\d+)"  # Codex, ...
    r"|\[Command finished with exit code (-?\d+)\]",  # OpenHands
    re.MULTILINE,
)


def find_exit_code(text: str) -> int | None:
    """The exit status a tool result states (mini-swe-agent's ``<returncode>``, Codex's
    ``Process exited with code N``, OpenHands' ``[Command finished with exit code N]``), else ``None``.

    >>> find_exit_code("<returncode>2</returncode>\\n<output>\\nls: cannot access 'x'\\n</output>")
    2
    """
    head = text[:HEAD_CHARS]
    found = _EXIT.search(head) or (_EXIT.search(text[-TAIL_CHARS:]) if len(text) > HEAD_CHARS else None)
    if found is None:
        return None
    return int(next(g for g in found.groups() if g is not None))


# --------------------------------------------------------------------------- error signature

_PY_EXCEPTION: Final = re.compile(
    r"^(?:E\s+)?((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Iteration|Failure|Fault))"
    r"(?::[ \t]*(.*?))?[ \t]*$",
    re.MULTILINE,
)
_TRACEBACK: Final = "Traceback (most recent call last)"
_ERROR_LINE: Final = re.compile(
    r"\b(?:error|exception|fatal|failed|failure|not found|no such file|permission denied|cannot|can't|"
    r"unable to|invalid|unrecognized|unknown|missing|denied|refused|timed out|not defined|undefined|"
    r"segmentation fault|panic|malformed|doesn't exist|does not exist)\b",
    re.IGNORECASE,
)
_PATH: Final = re.compile(r"(?:[A-Za-z]:)?(?:[\w.~@+-]*[/\\])+([\w.@+-]*)")
_HEX: Final = re.compile(r"\b0x[0-9a-fA-F]+\b|\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b")
_NUMBER: Final = re.compile(r"\d+(?:\.\d+)?")
_SPACE: Final = re.compile(r"\s+")
_MAX_SIGNED_CHARS: Final = 512


def normalise_error(line: str) -> str:
    """An error line with what varies between repeats folded: directories (a path keeps its
    file name), hex ids and addresses, numbers (line numbers, times, counts), spacing.

    >>> normalise_error('File "/tmp/tmp8x2k/app.py", line 41: KeyError at 0x7f3a2c1b9e80 after 1.52s')
    'File "app.py", line 0: KeyError at # after 0s'
    """
    text = _PATH.sub(r"\1", line)
    text = _HEX.sub("#", text)
    text = _NUMBER.sub("0", text)
    return _SPACE.sub(" ", text).strip()[:_MAX_SIGNED_CHARS]


def _signed(kind: str, text: str) -> str:
    digest = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=6).hexdigest()
    return f"{kind[:48]}:{digest}"


def error_signature(
    text: str, *, failed: bool | None = None, tests: RunnerCounts | None = None, window: str | None = None
) -> str | None:
    """A short signature of the error ``text`` shows (equal errors, equal signatures), or ``None``.

    ``failed``: the step is known to have failed (``True``), to have succeeded (``False``:
    an exit status 0), or neither (``None``). In order: the failing tests of a test run
    (``tests``: their names, sorted, and the last exception raised; a run without
    failures signs nothing); a Python
    exception, the last one raised (``NameError:<hash>``; in the output of a step known to
    have succeeded only after a traceback); else, for a step that failed, its first line
    that reads as an error, or its last line. The hash covers the normalised line
    (:func:`normalise_error`): the same traceback with another path, address or line
    number signs the same. Never the text.

    >>> error_signature("Error executing query: Table 'shop.orders' doesn't exist", failed=True)
    'error:b7580c62c316'
    """
    window = _window(text) if window is None else window
    found = _last(_PY_EXCEPTION, window)
    if tests is not None:
        if not tests.failed:
            return None
        names = " ".join(sorted({normalise_error(n) for n in tests.failing})) or str(tests.failed)
        raised = normalise_error(found.group(0)) if found is not None else ""
        return _signed("tests", f"{tests.source} {names} {raised}")
    if found is not None and (failed is not False or _TRACEBACK in window):
        name, message = found.group(1), found.group(2) or ""
        return _signed(name.rpartition(".")[2], normalise_error(f"{name}: {message}"))
    if not failed:
        return None
    lines = [line.strip() for line in window.splitlines() if line.strip()]
    if not lines:
        return None
    chosen = next((line for line in lines if _ERROR_LINE.search(line)), lines[-1])
    return _signed("error", normalise_error(chosen))


# --------------------------------------------------------------------------- files changed

_DIFF_STAT: Final = re.compile(
    r"^\s*(\d+) files? changed(?:, \d+ insertions?\(\+\))?(?:, \d+ deletions?\(-\))?\s*$", re.MULTILINE
)
_GIT_STATUS_ENTRY: Final = re.compile(
    r"^\t(?:modified|new file|deleted|renamed|copied|typechange):\s+\S", re.MULTILINE
)
_PATCH_RESULT: Final = re.compile(
    r"^Success\. Updated the following files:\n((?:[AMD] .+\n?)+)", re.MULTILINE
)


def files_changed(text: str, *, tool: str | None = None, tool_input: Any = None) -> int | None:
    """Files a step changed, where its result says so, else ``None``.

    A ``git diff --stat`` summary (``3 files changed, ...``), ``git status`` (its
    staged and unstaged entries), Codex's ``apply_patch`` result (``Success. Updated
    the following files:``), or one file for a write or edit tool (:data:`WRITE_TOOLS`;
    an editor's ``view`` command changes none). The caller passes the tool only for a
    call that did not fail.

    >>> files_changed(" 3 files changed, 10 insertions(+), 2 deletions(-)")
    3
    """
    if tool in WRITE_TOOLS:
        command = tool_input.get("command") if isinstance(tool_input, Mapping) else None
        if isinstance(command, str) and command not in _EDITOR_WRITES:
            return 0
        return 1
    window = _window(text)
    if "changed" in window:
        found = _last(_DIFF_STAT, window)
        if found is not None:
            return int(found.group(1))
    if "Success. Updated the following files:" in window:
        found = _last(_PATCH_RESULT, window)
        if found is not None:
            return sum(1 for line in found.group(1).splitlines() if line.strip())
    if "On branch " in window or "HEAD detached" in window:
        if "nothing to commit" in window:
            return 0
        untracked = 0
        if "Untracked files:" in window:
            section = window.split("Untracked files:", 1)[1]
            untracked = sum(1 for line in section.splitlines() if line.startswith("\t"))
        return len(_GIT_STATUS_ENTRY.findall(window)) + untracked
    return None


# --------------------------------------------------------------------------- one step


def extract(
    text: str | None,
    *,
    tool: str | None = None,
    exit_code: int | None = None,
    failed: bool | None = None,
    tool_input: Any = None,
) -> Progress | None:
    """Every progress signal of one step's output, or ``None`` when it shows none.

    ``tool`` names the tool that produced ``text`` (a write tool counts as one file
    changed), ``exit_code`` its exit status when the caller knows it (else it is read from
    the text), ``failed`` whether the step failed (an error flag: its error is then
    signed even without a recognised exception; ``None``: not known; a non-zero exit
    code is a failure, 0 a success), ``tool_input`` the call's arguments (an editor's
    ``view`` command changes no file). ``source`` names the main extractor:
    the test runner, ``git`` / ``apply_patch`` / ``edit_tool`` for files, ``exit_code``,
    or ``error``.

    >>> extract("Ran 3 tests in 0.002s\\n\\nOK")
    {'tests_passed': 3, 'tests_failed': 0, 'source': 'unittest'}
    >>> extract("", tool="Edit")
    {'files_changed': 1, 'source': 'edit_tool'}
    >>> extract("all good") is None
    True
    """
    body = text or ""
    window = _window(body)
    out: Progress = {}
    source: str | None = None
    tests = runner_counts(window) if window else None
    if tests is not None:
        if tests.passed is not None:
            out["tests_passed"] = tests.passed
        out["tests_failed"] = tests.failed
        source = tests.source
    code = exit_code if exit_code is not None else (find_exit_code(body) if body else None)
    if code is not None:
        out["exit_code"] = code
    if code is not None and failed is None:
        failed = code != 0
    if window:
        error = error_signature(body, failed=failed, tests=tests, window=window)
        if error is not None:
            out["error"] = error
    files = files_changed(window, tool=None if failed else tool, tool_input=tool_input)
    if files is not None:
        out["files_changed"] = files
        if source is None:
            source = "edit_tool" if tool in WRITE_TOOLS else "apply_patch" if "Success." in window else "git"
    if not out:
        return None
    out["source"] = source or ("exit_code" if code is not None else "error")
    return out


def progress_fields(
    text: Any,
    *,
    tool: str | None = None,
    exit_code: int | None = None,
    failed: bool | None = None,
    tool_input: Any = None,
) -> dict[str, Progress]:
    """An event's ``progress`` field for a step's output: ``{"progress": ...}``, or ``{}``.

    :func:`extract` of ``text`` (read only when it is a string), for a producer to spread
    into an event beside :func:`stopserve.ids.content_refs`; ``{}`` when it shows no signal.

    >>> progress_fields("====== 4 passed in 0.30s ======", tool="Bash")
    {'progress': {'tests_passed': 4, 'tests_failed': 0, 'source': 'pytest'}}
    >>> progress_fields({"not": "text"})
    {}
    """
    found = extract(
        text if isinstance(text, str) else None,
        tool=tool,
        exit_code=exit_code,
        failed=failed,
        tool_input=tool_input,
    )
    return {} if found is None else {"progress": found}


# --------------------------------------------------------------------------- orchestrator ledgers

#: Magentic-One's progress-ledger keys and the ``progress`` fields they fill.
LEDGER_KEYS: Final = (("is_progress_being_made", "made_progress"), ("is_in_loop", "in_loop"))


def _verdict(entry: Any) -> bool | None:
    """A ledger entry's boolean answer (``{"answer": true, "reason": ...}``; a bare bool too)."""
    answer = entry.get("answer") if isinstance(entry, Mapping) else entry
    if isinstance(answer, bool):
        return answer
    if isinstance(answer, str) and answer.strip().lower() in ("true", "false"):
        return answer.strip().lower() == "true"
    return None


def ledger(data: Mapping[str, Any]) -> Progress | None:
    """An orchestrator's own progress verdict from Magentic-One's progress ledger, or ``None``.

    The ledger (AutoGen's ``MagenticOneOrchestrator`` asks its model for it every round)
    holds ``is_progress_being_made`` and ``is_in_loop``, each ``{"reason", "answer"}``;
    they become ``made_progress`` and ``in_loop``. The reasons are never kept.

    >>> ledger({"is_in_loop": {"reason": "same search again", "answer": True},
    ...         "is_progress_being_made": {"reason": "...", "answer": False}})
    {'made_progress': False, 'in_loop': True, 'source': 'magentic_one'}
    """
    out: Progress = {}
    for key, name in LEDGER_KEYS:
        verdict = _verdict(data.get(key))
        if verdict is not None:
            out[name] = verdict  # type: ignore[literal-required]
    if not out:
        return None
    out["source"] = "magentic_one"
    return out


_FENCE: Final = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def ledger_text(text: str) -> Progress | None:
    """:func:`ledger` of a model's answer holding the ledger as JSON (bare, or in a code fence)."""
    if "is_in_loop" not in text and "is_progress_being_made" not in text:
        return None
    for candidate in _candidates(text):
        try:
            data = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(data, dict):
            found = ledger(data)
            if found is not None:
                return found
    return None


def _candidates(text: str) -> Iterable[str]:
    yield text
    yield from _FENCE.findall(text)
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        yield text[start : end + 1]
