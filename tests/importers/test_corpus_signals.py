"""The real corpora's importers (MINT, InterCode, mini-swe-agent) carry what the texts show:
a sketch on every event whose text the source holds, a ``progress`` object on the returns
whose output shows one (exit codes, test counts, error signatures), and with
``sketch=False`` (``stopserve import --no-sketch``) no sketch and nothing else changed.

On the real runs in ../shared/data (skipped without them); the steps checked are the ones
whose text tests/signals/data holds (its README names file, run and turn)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from stopserve.cli import main
from stopserve.importers import IMPORTERS, mint
from stopserve.signals.progress import extract
from stopserve.trace import Event, Trace, read_traces

ROOT = Path(__file__).resolve().parents[2]
SIGNALS = ROOT / "tests" / "signals" / "data"
CODELLAMA = "CodeLlama-13b-Instruct-hf/F=None/max5_p2+tool+cd/code_generation"


def _text(name: str) -> str:
    return (SIGNALS / name).read_text()


def _mint_run(mint_dir: Path, family: str, index: int) -> Trace:
    path = mint_dir / CODELLAMA / family / "results.jsonl.gz"
    with gzip.open(path, "rb") as fh:
        line = fh.read().splitlines()[index]
    return mint.convert(json.loads(line), mint.parse_path(path), file=path, line=index + 1)


def _by_id(trace: Trace) -> dict[str, Event]:
    return {e.id: e for e in trace.events}


def _with_text(traces: list[Trace]) -> list[Event]:
    return [e for t in traces for e in t.events if e.content_ref is not None]


def _without(event: Event, *fields: str) -> dict[str, Any]:
    return {k: v for k, v in event.model_dump().items() if k not in fields}


# --------------------------------------------------------------------------- MINT


def test_mint_exceptions_are_signed_on_the_return(mint_dir: Path) -> None:
    # humaneval line 7: a NameError after the first action, a ValueError after the fourth
    events = _by_id(_mint_run(mint_dir, "humaneval", 6))
    first, fourth = events["turn1.env"], events["turn4.env"]
    assert first.error and first.progress is not None and fourth.progress is not None
    assert first.progress.error == extract(_text("mint/humaneval-namerror.txt"))["error"]  # type: ignore[index]
    assert first.progress.error.startswith("NameError:") and first.progress.source == "error"
    assert fourth.progress.error.startswith("ValueError:")  # type: ignore[union-attr]
    # a clean observation shows nothing: no progress at all, never an empty one
    assert events["turn2.env"].error is False and events["turn2.env"].progress is None
    assert all(e.sketch is not None for e in events.values() if e.content_ref is not None)


def test_mint_the_same_failing_assert_signs_the_same_while_the_refs_differ(mint_dir: Path) -> None:
    # mbpp line 4: one failing assert in cells 2, 3 and 4 (tests/signals/data/mint/mbpp-3.*.txt)
    events = _by_id(_mint_run(mint_dir, "mbpp", 3))
    returns = [events[f"turn{k}.env"] for k in (2, 3, 4)]
    assert len({e.content_ref for e in returns}) == 3
    signatures = {e.progress.error for e in returns if e.progress is not None}
    assert len(signatures) == 1 and next(iter(signatures)).startswith("AssertionError:")  # type: ignore[union-attr]
    assert signatures == {extract(_text("mint/mbpp-3.4.txt"))["error"]}  # type: ignore[index]


def test_mint_every_error_return_carries_a_signature(mint_dir: Path) -> None:
    traces = list(mint.read([mint_dir / CODELLAMA]))  # humaneval and mbpp
    returns = [e for t in traces for e in t.events if e.type == "return"]
    errors = [e for e in returns if e.error]
    assert len(errors) > 50
    assert all(e.progress is not None and e.progress.error for e in errors)
    assert all(e.progress is None or e.progress.error is None for e in returns if not e.error)


# --------------------------------------------------------------------------- InterCode


def test_intercode_valid_shell_actions_exit_0_and_errors_are_signed(intercode_dir: Path) -> None:
    turns = json.loads(_text("intercode/turns.json"))
    for file in sorted({t["file"] for t in turns}):
        stem = Path(file).name.removesuffix(".json.gz")
        traces = {t.trace_id.rsplit("/", 1)[1]: t for t in IMPORTERS["intercode"]([intercode_dir / file])}
        for turn in (t for t in turns if t["file"] == file):
            trace = traces[turn["run"]]
            assert trace.trace_id.endswith(f"/{stem}/{turn['run']}")
            ret = _by_id(trace)[f"turn{turn['turn'] + 1}.env"]
            assert ret.progress is not None and ret.sketch is not None, (file, turn["run"], turn["turn"])
            if turn["valid_action"]:
                assert ret.progress.exit_code == 0 and ret.progress.error is None
            else:
                # the shell's code of a failure is not logged: no exit code, the error line signed
                assert ret.progress.exit_code is None and ret.progress.error is not None
                assert ret.progress.error == extract(turn["observation"], failed=True)["error"]  # type: ignore[index]
                assert ret.progress.error.startswith("error:")


def test_intercode_sql_gives_no_exit_code(intercode_dir: Path) -> None:
    (trace, *_) = IMPORTERS["intercode"](
        [intercode_dir / "sql/gpt-4/ic_sql_multiturn_gpt-4_10_turns.json.gz"]
    )
    returns = [e for e in trace.events if e.type == "return"]
    assert returns and all(e.progress is None or e.progress.exit_code is None for e in returns)


# --------------------------------------------------------------------------- mini-swe-agent


def _swe_step(swe_dir: Path, instance: str, observation_index: int) -> Event:
    """The return of the step whose observation is ``messages[observation_index]``."""
    (trace,) = IMPORTERS["mini-swe-agent"]([swe_dir / "trajs" / f"{instance}.traj.json"])
    events = trace.events
    for i, event in enumerate(events):
        if event.type == "tool_use" and getattr(event, "source_index", None) == observation_index - 1:
            assert events[i + 1].type == "return"
            return events[i + 1]
    raise AssertionError(f"{instance}: no step answered by messages[{observation_index}]")


@pytest.mark.parametrize(
    ("instance", "index", "want"),
    [
        # Django's unittest runner, exit 0
        (
            "django__django-10097",
            49,
            {"tests_passed": 365, "tests_failed": 0, "exit_code": 0, "source": "unittest"},
        ),
        # pytest's summary line
        ("pallets__flask-5014", 25, {"tests_passed": 59, "tests_failed": 0, "source": "pytest"}),
        # exit 1 and the exception raised
        ("django__django-14376", 11, {"exit_code": 1, "source": "exit_code"}),
    ],
)
def test_swe_outputs_give_their_progress(
    swe_dir: Path, instance: str, index: int, want: dict[str, Any]
) -> None:
    ret = _swe_step(swe_dir, instance, index)
    assert ret.progress is not None and ret.sketch is not None
    got = ret.progress.model_dump(exclude_none=True)
    assert {k: got.get(k) for k in want} == want, got
    if instance == "django__django-14376":
        assert ret.error and got["error"].startswith("ModuleNotFoundError:")
        assert getattr(ret, "returncode", None) == 1


def test_swe_every_returncode_becomes_the_exit_code(swe_dir: Path) -> None:
    traces = list(
        IMPORTERS["mini-swe-agent"](
            [swe_dir / "trajs" / f"{i}.traj.json" for i in ("django__django-10097", "django__django-14376")]
        )
    )
    returns = [e for t in traces for e in t.events if e.type == "return"]
    with_code = [e for e in returns if getattr(e, "returncode", None) is not None]
    assert len(with_code) > 20
    assert all(e.progress is not None and e.progress.exit_code == e.returncode for e in with_code)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- sketch=False


def _sources(mint_dir: Path, intercode_dir: Path, swe_dir: Path) -> list[tuple[str, Path]]:
    return [
        ("mint", mint_dir / CODELLAMA / "humaneval" / "results.jsonl.gz"),
        ("intercode", intercode_dir / "bash/gpt-4/ic_bash_multiturn_gpt-4_10_turns_fs_1.json.gz"),
        ("mini-swe-agent", swe_dir / "trajs" / "django__django-10097.traj.json"),
    ]


def test_sketch_false_leaves_only_the_sketches_out(
    mint_dir: Path, intercode_dir: Path, swe_dir: Path
) -> None:
    for fmt, src in _sources(mint_dir, intercode_dir, swe_dir):
        with_ = list(IMPORTERS[fmt]([src]))
        without = list(IMPORTERS[fmt]([src], sketch=False))
        events = _with_text(with_)
        assert events and all(e.sketch is not None for e in events if e.type != "stop"), fmt
        assert any(e.progress is not None for e in events), fmt
        assert not any(e.sketch for t in without for e in t.events), fmt
        assert len(with_) == len(without)
        for a, b in zip(with_, without, strict=True):
            assert [e.content_ref for e in a.events] == [e.content_ref for e in b.events], fmt
            assert [e.progress for e in a.events] == [e.progress for e in b.events], fmt
            assert [_without(e, "sketch") for e in a.events] == [_without(e, "sketch") for e in b.events]


def test_import_no_sketch_does_not_compute_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stopserve.signals import sketch

    sample = ROOT / "examples" / "mint-sample"
    assert main(["import", "mint", str(sample), "-o", str(tmp_path / "with.jsonl"), "--no-progress"]) == 0

    def refuse(text: str) -> str:
        raise AssertionError("a text was sketched under --no-sketch")

    monkeypatch.setattr(sketch, "sketch", refuse)
    out = tmp_path / "without.jsonl"
    assert main(["import", "mint", str(sample), "-o", str(out), "--no-sketch", "--no-progress"]) == 0
    with_, without = list(read_traces(tmp_path / "with.jsonl")), list(read_traces(out))
    assert any(e.sketch for t in with_ for e in t.events)
    assert not any(e.sketch for t in without for e in t.events)
    assert any(e.progress for t in without for e in t.events)  # progress stays on
    assert [e.content_ref for t in with_ for e in t.events] == [
        e.content_ref for t in without for e in t.events
    ]


def test_swe_agent_editor_views_change_no_file(tmp_path: Path) -> None:
    steps = [
        ("str_replace_editor view /repo/app.py", "Here's the result of running `cat -n` on /repo/app.py"),
        (
            "str_replace_editor str_replace /repo/app.py --old_str a --new_str b",
            "The file /repo/app.py has been edited.",
        ),
        ("python -m pytest -q", "1 failed, 3 passed in 0.12s"),
        ("submit", ""),
    ]
    traj = {
        "trajectory": [{"action": a, "observation": o, "execution_time": 1.0} for a, o in steps],
        "info": {},
    }
    path = tmp_path / "run-1.traj"
    path.write_text(json.dumps(traj))
    (trace,) = IMPORTERS["mini-swe-agent"]([path])
    got = [e.progress for e in trace.events if e.type == "return"]
    assert [p.files_changed if p else None for p in got] == [0, 1, None]
    assert got[2] is not None and (got[2].tests_passed, got[2].tests_failed) == (3, 1)
