"""MINT importer: on hand-written runs, on the shipped sample, and on the real shared runs.

The hand-written runs follow MINT's own output code (mint-bench ``mint/envs/general_env.py``
and ``mint/datatypes.py``): a line is ``{"task": {...}, "state": {...}}``; ``state.history``
starts with the user's task prompt; the model's replies are ``assistant`` messages
(``"Assistant:\\n" + reply``), each answered by a ``user`` message built by
``StepOutput.to_str``: ``"Observation:\\n" + observation + "\\n"`` (``"Your answer is
wrong.\\n"`` for a wrong proposal), the count-down ``"You have N steps left and M chances to
propose solution left.\\n"`` (plus ``"You should take the last step to propose a
solution.\\n"`` when one step is left), and in two-agent runs ``"\\nExpert feedback:\\n" +
feedback + "\\n"``. Nothing is logged after the action that ends a run, and an empty reply
is not logged at all (two user messages in a row).
"""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from stopserve.cli import main
from stopserve.errors import ImporterError
from stopserve.ids import content_ref
from stopserve.importers import IMPORTERS
from stopserve.importers.mint import apportion, is_error_output, parse_path, read
from stopserve.trace import Trace, read_traces

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "mint-sample"
SOLO = "gpt-4-0613/F=None/max5_p2+tool+cd/reasoning/gsm8k/results.jsonl"
DUO = "claude-2/F=gpt-4-0613/PHF=no_GT-textual/max5_p2+tool+cd/reasoning/gsm8k/results.jsonl"
PROMPT = "You are a helpful assistant ...\n---\nTask:\nWhat is 1 + 2?\n"
INVALID = (
    "I don't understand your input. \nIf you want to execute code, please use <execute> YOUR_CODE_HERE "
    "</execute>.\nIf you want to give me an answer, please use <solution> YOUR_SOLUTION_HERE </solution>.\n"
)


def observation(text: str | None, steps: int, proposals: int, feedback: str | None = None) -> str:
    """A user message as MINT's ``StepOutput.to_str`` writes it."""
    out = "Observation:\n" + ("Your answer is wrong.\n" if text is None else text + "\n")
    out += f"You have {steps} steps left and {proposals} chances to propose solution left.\n"
    if steps <= 1:
        out += "You should take the last step to propose a solution.\n"
    if feedback:
        out += "\nExpert feedback:\n" + feedback + "\n"
    return out


def run(
    history: list[tuple[str, str]],
    *,
    success: bool,
    terminate: str,
    counter: dict[str, int] | None = None,
    task_id: Any = 7,
) -> dict[str, Any]:
    return {
        "task": {"task_name": "reasoning", "task_id": task_id, "prompt": "What is 1 + 2?", "reference": "3"},
        "state": {
            "history": [{"role": role, "content": content} for role, content in history],
            "finished": True,
            "success": success,
            "agent_action_count": {},
            "token_counter": counter or {},
            "terminate_reason": terminate,
            "error": None,
        },
    }


def write(root: Path, rel: str, records: list[Any], *, gz: bool = False) -> Path:
    path = root / (rel + ".gz" if gz else rel)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records).encode()
    path.write_bytes(gzip.compress(blob) if gz else blob)
    return path


SOLVED = [
    ("user", PROMPT),
    ("assistant", "Assistant:\n<thought> try </thought>\n<execute>\nprint(1/0)\n</execute>\n"),
    (
        "user",
        observation(
            "---------\nZeroDivisionError      Traceback (most recent call last)\nCell In[1], line 1\n"
            "----> 1 print(1/0)\n\nZeroDivisionError: division by zero",
            4,
            2,
        ),
    ),
    ("assistant", "Assistant:\n<execute> print(1 + 1) </execute>\n"),
    ("user", observation("2", 3, 2)),
    ("assistant", "Assistant:\nThe answer is <solution> 2 </solution>.\n"),
    ("user", observation(None, 2, 1)),
    ("assistant", "Assistant:\nLet me think about it again.\n"),
    ("user", observation(INVALID, 1, 1)),
    ("assistant", "Assistant:\nThe answer is <solution> 3 </solution>.\n"),
]


def test_single_agent_run_maps_every_turn(tmp_path: Path) -> None:
    counter = {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100}
    path = write(tmp_path, SOLO, [run(SOLVED, success=True, terminate="task_success", counter=counter)])
    (trace,) = read([tmp_path])
    kinds = [(e.type, e.agent, e.t) for e in trace.events]
    m = "gpt-4-0613"
    assert kinds == [
        ("tool_use", m, 0),
        ("return", "env", 0),
        ("tool_use", m, 1),
        ("return", "env", 1),
        ("stop", m, 2),
        ("reward", "env", 2),
        ("communicate", m, 3),
        ("return", "env", 3),
        ("stop", m, 4),
        ("reward", "env", 4),
        ("stop", "env", 4),
    ]
    ev = trace.events
    assert ev[0].tool == "python" and ev[0].content_ref == content_ref("print(1/0)")
    assert ev[1].error is True and ev[3].error is False
    assert ev[3].content_ref == content_ref("2")  # the count-down line is not part of the output
    assert ev[4].proposed is True and ev[4].reason == "information_complete" and ev[4].grade == 0.0
    assert ev[4].content_ref == content_ref("2")  # the proposed answer equals the observed output
    assert ev[5].value == 0.0 and ev[5].channel == "quality"
    assert ev[7].error is True and ev[6].to == "env"
    assert ev[8].proposed is True and ev[8].grade == 1.0 and ev[8].content_ref == content_ref("3")
    assert ev[9].value == 1.0 and ev[9].grade == 1.0
    assert ev[10].proposed is False and ev[10].reason == "quality_met"
    assert trace.stop is not None and trace.stop.reason == "quality_met" and trace.stop.t == 4
    assert trace.budget is None
    assert trace.trace_id == "mint/gpt-4-0613/None/gsm8k/7" and trace.task_id == "mint/gsm8k/7"
    assert trace.system == "mint/gpt-4-0613" and trace.topology == "harness"
    assert trace.rewards == {"team": 1.0}
    assert trace.metrics["max_turns"] == 5 and trace.metrics["max_proposals"] == 2
    assert trace.metrics["two_agent"] == 0 and trace.metrics["tokens_estimated"] == 0
    assert (trace.metrics["tool_calls"], trace.metrics["proposals"], trace.metrics["invalid_actions"]) == (
        2,
        2,
        1,
    )
    # tokens: prompt by the characters read before each turn, completion by those written
    contexts, written, seen = [], [], len(PROMPT)
    for role, content in SOLVED[1:]:
        if role == "assistant":
            contexts.append(seen)
            written.append(len(content))
        seen += len(content)
    prompt = [1000 * c // sum(contexts) for c in contexts]
    prompt[-1] += 1000 - sum(prompt)
    completion = [100 * w // sum(written) for w in written]
    completion[-1] += 100 - sum(completion)
    acts = [e for e in ev if e.agent == m]
    assert [e.tokens for e in acts] == [p + c for p, c in zip(prompt, completion, strict=True)]
    assert trace.costs["tokens"] == 1100
    assert path.name == "results.jsonl"


def test_two_agent_feedback_comes_before_the_environment(tmp_path: Path) -> None:
    history = [
        ("user", PROMPT),
        ("assistant", "Assistant:\n<execute> print(3) </execute>\n"),
        ("user", observation("3", 4, 2, feedback="Good. Now propose it.")),
        ("assistant", "Assistant:\nThe answer is <solution> 4 </solution>.\n"),
        ("user", observation(None, 3, 1, feedback="That is not what you printed.")),
        ("assistant", "Assistant:\nThe answer is <solution> 3 </solution>.\n"),
    ]
    counter = {
        "prompt_tokens": 900,
        "completion_tokens": 90,
        "feedback_prompt_tokens": 500,
        "feedback_completion_tokens": 40,
        "feedback_total_tokens": 540,
    }
    write(tmp_path, DUO, [run(history, success=True, terminate="task_success", counter=counter)])
    (trace,) = read([tmp_path])
    assert trace.topology == "planner_executor_critic" and trace.metrics["two_agent"] == 1
    assert trace.trace_id == "mint/claude-2/gpt-4-0613/no_GT-textual/gsm8k/7"
    types = [(e.type, e.agent) for e in trace.events]
    assert types[:6] == [
        ("tool_use", "claude-2"),
        ("communicate", "feedback:gpt-4-0613"),
        ("return", "env"),
        ("stop", "claude-2"),
        ("communicate", "feedback:gpt-4-0613"),
        ("reward", "env"),
    ]
    fb = [e for e in trace.events if e.agent == "feedback:gpt-4-0613"]
    assert [e.content_ref for e in fb] == [
        content_ref("Good. Now propose it."),
        content_ref("That is not what you printed."),
    ]
    assert all(e.role == "critic" and e.to == "claude-2" for e in fb)
    assert sum(e.tokens or 0 for e in fb) == 540 == trace.metrics["feedback_tokens"]
    assert sum(e.tokens or 0 for e in trace.events if e.agent == "claude-2") == 990
    assert trace.events[2].content_ref == content_ref("3")  # feedback is not part of the output


def test_missing_counters_are_estimated_at_four_characters_a_token(tmp_path: Path) -> None:
    history = [("user", PROMPT), ("assistant", "Assistant:\nThe answer is <solution> 3 </solution>.\n")]
    write(tmp_path, SOLO, [run(history, success=True, terminate="task_success")])
    (trace,) = read([tmp_path])
    assert trace.metrics["tokens_estimated"] == 1
    assert trace.events[0].tokens == math.ceil(len(PROMPT) / 4) + math.ceil(len(history[1][1]) / 4)


def test_unrecorded_actions_and_budget_end(tmp_path: Path) -> None:
    # an empty reply leaves two user messages in a row; a final user message means one more
    history = [
        ("user", PROMPT),
        ("assistant", "Assistant:\n[PYTHON]print(3)[/PYTHON]\n"),
        ("user", observation(INVALID, 4, 2)),
        ("user", observation(INVALID, 3, 2)),
        ("assistant", "Assistant:\n<execute> print(3) </execute>\n"),
        ("user", observation("3", 2, 2)),
        ("assistant", "Assistant:\n<execute> print(3) </execute>\n"),
        ("user", observation("3", 1, 2)),
    ]
    write(tmp_path, SOLO, [run(history, success=False, terminate="max_steps")])
    (trace,) = read([tmp_path])
    kinds = [(e.type, getattr(e, "missing", None)) for e in trace.events]
    assert kinds == [
        ("communicate", None),
        ("return", None),
        ("communicate", True),
        ("return", None),
        ("tool_use", None),
        ("return", None),
        ("tool_use", None),
        ("return", None),
        ("communicate", True),
        ("stop", None),
    ]
    assert trace.events[2].content_ref == content_ref("")
    assert trace.events[1].content_ref == trace.events[3].content_ref  # same text, other count-down
    assert trace.events[5].content_ref == trace.events[7].content_ref
    assert trace.stop is not None and (trace.stop.reason, trace.stop.limit) == ("budget_exhausted", "turns")
    assert trace.metrics["missing_actions"] == 2 and trace.rewards == {"team": 0.0}
    # an error ends the run without a further action
    write(tmp_path, SOLO, [run(history, success=False, terminate="error")])
    (trace,) = read([tmp_path])
    assert [e.type for e in trace.events][-2:] == ["return", "stop"]
    assert trace.stop is not None and (trace.stop.reason, trace.stop.by) == ("error", "external")


def test_gzipped_and_plain_files_import_identically(tmp_path: Path) -> None:
    record = run(SOLVED, success=True, terminate="task_success", counter={"prompt_tokens": 10})
    write(tmp_path / "a", SOLO, [record])
    write(tmp_path / "b", SOLO, [record], gz=True)
    (plain,) = read([tmp_path / "a"])
    (zipped,) = read([tmp_path / "b"])
    assert plain.dump() == zipped.dump()


def test_malformed_lines_are_skipped_and_counted(tmp_path: Path, capsys) -> None:
    good = run(SOLVED, success=True, terminate="task_success")
    bad_history = run(SOLVED, success=True, terminate="task_success")
    bad_history["state"]["history"][0]["role"] = "system"
    no_success = run(SOLVED, success=True, terminate="task_success")
    del no_success["state"]["success"]
    path = write(tmp_path, SOLO, [good, "{oops", bad_history, [1, 2], no_success, good])
    out = tmp_path / "out.jsonl"
    rc = main(["import", "mint", str(tmp_path), "-o", str(out), "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0  # the rest was written; --strict would exit 1
    assert "imported 2 traces" in captured.out and "skipped 4" in captured.out
    assert f"{path}:2: not valid JSON" in captured.err
    assert f"{path}:3: state.history[0].role: role 'system' is not user or assistant" in captured.err
    assert f"{path}:4: expected a JSON object, got list" in captured.err
    assert f"{path}:5: state.success: expected true or false" in captured.err
    assert main(["validate", str(out)]) == 0


def test_path_layout(tmp_path: Path, capsys) -> None:
    where = parse_path(
        "data/Llama-2-7b-hf/F=gpt-4-0613/PHF=no_GT-textual/max5_p2+tool+cd/code/mbpp/results.jsonl"
    )
    assert (where.model, where.feedback, where.phf, where.family) == (
        "Llama-2-7b-hf",
        "gpt-4-0613",
        "no_GT-textual",
        "mbpp",
    )
    assert (where.max_turns, where.max_proposals, where.task_type, where.two_agent) == (5, 2, "code", True)
    solo = parse_path("x/gpt-4-0613/F=None/max3_p1/reasoning/math/results.jsonl.gz")
    assert (solo.model, solo.feedback, solo.phf, solo.max_turns, solo.two_agent) == (
        "gpt-4-0613",
        "None",
        None,
        3,
        False,
    )
    for bad in ("results.jsonl", "a/b/max5_p2/c/d/results.jsonl", "m/F=None/five/c/d/results.jsonl"):
        with pytest.raises(ImporterError, match="does not follow the MINT layout"):
            parse_path(bad)
    # a file named directly must follow the layout; a folder walk skips it and goes on
    good = write(tmp_path, SOLO, [run(SOLVED, success=True, terminate="task_success")])
    stray = write(tmp_path, "stray/results.jsonl", [run(SOLVED, success=True, terminate="task_success")])
    out = tmp_path / "o.jsonl"
    assert main(["import", "mint", str(stray), "-o", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert str(stray) in err and "does not follow the MINT layout" in err and "Traceback" not in err
    assert main(["import", "mint", str(tmp_path), "-o", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "imported 1 traces" in captured.out and f"skipped: {stray}: path does not follow" in captured.err
    assert [t.trace_id for t in read_traces(out)] == ["mint/gpt-4-0613/None/gsm8k/7"]
    assert good.is_file()


def test_error_rule_and_apportion() -> None:
    assert is_error_output("  Cell In[1], line 1\n    x = \n        ^\nSyntaxError: invalid syntax")
    assert is_error_output("Traceback (most recent call last):\n  File ...")
    assert is_error_output("File <fstring>:1\n    (x 1)\n       ^\nSyntaxError: invalid syntax")
    assert not is_error_output("On the countertop 1, you see a mug 1.")
    assert not is_error_output("[Executed Successfully with No Output]")
    assert not is_error_output("The error is small: 0.01")
    assert apportion(10, [1, 1, 1]) == [3, 3, 4]
    assert apportion(7, [0, 0]) == [0, 7]
    assert apportion(5, []) == []
    assert sum(apportion(12345, [3, 1, 4, 1, 5, 9, 2, 6])) == 12345


def test_registered_and_lazy() -> None:
    assert "mint" in IMPORTERS
    traces = list(IMPORTERS["mint"]([SAMPLE]))
    assert len(traces) == 36


# --------------------------------------------------------------------------- the shipped sample


def _source_lines(root: Path) -> list[dict[str, Any]]:
    lines = []
    for path in sorted(root.rglob("results.jsonl*")):
        with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as fh:
            lines.extend(json.loads(line) for line in fh if line.strip())
    return lines


def test_sample_imports_from_a_fresh_clone(tmp_path: Path, capsys) -> None:
    out = tmp_path / "mint.jsonl"
    assert main(["import", "mint", str(SAMPLE), "-o", str(out), "--no-progress"]) == 0
    assert "imported 36 traces" in capsys.readouterr().out
    traces = list(read_traces(out, strict=True))
    source = _source_lines(SAMPLE)
    assert len(traces) == len(source) == 36
    assert sum(t.rewards["team"] for t in traces) == sum(s["state"]["success"] for s in source) == 13
    assert {t.metrics["two_agent"] for t in traces} == {0.0, 1.0}
    assert len({t.system for t in traces}) == 3
    assert len({t.task_id.split("/")[1] for t in traces}) == 3
    assert (SAMPLE / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert sum(p.stat().st_size for p in SAMPLE.rglob("*") if p.is_file()) < 300_000


# --------------------------------------------------------------------------- the real shared runs

#: one file per quirk: plain counters, no counters (claude), PaLM's token_count and a run
#: with no reply at all (chat-bison math line 77), two user messages in a row (CodeLlama),
#: fenced python blocks (Eurus), runs ending in a user message (Llama-2-13b-chat mbpp),
#: sparse feedback without feedback counters (chat-bison PHF=...-sparse), alfworld
REAL_FILES = [
    "gpt-4-0613/F=None/max5_p2+tool+cd/reasoning/gsm8k/results.jsonl.gz",
    "gpt-4-0613/F=gpt-4-0613/PHF=no_GT-textual/max5_p2+tool+cd/reasoning/math/results.jsonl.gz",
    "claude-2/F=gpt-4-0613/PHF=no_GT-textual/max5_p2+tool+cd/decision_making/alfworld/results.jsonl.gz",
    "chat-bison-001/F=None/max5_p2+tool+cd/reasoning/math/results.jsonl.gz",
    "chat-bison-001/F=gpt-4-0613/PHF=no_GT-textual-sparse/max5_p2+tool+cd/reasoning/mmlu/results.jsonl.gz",
    "CodeLlama-34b-Instruct-hf/F=None/max5_p2+tool+cd/code_generation/humaneval/results.jsonl.gz",
    "CodeLlama-34b-Instruct-hf/F=gpt-4-0613/PHF=no_GT-textual/max5_p2+tool+cd/code_generation/humaneval/results.jsonl.gz",
    "Eurus-7B-SFT/F=None/max5_p2+tool+cd/decision_making/alfworld/results.jsonl.gz",
    "Llama-2-13b-chat-hf/F=None/max5_p2+tool+cd/code_generation/mbpp/results.jsonl.gz",
]


def _check_against_source(traces: list[Trace], source: list[dict[str, Any]]) -> None:
    assert len(traces) == len(source)
    assert sum(t.rewards["team"] for t in traces) == sum(s["state"]["success"] for s in source)
    for trace, line in zip(traces, source, strict=True):
        state = line["state"]
        assert trace.task_id.endswith(f"/{line['task']['task_id']}")
        counter = state["token_counter"]
        model = sum(e.tokens or 0 for e in trace.events if not e.agent.startswith("feedback:"))
        feedback = [e for e in trace.events if e.agent.startswith("feedback:")]
        if "prompt_tokens" in counter:
            assert model == counter["prompt_tokens"] + counter["completion_tokens"], trace.trace_id
        if "feedback_total_tokens" in counter and feedback:
            assert sum(e.tokens or 0 for e in feedback) == counter["feedback_total_tokens"], trace.trace_id
        proposals = [e for e in trace.events if e.type == "stop" and e.proposed]
        assert sum(e.grade or 0 for e in proposals) <= 1
        assert trace.events[-1].type == "stop" and trace.events[-1].proposed is False


def test_real_files_counts_outcomes_and_tokens(mint_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "mint.jsonl"
    files = [str(mint_dir / rel) for rel in REAL_FILES]
    assert main(["import", "mint", *files, "-o", str(out), "--no-progress"]) == 0
    summary = capsys.readouterr().out
    assert main(["validate", str(out)]) == 0
    traces = list(read_traces(out, strict=True))
    by_file: dict[str, list[Trace]] = {}
    for rel in REAL_FILES:
        where = parse_path(rel)
        prefix = (
            "/".join(p for p in ("mint", where.model, where.feedback, where.phf, where.family) if p) + "/"
        )
        by_file[rel] = [t for t in traces if t.trace_id.startswith(prefix)]
    n = 0
    for rel, mine in by_file.items():
        source = _source_lines_of(mint_dir / rel)
        _check_against_source(mine, source)
        n += len(source)
    assert f"imported {n} traces" in summary and len(traces) == n
    assert any(t.metrics["missing_actions"] for t in traces)
    assert any(t.metrics["tokens_estimated"] for t in traces)
    assert any(not t.events[:-1] for t in traces)  # chat-bison math line 77: no reply at all


def _source_lines_of(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_real_same_task_same_task_id_across_models(mint_dir: Path) -> None:
    rel = "F=None/max5_p2+tool+cd/reasoning/gsm8k/results.jsonl.gz"
    gpt = {t.task_id: t.trace_id for t in read([mint_dir / "gpt-4-0613" / rel])}
    llama = {t.task_id: t.trace_id for t in read([mint_dir / "Llama-2-7b-hf" / rel])}
    shared = set(gpt) & set(llama)
    assert len(shared) == len(gpt) == 48
    assert all(gpt[k] != llama[k] for k in shared)


def test_real_gzipped_and_plain_import_identically(mint_dir: Path, tmp_path: Path) -> None:
    rel = REAL_FILES[6]
    plain = tmp_path / rel.removesuffix(".gz")
    plain.parent.mkdir(parents=True)
    with gzip.open(mint_dir / rel, "rb") as src, plain.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    zipped = [t.dump() for t in read([mint_dir / rel])]
    assert [t.dump() for t in read([plain])] == zipped and len(zipped) == 45


@pytest.mark.slow
def test_real_whole_data(mint_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "mint.jsonl"
    assert main(["import", "mint", str(mint_dir), "-o", str(out), "--no-progress"]) == 0
    assert "imported 20614 traces" in capsys.readouterr().out
    traces = list(read_traces(out, strict=True))
    source = _source_lines(mint_dir)
    _check_against_source(traces, source)
    assert sum(t.rewards["team"] for t in traces) == 5681
    assert len({t.trace_id for t in traces}) == len(traces)
