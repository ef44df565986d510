"""Progress extractors (stopserve.signals.progress), each on real output (tests/signals/data/README.md)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stopserve.signals import progress as P
from stopserve.signals.progress import (
    error_signature,
    extract,
    files_changed,
    ledger,
    ledger_text,
    runner_counts,
)
from stopserve.trace import Event, Progress

DATA = Path(__file__).parent / "data"


def text(name: str) -> str:
    return (DATA / name).read_text()


# --------------------------------------------------------------------------- test runners


@pytest.mark.parametrize(
    ("name", "passed", "failed", "source"),
    [
        # pytest: full summary bar, -q line, errors and skips, warnings, xfail/xpass
        ("tools/pytest-fail.txt", 1, 3, "pytest"),
        ("tools/pytest-q-fail.txt", 1, 3, "pytest"),
        ("tools/pytest-q-pass.txt", 1, 0, "pytest"),
        ("swe-gemini3/pallets__flask-5014.25.txt", 59, 0, "pytest"),
        ("swe-gemini3/pallets__flask-5014.27.txt", 466, 8, "pytest"),
        ("swe-gemini3/psf__requests-2931.57.txt", 85, 81, "pytest"),
        ("swe-gemini3/pydata__xarray-2905.71.txt", 882, 1, "pytest"),
        # unittest (and Django's runner): skipped and expected failures are not passes
        ("tools/unittest-fail.txt", 1, 2, "unittest"),
        ("tools/unittest-pass.txt", 1, 0, "unittest"),
        ("swe-gemini3/django__django-10097.49.txt", 365, 0, "unittest"),
        ("swe-gemini3/django__django-10554.79.txt", 390 - 9 - 2, 0, "unittest"),
        ("swe-gemini3/django__django-11119.47.txt", 1369 - 1 - 1, 1, "unittest"),
        ("swe-gemini3/django__django-14580.47.txt", 0, 1, "unittest"),
        ("tools/jest-fail.txt", 2, 1, "jest"),
        ("tools/jest-pass.txt", 3, 0, "jest"),
        # go test: top-level tests only (a failing subtest fails its parent)
        ("tools/go-fail-v.txt", 1, 2, "go"),
        ("tools/go-fail.txt", None, 2, "go"),
        ("tools/go-pass-v.txt", 3, 0, "go"),
        ("tools/go-pass.txt", None, 0, "go"),
        # cargo: every test binary's result line, doc-tests included
        ("tools/cargo-fail.txt", 1, 1, "cargo"),
        ("tools/cargo-pass.txt", 2, 0, "cargo"),
    ],
)
def test_test_runner_summaries(name: str, passed: int | None, failed: int, source: str) -> None:
    counts = runner_counts(text(name))
    assert counts is not None
    assert (counts.passed, counts.failed, counts.source) == (passed, failed, source)
    out = extract(text(name))
    assert out is not None and out["tests_failed"] == failed and out["source"] == source
    assert out.get("tests_passed") == passed
    assert ("error" in out) == bool(failed)  # a failing run signs its failures, a passing one nothing


def test_failing_tests_are_named_as_printed() -> None:
    assert runner_counts(text("tools/pytest-fail.txt")).failing == (  # type: ignore[union-attr]
        "test_calc.py::test_add_wrong",
        "test_calc.py::test_missing",
        "test_calc.py::test_uses_broken",
    )
    assert runner_counts(text("tools/go-fail.txt")).failing == ("TestAddWrong", "TestTable")  # type: ignore[union-attr]
    assert runner_counts(text("tools/cargo-fail.txt")).failing == ("tests::adds_wrong",)  # type: ignore[union-attr]
    assert runner_counts(text("tools/jest-fail.txt")).failing == ("adds 2 + 2 to equal 5",)  # type: ignore[union-attr]
    assert runner_counts(text("tools/unittest-fail.txt")).failing == (  # type: ignore[union-attr]
        "test_error (__main__.CalcTest.test_error)",
        "test_bad (__main__.CalcTest.test_bad)",
    )


def test_texts_that_are_no_test_run_give_no_counts() -> None:
    for name in ("tools/git-status.txt", "tools/codex-apply-patch.txt", "mint/humaneval-namerror.txt"):
        assert runner_counts(text(name)) is None, name
    assert runner_counts("Ran all test suites.") is None  # jest's last line is not unittest's
    assert runner_counts("the build passed in review") is None


def test_a_summary_beyond_the_window_is_still_read() -> None:
    # a long log: the summary is in its tail
    log = "x" * (P.HEAD_CHARS + P.TAIL_CHARS) + "\n" + text("tools/pytest-q-pass.txt")
    assert extract(log) == {"tests_passed": 1, "tests_failed": 0, "source": "pytest"}
    # what sits between the head and the tail is not read: the cost stays bounded
    middle = "y" * P.HEAD_CHARS + "\n=== 2 passed in 0.1s ===\n" + "y\n" * P.TAIL_CHARS
    assert runner_counts(middle) is None


def test_colours_do_not_hide_a_summary() -> None:
    coloured = "\x1b[32m\x1b[1m3 passed\x1b[0m\x1b[32m in 0.02s\x1b[0m"
    assert extract(coloured) == {"tests_passed": 3, "tests_failed": 0, "source": "pytest"}


# --------------------------------------------------------------------------- exit codes


def test_exit_codes_from_the_text_and_from_the_caller() -> None:
    assert P.find_exit_code(text("swe-gemini3/django__django-14376.11.txt")) == 1
    assert P.find_exit_code(text("swe-gemini3/django__django-11734.13.txt")) == 0
    assert P.find_exit_code("Exit code: 2\nWall time: 0.1 seconds\nOutput:\n") == 2  # Codex's shell output
    assert P.find_exit_code("[Command finished with exit code 127]") == 127  # OpenHands
    assert P.find_exit_code(text("tools/pytest-fail.txt")) is None
    # the caller's exit code wins; a known one with nothing else is still a signal
    assert extract("<returncode>1</returncode>", exit_code=0) == {"exit_code": 0, "source": "exit_code"}
    assert extract("", exit_code=3) == {"exit_code": 3, "source": "exit_code"}
    intercode = json.loads(text("intercode/turns.json"))
    ok = next(t for t in intercode if t["valid_action"])
    assert extract(ok["observation"], exit_code=0) == {"exit_code": 0, "source": "exit_code"}


# --------------------------------------------------------------------------- error signatures


def test_the_same_traceback_with_other_cells_and_counters_signs_the_same() -> None:
    # MINT: one failing assert, three turns: cell numbers and the steps-left counter change
    raws = [text(f"mint/mbpp-3.{j}.txt") for j in (4, 6, 8)]
    assert len(set(raws)) == 3
    sigs = {extract(r)["error"] for r in raws}  # type: ignore[index]
    assert len(sigs) == 1 and next(iter(sigs)).startswith("AssertionError:")


def test_the_same_failing_test_with_another_address_signs_the_same_and_another_error_does_not() -> None:
    a, b = (extract(text(f"swe-gemini3/django__django-13406.{i}.txt")) for i in (19, 39))
    # 0x7aa8... vs 0x7583..., line 30 vs 31
    assert a is not None and b is not None and a["error"] == b["error"]
    # the same test failing for another reason: an OperationalError, then an AssertionError
    c, d = (extract(text(f"swe-gemini3/django__django-12273.{i}.txt")) for i in (7, 13))
    assert c is not None and d is not None and c["error"] != d["error"]
    assert a["error"].startswith("tests:")


def test_python_exceptions_sign_by_their_class_and_never_carry_the_text() -> None:
    cases = {
        "swe-gemini3/django__django-14376.11.txt": "ModuleNotFoundError",
        "swe-gemini3/django__django-13401.27.txt": "NameError",
        "swe-gemini3/django__django-14017.13.txt": "TypeError",  # exit 0, but a traceback was printed
        "mint/humaneval-namerror.txt": "NameError",
        "mint/humaneval-valueerror.txt": "ValueError",
    }
    for name, kind in cases.items():
        sig = extract(text(name))["error"]  # type: ignore[index]
        head, _, digest = sig.partition(":")
        assert head == kind and len(digest) == 12 and int(digest, 16) >= 0, (name, sig)
        assert "MySQLdb" not in sig and "List" not in sig
    other = text("swe-gemini3/django__django-13401.27.txt")
    assert extract(text("mint/humaneval-namerror.txt")) != extract(other)


def test_shell_and_sql_errors_sign_the_line_that_reads_as_an_error() -> None:
    turns = json.loads(text("intercode/turns.json"))
    failed = [t for t in turns if not t["valid_action"]]
    sigs = [extract(t["observation"], failed=True) for t in failed]
    assert all(s is not None and s["error"].startswith("error:") for s in sigs)
    # distinct errors stay distinct: two tables that do not exist are two errors
    assert len({s["error"] for s in sigs if s}) == len(failed)
    # without the failure flag, a shell line is not read as an error (grep output, logs)
    assert extract(failed[0]["observation"]) is None
    assert error_signature("", failed=True) is None


def test_a_successful_step_printing_an_exception_name_signs_nothing() -> None:
    # numpydoc's "Raises" section, as `cat` shows it, with exit status 0
    doc = "Raises\n------\nValueError\n    If the input is empty.\n"
    assert extract(doc, exit_code=0) == {"exit_code": 0, "source": "exit_code"}
    assert extract(doc)["error"].startswith("ValueError:")  # type: ignore[index]  # unknown status: read it


def test_normalise_folds_what_varies_between_repeats() -> None:
    a = P.normalise_error('File "/tmp/tmpab12cd/run.py", line 12, in <module> at 0x7f3a2c1b9e80 (3.2s)')
    b = P.normalise_error('File "/tmp/tmpzz99yy/run.py", line 40, in <module> at 0x7f00aa11bb22 (0.9s)')
    assert a == b == 'File "run.py", line 0, in <module> at # (0s)'
    assert P.normalise_error("KeyError: 'name'") != P.normalise_error("KeyError: 'email'")


# --------------------------------------------------------------------------- files changed


def test_files_changed_from_git_apply_patch_and_edit_tools() -> None:
    assert files_changed(text("tools/git-diff-stat.txt")) == 2
    assert files_changed(text("tools/git-status.txt")) == 4  # staged, unstaged and untracked entries
    assert files_changed(text("swe-gemini3/django__django-11734.13.txt")) == 1  # one untracked file
    assert files_changed(text("swe-gemini3/django__django-15280.181.txt")) == 2
    assert files_changed(text("tools/codex-apply-patch.txt")) == 2
    assert files_changed("On branch main\nnothing to commit, working tree clean\n") == 0
    assert files_changed("", tool="Write") == 1
    assert files_changed("", tool="str_replace_editor", tool_input={"command": "view", "path": "/a"}) == 0
    assert files_changed("", tool="str_replace_editor", tool_input={"command": "create", "path": "/a"}) == 1
    assert files_changed(text("tools/pytest-fail.txt")) is None
    assert extract(text("tools/codex-apply-patch.txt")) == {"files_changed": 2, "source": "apply_patch"}
    # a failed edit changed nothing known
    assert extract("String to replace not found in file.", tool="Edit", failed=True)["source"] == "error"  # type: ignore[index]


# --------------------------------------------------------------------------- ledgers


def test_magentic_one_ledger() -> None:
    entry = {
        "is_request_satisfied": {"reason": "not yet", "answer": False},
        "is_in_loop": {"reason": "the same search three times", "answer": True},
        "is_progress_being_made": {"reason": "no new facts", "answer": False},
        "next_speaker": {"reason": "...", "answer": "WebSurfer"},
        "instruction_or_question": {"reason": "...", "answer": "Search again"},
    }
    assert ledger(entry) == {"made_progress": False, "in_loop": True, "source": "magentic_one"}
    as_text = json.dumps(entry)
    assert ledger_text(as_text) == ledger(entry)
    assert ledger_text(f"Here it is:\n```json\n{as_text}\n```") == ledger(entry)
    assert ledger_text('{"is_in_loop": {"answer": "false"}}') == {"in_loop": False, "source": "magentic_one"}
    assert ledger_text("The plan: 1. search 2. summarise") is None
    assert ledger_text('{"is_in_loop": {"answer": "maybe"}}') is None
    assert ledger({"next_speaker": {"answer": "Coder"}}) is None


# --------------------------------------------------------------------------- the contract


def test_every_output_validates_as_an_event_progress() -> None:
    for path in sorted(DATA.rglob("*.txt")):
        out = extract(path.read_text())
        if out is not None:
            event = Event.model_validate({"id": "e", "t": 0, "type": "return", "agent": "a", "progress": out})
            assert event.dump()["progress"] == out
    assert tuple(Progress.model_fields) == P.FIELDS


def test_progress_fields_is_the_event_field_of_extract_or_nothing() -> None:
    failing = text("tools/pytest-q-fail.txt")
    found = P.progress_fields(failing, tool="Bash", exit_code=1)
    assert found == {"progress": extract(failing, tool="Bash", exit_code=1)}
    assert found["progress"]["exit_code"] == 1 and found["progress"]["tests_failed"] == 3
    assert P.progress_fields("a.py\nb.py\n") == {}  # no signal: no field, never an empty object
    assert P.progress_fields({"stdout": failing}) == {}  # not text: not read
    assert P.progress_fields(None, tool="Write") == {"progress": {"files_changed": 1, "source": "edit_tool"}}


def test_the_module_imports_only_the_standard_library() -> None:
    code = (
        "import sys; import stopserve.signals.progress; "
        "bad = [m for m in ('pydantic', 'numpy', 'orjson', 'stopserve.trace') if m in sys.modules]; "
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- the shared data, whole


def _swe_observations(swe_dir: Path) -> list[str]:
    texts: list[str] = []
    for path in sorted((swe_dir / "trajs").glob("*.traj.json")):
        for msg in json.loads(path.read_text())["messages"][2:]:
            if msg["role"] == "user" and isinstance(msg["content"], str):
                texts.append(msg["content"])
    return texts


def test_every_returncode_and_test_summary_of_the_swe_runs_is_read(swe_dir: Path) -> None:
    texts = _swe_observations(swe_dir)
    with_code = [t for t in texts if "<returncode>" in t]
    assert len(with_code) > 10_000
    assert all((extract(t) or {}).get("exit_code") is not None for t in with_code)
    unittest_runs = [t for t in texts if "\nRan " in t and ("\nOK" in t or "\nFAILED (" in t)]
    assert unittest_runs and all((extract(t) or {}).get("source") == "unittest" for t in unittest_runs), (
        "a unittest summary was missed"
    )
    pytest_runs = [t for t in texts if " passed" in t and "=====" in t and " in " in t]
    read = [t for t in pytest_runs if (extract(t) or {}).get("source") == "pytest"]
    assert len(read) >= 100


def test_signatures_fold_repeats_that_hashes_miss(mint_dir: Path) -> None:
    # the real MINT code runs: many more distinct observation texts than distinct errors
    raw: set[str] = set()
    signed: set[str] = set()
    for path in sorted(
        mint_dir.glob("CodeLlama-13b-Instruct-hf/F=None/*/code_generation/*/results.jsonl.gz")
    ):
        with gzip.open(path, "rt") as fh:
            for line in fh:
                for msg in json.loads(line)["state"]["history"]:
                    content: Any = msg["content"]
                    if msg["role"] == "user" and content.startswith("Observation") and "Error" in content:
                        out = extract(content)
                        if out and "error" in out:
                            raw.add(content)
                            signed.add(out["error"])
    assert len(raw) > 100
    assert len(signed) < 0.8 * len(raw)
