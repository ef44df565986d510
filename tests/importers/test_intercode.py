"""InterCode importer: on hand-written logs and on the real shared logs.

The hand-written logs follow the harness's own logging code (princeton-nlp/intercode,
``experiments/eval_n_turn.py``, ``eval_react.py``, ``eval_plan_solve.py``): a file is
``{run index: run}`` (plan-and-solve's later version: ``{"meta": vars(args), "logs": {...}}``);
a run is ``environment`` (``ic_sql`` / ``ic_bash``), ``dataset`` (the data path), ``task_id``,
``query``, ``turn_history`` (``actions``, ``observations``, ``rewards``, ``valid_action``;
``thoughts`` in ReAct, ``steps`` in plan-and-solve) and ``summary`` (``max_reward``,
``turns_taken``, ``turns_max``). A multi-turn policy call that fails logs the action
``"blocked"`` with reward 0 and no observation; ReAct ends with the action ``submit``
(the harness submits itself after the last turn, with the thought ``EXCEEDED MAX TURNS: submit``).
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest

from stopserve.cli import main
from stopserve.ids import content_ref
from stopserve.importers import IMPORTERS
from stopserve.importers.intercode import INSTRUCTION_TOKENS, is_error_output, read
from stopserve.trace import Trace, is_decision_point, read_traces

QUERY = "How many singers do we have?"


def a_run(
    actions: list[str],
    observations: list[str],
    rewards: list[float],
    valid: list[bool],
    *,
    env: str = "sql",
    turns_max: int | None = 10,
    task_id: int = 3,
    **extra: list[str],
) -> dict[str, Any]:
    history: dict[str, Any] = {
        "actions": actions,
        "observations": observations,
        "rewards": rewards,
        "valid_action": valid,
        **extra,
    }
    summary: dict[str, Any] = {"max_reward": max(rewards) if rewards else 0, "turns_taken": len(actions)}
    if turns_max is not None:
        summary["turns_max"] = turns_max
    return {
        "environment": f"ic_{env}",
        "dataset": "./data/spider/dev_spider.json" if env == "sql" else "./data/nl2bash/nl2bash_fs_1.json",
        "task_id": task_id,
        "query": QUERY,
        "turn_history": history,
        "summary": summary,
        "hardness": "easy",
    }


def write(path: Path, data: Any, *, gz: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = json.dumps(data).encode()
    path.write_bytes(gzip.compress(blob) if gz else blob)
    return path


def one(path: Path) -> Trace:
    (trace,) = read([path])
    return trace


def test_multiturn_rewards_are_shown_and_graded(tmp_path: Path) -> None:
    actions = ["SHOW TABLES", "SELECT * FROM singers", "SELECT count(*) FROM singer"]
    observations = ["[('singer',)]", "Error executing query: Table 'x.singers' doesn't exist", "[(6,)]"]
    run = a_run(actions, observations, [0.0, 0.0, 1.0], [True, False, True])
    path = write(tmp_path / "sql" / "gpt-4" / "ic_sql_multiturn_gpt-4_10_turns.json", {"0": run})
    trace = one(path)
    types = [(e.type, e.agent, e.t) for e in trace.events]
    assert types == [
        ("tool_use", "gpt-4", 0),
        ("return", "env", 0),
        ("reward", "env", 0),
        ("tool_use", "gpt-4", 1),
        ("return", "env", 1),
        ("reward", "env", 1),
        ("tool_use", "gpt-4", 2),
        ("return", "env", 2),
        ("reward", "env", 2),
        ("stop", "env", 2),
    ]
    uses = [e for e in trace.events if e.type == "tool_use"]
    returns = [e for e in trace.events if e.type == "return"]
    assert [e.content_ref for e in uses] == [content_ref(a) for a in actions]
    assert [e.content_ref for e in returns] == [content_ref(o) for o in observations]
    assert [e.grade for e in returns] == [0.0, 0.0, 1.0]
    assert [e.value for e in trace.events if e.type == "reward"] == [0.0, 0.0, 1.0]
    assert [e.error for e in uses] == [False, True, False] and [e.error for e in returns] == [
        False,
        True,
        False,
    ]
    assert all(e.tool == "sql" for e in uses + returns)
    # tokens: the instructions plus 1 per 4 characters of the query, the turns before and the action
    seen = len(QUERY)
    for use, action, obs in zip(uses, actions, observations, strict=True):
        assert use.tokens == INSTRUCTION_TOKENS + math.ceil((seen + len(action)) / 4)
        seen += len(action) + len(obs)
    assert trace.events[-1].reason == "quality_met" and trace.events[-1].proposed is False
    assert trace.stop is not None and (trace.stop.reason, trace.stop.by) == ("quality_met", "safety_net")
    assert trace.trace_id == "intercode-sql/gpt-4/ic_sql_multiturn_gpt-4_10_turns/0"
    assert trace.task_id == "intercode-sql/dev_spider/3" and trace.system == "intercode-sql/gpt-4"
    assert trace.topology == "harness" and trace.budget is None and trace.rewards == {"team": 1.0}
    assert trace.metrics["strategy"] == 0 and trace.metrics["turns_max"] == 10
    assert trace.metrics["handicap"] == 0 and trace.metrics["hardness"] == 1
    assert trace.costs["tokens"] == sum(e.tokens or 0 for e in uses)


def test_multiturn_team_is_the_last_reward_not_the_best(tmp_path: Path) -> None:
    run = a_run(["ls", "ls -la"], ["a\n", "total 0\n"], [0.8, 0.3], [True, True], env="bash", turns_max=2)
    path = write(tmp_path / "bash" / "gpt-4" / "ic_bash_multiturn_gpt-4_2_turns_fs_1.json", {"5": run})
    trace = one(path)
    assert trace.rewards == {"team": 0.3} and trace.metrics["max_reward"] == 0.8
    assert trace.stop is not None and (trace.stop.reason, trace.stop.limit) == ("budget_exhausted", "turns")
    assert trace.task_id == "intercode-bash/nl2bash_fs_1/3"


def test_blocked_policy_call_ends_in_error(tmp_path: Path) -> None:
    run = a_run(["ls", "blocked"], ["a\n"], [0.4, 0], [True], env="bash")
    trace = one(write(tmp_path / "bash" / "palm" / "ic_bash_multiturn_palm_10_turns_fs_1.json", {"0": run}))
    assert [e.type for e in trace.events] == ["tool_use", "return", "reward", "stop"]
    assert trace.stop is not None and (trace.stop.reason, trace.stop.by) == ("error", "external")
    assert trace.rewards == {"team": 0.4} and trace.metrics["blocked"] == 1


def test_react_only_the_submit_is_graded(tmp_path: Path) -> None:
    actions = ["execute[SHOW TABLES]", "execute[SELECT count(*) FROM singer]", "submit"]
    observations = ["[('singer',)]", "[(6,)]", "[(6,)]"]
    thoughts = ["Look at the tables.", "Count them.", "Done."]
    run = a_run(actions, observations, [0, 0, 1.0], [True, True, True], thoughts=thoughts)
    path = write(tmp_path / "sql" / "gpt-3.5" / "ic_sql_react_10_turns.json", {"0": run})
    trace = one(path)
    assert [e.type for e in trace.events] == ["tool_use", "return", "tool_use", "return", "stop"]
    assert all(e.grade is None for e in trace.events[:-1])
    assert trace.events[0].content_ref == content_ref("SHOW TABLES")
    end = trace.events[-1]
    assert (end.reason, end.grade, end.agent, end.proposed) == ("information_complete", 1.0, "gpt-3.5", False)
    assert end.content_ref == content_ref("[(6,)]")
    seen = len(QUERY) + sum(len(x) for x in actions[:2] + observations[:2] + thoughts[:2])
    assert end.tokens == INSTRUCTION_TOKENS + math.ceil((seen + len("Done.") + len("submit")) / 4)
    assert trace.rewards == {"team": 1.0} and trace.metrics["strategy"] == 1
    assert trace.stop is not None and trace.stop.by == "orchestrator"
    # the harness submitted after the last turn: a budget stop, no model tokens
    thoughts[-1] = "EXCEEDED MAX TURNS: submit"
    run = a_run(actions, observations, [0, 0, 0.5], [True, True, True], thoughts=thoughts)
    trace = one(write(path, {"0": run}))
    end = trace.events[-1]
    assert (end.reason, end.grade, end.tokens, end.agent) == ("budget_exhausted", 0.5, None, "env")
    # no submit at all (the harness's stale `done` flag): outcome 0
    run = a_run(actions[:1], observations[:1], [0], [True], thoughts=thoughts[:1])
    trace = one(write(path, {"0": run}))
    assert trace.rewards == {"team": 0.0} and trace.stop is not None and trace.stop.reason == "unknown"


def test_plan_solve_grades_without_run_time_rewards(tmp_path: Path) -> None:
    run = a_run(
        ["ls /testbed", "find /testbed -name '*.py'"],
        ["dir1\n", "/bin/bash: line 3: BASH: command not found\n"],
        [0.5, 0.7],
        [True, True],
        env="bash",
        turns_max=None,
        steps=["List the folder.", "Find the python files."],
    )
    path = write(tmp_path / "bash" / "gpt-3.5" / "ic_bash_plan_solve_fs_1.json", {"0": run})
    trace = one(path)
    assert [e.type for e in trace.events] == ["tool_use", "return", "tool_use", "return", "stop"]
    assert [e.grade for e in trace.events if e.type == "return"] == [0.5, 0.7]
    assert trace.events[3].error is True and trace.events[2].error is False  # a shell error line
    assert trace.stop is not None and trace.stop.reason == "information_complete"
    assert trace.metrics["strategy"] == 2 and trace.metrics["turns_max"] == 2 and trace.rewards["team"] == 0.7
    # the later harness wraps the runs with their configuration; refinement ends on reward 1
    meta = {"data_path": "./data/nl2bash/nl2bash_fs_1.json", "env": "bash", "refine": True, "refine_turns": 3}
    run["turn_history"]["rewards"] = [0.5, 1.0]
    wrapped = write(
        tmp_path / "bash" / "gpt-3.5" / "ic_bash_plan_solve_refine_3_turns.json",
        {"meta": meta, "logs": {"0": run}},
    )
    trace = one(wrapped)
    assert trace.stop is not None and trace.stop.reason == "quality_met"
    assert trace.metrics["refine_turns"] == 3 and trace.metrics["turns_max"] == 5


def test_config_only_file_and_malformed_runs_are_skipped(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "sql" / "gpt-3.5"
    config = write(
        folder / "ic_sql_plan_solve.json", {"meta": {"data_path": "d.json", "env": "sql", "image_name": "x"}}
    )
    good = a_run(["SHOW TABLES"], ["[]"], [0.0], [True])
    short = a_run(["SHOW TABLES", "SHOW TABLES"], ["[]"], [0.0, 0.0], [True])
    wrong = a_run(["SHOW TABLES"], ["[]"], ["high"], [True])  # type: ignore[list-item]
    logs = write(
        folder / "ic_sql_multiturn_gpt-3.5_10_turns.json", {"0": good, "1": short, "2": wrong, "3": good}
    )
    out = tmp_path / "out.jsonl"
    # the rest is written: exit 0 with the skips listed; --strict makes any skip exit 1
    assert main(["import", "intercode", str(tmp_path), "-o", str(out), "--no-progress", "--strict"]) == 1
    capsys.readouterr()
    assert main(["import", "intercode", str(tmp_path), "-o", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "imported 2 traces" in captured.out and "skipped 3" in captured.out
    assert f"skipped: {config}: holds only a run configuration (data_path, env, image_name)" in captured.err
    assert (
        f"skipped: {logs}: 1.turn_history: lists differ in length (actions 2, observations 1" in captured.err
    )
    assert f"skipped: {logs}: 2.turn_history.rewards[0]: expected a number, got 'high'" in captured.err
    assert main(["validate", str(out)]) == 0
    assert main(["import", "intercode", str(config), "-o", str(out), "--no-progress"]) == 2


def test_gzipped_and_plain_files_import_identically(tmp_path: Path) -> None:
    run = a_run(["SHOW TABLES"], ["[]"], [0.0], [True])
    plain = write(tmp_path / "a" / "gpt-4" / "ic_sql_multiturn_gpt-4_10_turns_handicap.json", {"0": run})
    zipped = write(
        tmp_path / "b" / "gpt-4" / "ic_sql_multiturn_gpt-4_10_turns_handicap.json.gz", {"0": run}, gz=True
    )
    assert one(plain).dump() == one(zipped).dump()
    assert one(plain).metrics["handicap"] == 1


def test_error_rule() -> None:
    assert is_error_output("Error executing query: Unknown column 'name' in 'field list'", "sql")
    assert is_error_output("No SQL code was found in your last response.", "sql")
    assert is_error_output("Format your BASH command as follows:\n```BASH\n```", "bash")
    assert is_error_output("/bin/bash: line 1: xxd: command not found\n", "bash")
    assert is_error_output("-ef: -c: line 2: syntax error: unexpected end of file\n", "bash")
    assert not is_error_output("[('Error executing query',)]", "sql")
    assert not is_error_output("0d1e201ac67b5a979c52f42eb8dd3702  -\n", "bash")
    assert not is_error_output("", "bash")


# --------------------------------------------------------------------------- the real shared logs


def _runs(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as fh:
        data = json.load(fh)
    return data.get("logs", data)


def _file_traces(path: Path) -> list[Trace]:
    return list(read([path], on_error=lambda err: None))


#: one file per strategy and quirk: multi-turn with blocked calls (chat-bison bash), SQL
#: multi-turn and handicap, 1-turn, ReAct (with harness submits), plan-and-solve in both
#: file shapes
REAL_FILES = [
    "bash/chat-bison-001/ic_bash_multiturn_chat-bison-001_10_turns_fs_1.json.gz",
    "bash/gpt-3.5/ic_bash_react_10_turns_fs_1.json.gz",
    "bash/gpt-3.5/ic_bash_plan_solve_fs_1.json.gz",
    "bash/gpt-3.5/ic_bash_plan_solve_fs_2.json.gz",
    "bash/gpt-3.5/ic_bash_plan_solve_refine_3_turns.json.gz",
    "sql/gpt-4/ic_sql_multiturn_gpt-4_10_turns.json.gz",
    "sql/gpt-4/ic_sql_multiturn_gpt-4_1_turns.json.gz",
    "sql/gpt-3.5/ic_sql_multiturn_gpt-3.5_10_turns_handicap.json.gz",
    "sql/gpt-3.5/ic_sql_react_10_turns.json.gz",
]


@pytest.mark.parametrize("rel", REAL_FILES)
def test_real_counts_grades_and_outcomes(intercode_dir: Path, rel: str) -> None:
    runs = _runs(intercode_dir / rel)
    traces = _file_traces(intercode_dir / rel)
    assert len(traces) == len(runs) > 0
    react = "react" in rel
    successes = 0
    for trace, (key, run) in zip(traces, runs.items(), strict=True):
        assert trace.trace_id.endswith(f"/{key}")
        history = run["turn_history"]
        rewards = [float(r) for r in history["rewards"]]
        if history["actions"] and history["actions"][-1] == "blocked":
            rewards = rewards[:-1]
        if react:
            submitted = history["actions"][-1] == "submit"
            team = rewards[-1] if submitted else 0.0
            assert trace.events[-1].grade == (rewards[-1] if submitted else None)
            assert not any(e.type == "reward" for e in trace.events)
        else:
            team = rewards[-1] if rewards else 0.0
            assert [e.grade for e in trace.events if e.type == "return"] == rewards
            shown = [e.value for e in trace.events if e.type == "reward"]
            assert shown == (rewards if "multiturn" in rel else [])
        assert trace.rewards == {"team": team}
        successes += team == 1.0
        assert sum(e.type == "tool_use" for e in trace.events) == trace.metrics["turns"]
        assert sum(is_decision_point(e) for e in trace.events) >= trace.metrics["turns"]
    assert sum(t.metrics["task_success"] for t in traces) == successes


def test_real_same_task_same_task_id_across_models_and_strategies(intercode_dir: Path) -> None:
    ids = []
    for rel in (
        "sql/gpt-4/ic_sql_multiturn_gpt-4_10_turns.json.gz",
        "sql/gpt-3.5/ic_sql_react_10_turns.json.gz",
    ):
        ids.append({t.task_id: t.trace_id for t in _file_traces(intercode_dir / rel)})
    assert set(ids[0]) == set(ids[1]) and len(ids[0]) == 1034
    assert all(ids[0][k] != ids[1][k] for k in ids[0])
    fs1 = {t.task_id for t in _file_traces(intercode_dir / REAL_FILES[0])}
    fs2 = {t.task_id for t in _file_traces(intercode_dir / REAL_FILES[3])}
    assert not fs1 & fs2  # the four nl2bash file systems are different datasets


def test_real_gzipped_and_plain_import_identically(intercode_dir: Path, tmp_path: Path) -> None:
    rel = REAL_FILES[3]
    plain = tmp_path / rel.removesuffix(".gz")
    plain.parent.mkdir(parents=True)
    plain.write_bytes(gzip.decompress((intercode_dir / rel).read_bytes()))
    zipped = [t.dump() for t in _file_traces(intercode_dir / rel)]
    assert [t.dump() for t in _file_traces(plain)] == zipped and len(zipped) == 53


def test_real_cli_imports_a_model_folder(intercode_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "ic.jsonl"
    rc = main(["import", "intercode", str(intercode_dir / "bash" / "gpt-4"), "-o", str(out), "--no-progress"])
    assert rc == 0
    runs = sum(len(_runs(p)) for p in (intercode_dir / "bash" / "gpt-4").iterdir())
    assert f"imported {runs} traces to {out}; skipped 0" in capsys.readouterr().out
    assert main(["validate", str(out)]) == 0
    assert "intercode" in IMPORTERS


@pytest.mark.slow
def test_real_whole_data(intercode_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "ic.jsonl"
    assert main(["import", "intercode", str(intercode_dir), "-o", str(out), "--no-progress"]) == 0
    summary = capsys.readouterr().out
    runs = sum(len(_runs(p)) for p in intercode_dir.rglob("*.json.gz"))
    # one plan-and-solve run logs a reward but no action (an empty plan): skipped, named
    assert f"imported {runs - 1} traces" in summary and "skipped 1 (1x lists differ in length" in summary
    traces = list(read_traces(out, strict=True))
    assert len({t.trace_id for t in traces}) == len(traces) == runs - 1


# --------------------------------------------------------------------------- published Python and CTF logs

PUBLISHED = Path(__file__).parent / "data" / "intercode"


def test_published_python_and_ctf_logs_import(tmp_path: Path, capsys) -> None:
    """Runs cut from InterCode's own published logs (tests/importers/data/README.md): a ``null``
    ``valid_action`` (Python) or none at all (CTF's 25-turn logs) means "not checked"."""
    out = tmp_path / "ic.jsonl"
    assert main(["import", "intercode", str(PUBLISHED), "-o", str(out), "--no-progress", "--strict"]) == 0
    assert "imported 7 traces" in capsys.readouterr().out
    assert main(["validate", str(out)]) == 0
    traces = {t.trace_id: t for t in read_traces(out)}

    py = traces["intercode-python/gpt-4/ic_python_multiturn_gpt-4_7_turns/6"]
    assert py.system == "intercode-python/gpt-4"  # the file names gpt-4, though it sits in gpt-3.5/
    uses = [e for e in py.events if e.type == "tool_use"]
    returns = [e for e in py.events if e.type == "return"]
    assert len(uses) == 7 and all(e.error is None and e.tool == "python" for e in uses)  # not checked
    assert all(e.error for e in returns)  # "Error executing action: invalid syntax"
    assert py.stop is not None and py.stop.reason == "budget_exhausted" and py.rewards == {"team": 0.0}
    solved = traces["intercode-python/gpt-3.5/ic_python_multiturn_gpt-3.5_7_turns/107"]
    assert [e.grade for e in solved.events if e.type == "return"] == [0.0, 1.0]
    assert [e.error for e in solved.events if e.type == "return"] == [False, False]
    assert solved.stop is not None and solved.stop.reason == "quality_met"

    ctf = traces["intercode-ctf/gpt-4/ic_ctf_multiturn_gpt-4_10_turns/19"]
    assert [e.error for e in ctf.events if e.type == "tool_use"] == [True, True, False, False]
    assert [e.error for e in ctf.events if e.type == "return"] == [True, True, False, False]
    assert ctf.task_id == "intercode-ctf/ic_ctf/19" and ctf.rewards == {"team": 1.0}
    unchecked = traces["intercode-ctf/gpt-4/ic_ctf_gpt-4_25_turns/2"]
    assert all(e.error is None for e in unchecked.events if e.type == "tool_use")
    assert [e.error for e in unchecked.events if e.type == "return"] == [True, True, False, False, False]
    assert unchecked.stop is not None and unchecked.stop.reason == "quality_met"
    assert unchecked.metrics["turns_max"] == 15


def test_a_valid_action_that_is_no_boolean_names_where(tmp_path: Path, capsys) -> None:
    run = a_run(["SHOW TABLES"], ["[]"], [0.0], ["yes"])  # type: ignore[list-item]
    path = write(tmp_path / "sql" / "gpt-4" / "ic_sql_multiturn_gpt-4_10_turns.json", {"0": run})
    assert main(["import", "intercode", str(path), "-o", str(tmp_path / "o.jsonl"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "0.turn_history.valid_action[0]: expected true, false or null, got 'yes'" in err
