"""Import InterCode experiment logs (``<env>/<model>/<file>.json[.gz]``) as format v1.

A log file is one JSON object from run index to run (``environment``, ``dataset``,
``task_id``, ``query``, ``turn_history`` with ``actions``, ``observations``,
``rewards``, ``valid_action``, and ``thoughts`` / ``steps`` for some strategies,
``summary``). Plan-and-solve logs written by the later harness wrap the same runs as
``{"meta": <run configuration>, "logs": {...}}``; a file holding only a configuration
(no runs) is skipped with that reason. The model is the one a multi-turn file's name
gives (``ic_<env>_[multiturn_]<model>_<N>_turns``), else the name of the folder holding the
file; the strategy comes from the file name (``react``, ``plan_solve``, else the
multi-turn "Try Again" loop), ``handicap`` in the name marks runs that were shown the
database schema up front. Every published environment reads: SQL, Bash, Python, CTF.

Each turn ``k`` (``t = k``, the source has no timestamps) is a ``tool_use`` by the model
(``tool`` = the environment: ``sql``, ``bash``, ``python``, ``ctf``; ``error`` = not
``valid_action``, none when it is ``null`` or absent: the Python environment and CTF's
25-turn logs do not check actions; ``tokens`` estimated by :func:`estimate_tokens`) and a
``return`` by ``env`` (``error`` by :func:`is_error_output`; ``progress`` by
:func:`stopserve.signals.progress.extract`, with exit code 0 for a valid Bash or CTF action).
What the harness graded and showed differs by strategy, and so does the mapping:

* multi-turn: every action is graded with ``submit`` and the reward is shown in the
  next prompt: ``grade`` = reward on the ``return`` and a run-time ``reward`` event;
  the run ends at reward 1 (``quality_met``) or when the turns run out;
* plan-and-solve: graded per step but not shown: ``grade`` on the ``return`` only;
* ReAct: only the final ``submit`` is graded: it becomes the final ``stop`` with that
  ``grade``; the 0 rewards of earlier turns were never computed and are not imported.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from stopserve.errors import ImporterError
from stopserve.ids import content_refs
from stopserve.importers._common import (
    CHARS_PER_TOKEN,
    OnError,
    fail,
    finish,
    iter_files,
    load_json,
    report,
)
from stopserve.signals.progress import progress_fields
from stopserve.trace import FORMAT_TAG, Trace

__all__ = ["INSTRUCTION_TOKENS", "LogFile", "convert", "estimate_tokens", "is_error_output", "read"]

Strategy = Literal["multiturn", "react", "plan_solve"]

#: Tokens of the instructions every call re-reads before the task: the multi-turn
#: prompt (InterCode's ``TemplateV2.get_init_msg``) is about 1,000 characters.
INSTRUCTION_TOKENS: Final = 250

#: Numeric code of each strategy in ``metrics.strategy``.
STRATEGY_CODES: Final[dict[str, float]] = {"multiturn": 0.0, "react": 1.0, "plan_solve": 2.0}
_HARDNESS: Final[dict[str, float]] = {"easy": 1.0, "medium": 2.0, "hard": 3.0, "extra": 4.0}
_SUFFIXES: Final = (".json", ".json.gz")
_CONFIG_KEYS: Final = frozenset({"data_path", "env", "image_name", "log_dir"})
_LISTS: Final = ("actions", "observations", "rewards")
_BLOCKED: Final = "blocked"  # the multi-turn harness's entry for a policy call that failed
_HARNESS_SUBMIT: Final = "EXCEEDED MAX TURNS"  # ReAct: the harness submitted for the model
_ERROR_START_RE: Final = re.compile(
    r"^\s*(?:Error executing (?:query|action)|No \w+ code was found|Format your \w+ command as follows"
    r"|Malformed command|OCI runtime exec failed)"
)
_SHELL_ERROR_RE: Final = re.compile(r": (?:command not found|syntax error)", re.M)
_SHELL_ENVS: Final = frozenset({"bash", "ctf"})  # CTF runs its commands in a bash shell
# the Python environment's observation of a run: "{'output': '...', 'error': '...'}"
_PYTHON_ERROR_RE: Final = re.compile(r"'error': (?!''\}\s*$)")
#: ``ic_<env>_[multiturn_]<model>_<N>_turns``: a multi-turn file that names its model
_MODEL_IN_NAME_RE: Final = re.compile(r"^ic_[a-z]+_(?:multiturn_)?(?P<model>.+?)[-_]\d+_turns(?:_|$)")
_REACT_EXECUTE_RE: Final = re.compile(r"execute\[(.*)\]", re.DOTALL)


def is_error_output(observation: str, env: str) -> bool:
    """Whether an observation is an error message (independent of ``valid_action``).

    True when it starts with one of the harness's error texts (``Error executing query``,
    ``Error executing action``, ``No SQL code was found``, ``Format your BASH command as
    follows``, ``Malformed command``, ``OCI runtime exec failed``), or, in bash and CTF,
    holds a shell error line (``: command not found``, ``: syntax error``): a pipeline's
    last command can succeed after an earlier one failed; in Python, when the run's
    ``{'output': ..., 'error': ...}`` names an error.
    """
    if _ERROR_START_RE.match(observation):
        return True
    if env == "python":
        return observation.startswith("{'output'") and bool(_PYTHON_ERROR_RE.search(observation))
    return env in _SHELL_ENVS and bool(_SHELL_ERROR_RE.search(observation))


def estimate_tokens(context_chars: int, written_chars: int) -> int:
    """Tokens of one call: the instructions plus one token per 4 characters read and written.

    >>> estimate_tokens(400, 40)
    360
    """
    return INSTRUCTION_TOKENS + math.ceil((context_chars + written_chars) / CHARS_PER_TOKEN)


@dataclass(frozen=True, slots=True)
class LogFile:
    """What a log file's path and configuration say about its runs."""

    path: str
    model: str
    strategy: Strategy
    handicap: bool = False
    refine_turns: int = 0  # plan-and-solve: turns of self-refinement after the plan

    @property
    def stem(self) -> str:
        """The file name without ``.json`` / ``.json.gz``."""
        return Path(self.path).name.removesuffix(".gz").removesuffix(".json")


def _strategy(stem: str, run: Mapping[str, Any] | None) -> Strategy:
    name = stem.lower()
    if "react" in name:
        return "react"
    if "plan_solve" in name:
        return "plan_solve"
    if "multiturn" in name or run is None:
        return "multiturn"
    history = run.get("turn_history")
    if isinstance(history, dict) and "thoughts" in history:
        return "react"
    if isinstance(history, dict) and "steps" in history:
        return "plan_solve"
    return "multiturn"


def _is_run(value: Any) -> bool:
    return isinstance(value, dict) and "turn_history" in value


def _runs_of(data: Any, path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(runs, configuration) of a parsed log file; raise when it holds no runs."""
    if not isinstance(data, dict):
        raise fail(f"expected an object from run index to run, got {type(data).__name__}", file=path)
    meta: dict[str, Any] = data["meta"] if isinstance(data.get("meta"), dict) else {}
    runs: Any = data.get("logs") if "logs" in data else data
    if isinstance(runs, dict) and any(_is_run(v) for v in runs.values()):
        return runs, meta
    config = _CONFIG_KEYS & (set(data) | set(meta))
    if config:
        raise fail(
            f"holds only a run configuration ({', '.join(sorted(config))}), no runs: nothing to import",
            file=path,
        )
    raise fail(
        "not an InterCode log: expected an object from run index to run (with turn_history)", file=path
    )


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _texts(history: Mapping[str, Any], key: str, file: str, where: str) -> list[str]:
    value = history.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise fail("expected a list of strings", file=file, path=f"{where}.{key}")
    return value


@dataclass(slots=True)
class _Run:
    actions: list[str]
    observations: list[str]
    rewards: list[float]
    valid: list[bool | None]  # None: the environment does not check actions (Python, some CTF logs)
    thoughts: list[str]
    steps: list[str]
    blocked: bool


def _parse_history(run: Mapping[str, Any], file: str, key: str) -> _Run:
    where = f"{key}.turn_history"
    history = run.get("turn_history")
    if not isinstance(history, dict):
        raise fail("expected an object", file=file, path=where)
    for name in _LISTS:
        if not isinstance(history.get(name), list):
            raise fail("expected a list", file=file, path=f"{where}.{name}")
    actions = _texts(history, "actions", file, where)
    observations = _texts(history, "observations", file, where)
    rewards: list[float] = []
    for i, value in enumerate(history["rewards"]):
        number = _number(value)
        if number is None:
            raise fail(f"expected a number, got {value!r}", file=file, path=f"{where}.rewards[{i}]")
        rewards.append(number)
    n = len(observations)
    checked = history.get("valid_action", [None] * n)  # absent (CTF's 25-turn logs): nothing checked
    if not isinstance(checked, list):
        raise fail("expected a list", file=file, path=f"{where}.valid_action")
    valid: list[bool | None] = []
    for i, value in enumerate(checked):
        if value is not None and not isinstance(value, bool):
            raise fail(
                f"expected true, false or null, got {value!r}", file=file, path=f"{where}.valid_action[{i}]"
            )
        valid.append(value)
    blocked = len(actions) == n + 1 and actions[-1] == _BLOCKED and len(rewards) == n + 1
    if not blocked and not len(actions) == n == len(rewards):
        raise fail(
            f"lists differ in length (actions {len(actions)}, observations {n}, rewards {len(rewards)}, "
            f"valid_action {len(valid)})",
            file=file,
            path=where,
        )
    if len(valid) != n:
        raise fail(f"has {len(valid)} entries for {n} observations", file=file, path=f"{where}.valid_action")
    return _Run(
        actions=actions[:n],
        observations=observations,
        rewards=rewards[:n],
        valid=valid,
        thoughts=_texts(history, "thoughts", file, where),
        steps=_texts(history, "steps", file, where),
        blocked=blocked,
    )


def _at(texts: Sequence[str], k: int) -> str:
    return texts[k] if k < len(texts) else ""


def convert(run: Any, source: LogFile, key: str, *, sketch: bool = True) -> Trace:
    """Convert one run (the value at run index ``key`` of a log file described by ``source``).

    ``sketch=False`` leaves the texts' sketches out (their hashes stay).
    """
    file = source.path
    if not isinstance(run, dict):
        raise fail(f"expected a run object, got {type(run).__name__}", file=file, path=key)
    environment = run.get("environment")
    if not isinstance(environment, str) or not environment.removeprefix("ic_"):
        raise fail("expected the environment name, e.g. 'ic_sql'", file=file, path=f"{key}.environment")
    env = environment.removeprefix("ic_")
    dataset = run.get("dataset")
    if not isinstance(dataset, str) or not dataset:
        raise fail("expected the dataset path", file=file, path=f"{key}.dataset")
    raw_task = run.get("task_id")
    if isinstance(raw_task, bool) or not isinstance(raw_task, int | str) or raw_task == "":
        raise fail("expected a task id (string or integer)", file=file, path=f"{key}.task_id")
    query = run.get("query")
    if not isinstance(query, str):
        raise fail("expected the task text", file=file, path=f"{key}.query")
    turns = _parse_history(run, file, key)
    strategy = source.strategy
    model = source.model
    n = len(turns.actions)
    react_submit = strategy == "react" and n > 0 and turns.actions[-1].strip() == "submit"
    n_work = n - 1 if react_submit else n  # turns that act on the environment

    events: list[dict[str, Any]] = []
    context = len(query)  # characters the model has read so far (besides the instructions)
    total_tokens = 0
    for k in range(n_work):
        action, observation = turns.actions[k], turns.observations[k]
        thought, step = _at(turns.thoughts, k), _at(turns.steps, k)
        code = action
        if strategy == "react":
            match = _REACT_EXECUTE_RE.search(action)
            code = match.group(1) if match else action
        tokens = estimate_tokens(context + len(step), len(thought) + len(action))
        total_tokens += tokens
        failed = turns.valid[k] is False
        use: dict[str, Any] = {
            "id": f"turn{k + 1}.model",
            "t": k,
            "type": "tool_use",
            "agent": model,
            "role": "assistant",
            "tool": env,
            **content_refs(code, sketch=sketch),
            "tokens": tokens,
        }
        if turns.valid[k] is not None:
            use["error"] = failed
        events.append(use)
        ret: dict[str, Any] = {
            "id": f"turn{k + 1}.env",
            "t": k,
            "type": "return",
            "agent": "env",
            "tool": env,
            **content_refs(observation, sketch=sketch),
            "error": failed or is_error_output(observation, env),
        }
        # a shell's valid_action is its exit status being 0; a failure's code is not logged
        exit_code = 0 if env in _SHELL_ENVS and turns.valid[k] is True else None
        ret.update(progress_fields(observation, tool=env, exit_code=exit_code, failed=ret["error"]))
        if strategy != "react":
            ret["grade"] = turns.rewards[k]
        events.append(ret)
        if strategy == "multiturn":
            events.append(
                {
                    "id": f"turn{k + 1}.reward",
                    "t": k,
                    "type": "reward",
                    "agent": "env",
                    "channel": "quality",
                    "value": turns.rewards[k],
                }
            )
        context += len(step) + len(thought) + len(action) + len(observation)

    # how the run ended
    t_end = max(n - 1, 0)
    end: dict[str, Any] = {"id": "end", "t": t_end, "type": "stop", "agent": "env", "proposed": False}
    limit: str | None = None
    by = "safety_net"
    if strategy == "react":
        if react_submit:
            team = turns.rewards[-1]
            end.update(grade=team, **content_refs(turns.observations[-1], sketch=sketch))
            if _at(turns.thoughts, n - 1).startswith(_HARNESS_SUBMIT):
                reason, limit = "budget_exhausted", "turns"  # the harness submitted for the model
            else:
                reason, by = "information_complete", "orchestrator"
                thought = _at(turns.thoughts, n - 1)
                end.update(agent=model, tokens=estimate_tokens(context, len(thought) + len("submit")))
                total_tokens += end["tokens"]
        else:
            team, reason, by = 0.0, "unknown", "external"  # ended without a submit
    else:
        team = turns.rewards[-1] if n else 0.0
        summary_of = run.get("summary")
        cap = summary_of.get("turns_max") if isinstance(summary_of, dict) else None
        if turns.blocked:
            reason, by = "error", "external"
        elif n and team == 1.0 and (strategy == "multiturn" or source.refine_turns):
            reason = "quality_met"
        elif strategy == "plan_solve" and not source.refine_turns:
            reason, by = "information_complete", "orchestrator"  # the plan's steps are done
            end["agent"] = model
        elif strategy == "plan_solve" or (isinstance(cap, int) and n >= cap):
            reason, limit = "budget_exhausted", "turns"
        else:
            reason, by = "unknown", "external"
    end["reason"] = reason
    events.append(end)
    stop: dict[str, Any] = {"reason": reason, "by": by, "t": t_end}
    if limit:
        stop["limit"] = limit

    summary = run.get("summary") if isinstance(run.get("summary"), dict) else {}
    assert isinstance(summary, dict)
    metrics: dict[str, float] = {
        "strategy": STRATEGY_CODES[strategy],
        "handicap": float(source.handicap),
        "turns": float(n_work),
        "task_success": 1.0 if team >= 1.0 else 0.0,
        "blocked": float(turns.blocked),
    }
    turns_max = _number(summary.get("turns_max"))
    if turns_max is None and strategy == "plan_solve":
        turns_max = float(len(turns.steps) + source.refine_turns)
    if turns_max is not None:
        metrics["turns_max"] = turns_max
    if strategy == "plan_solve":
        metrics["refine_turns"] = float(source.refine_turns)
    max_reward = _number(summary.get("max_reward"))
    if max_reward is not None:
        metrics["max_reward"] = max_reward
    hardness = run.get("hardness")
    if isinstance(hardness, str) and hardness in _HARDNESS:
        metrics["hardness"] = _HARDNESS[hardness]
    dataset_stem = Path(dataset).name.removesuffix(".json")
    trace: dict[str, Any] = {
        "format": FORMAT_TAG,
        "trace_id": f"intercode-{env}/{model}/{source.stem}/{key}",
        "task_id": f"intercode-{env}/{dataset_stem}/{raw_task}",
        "system": f"intercode-{env}/{model}",
        "topology": "harness",
        "events": events,
        "rewards": {"team": team},
        "costs": {"tokens": float(total_tokens), "tool_calls": float(n_work)},
        "stop": stop,
        "metrics": metrics,
    }
    return finish(trace, file=file)


# --------------------------------------------------------------------------- entry point


def _log_file(path: Path, meta: Mapping[str, Any], first_run: Mapping[str, Any] | None) -> LogFile:
    stem = path.name.removesuffix(".gz").removesuffix(".json")
    strategy = _strategy(stem, first_run)
    refine_turns = 0
    if strategy == "plan_solve":
        turns = meta.get("refine_turns")
        if meta.get("refine") and isinstance(turns, int) and turns > 0:
            refine_turns = turns
        else:
            match = re.search(r"refine_(\d+)_turns", stem)
            refine_turns = int(match.group(1)) if match else 0
    named = _MODEL_IN_NAME_RE.match(stem) if strategy == "multiturn" else None
    # the name says which model ran (the published Python logs hold gpt-4 runs in a gpt-3.5
    # folder; the CTF logs sit in no model folder); else the folder does
    model = named["model"] if named else path.resolve().parent.name or "unknown"
    return LogFile(
        path=str(path),
        model=model,
        strategy=strategy,
        handicap="handicap" in stem.lower(),
        refine_turns=refine_turns,
    )


def read(
    sources: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    *,
    on_error: OnError = None,
    sketch: bool = True,
) -> Iterator[Trace]:
    """Yield one :class:`Trace` per run of InterCode log files (``.json`` or ``.json.gz``).

    ``sources`` are files or folders (searched recursively). A run that cannot be
    converted, or a file that holds no runs (a bare run configuration), raises
    :class:`ImporterError` or goes to ``on_error`` and is skipped.
    ``sketch=False`` leaves the texts' sketches out (``stopserve import --no-sketch``).

    >>> traces = read("../shared/data/intercode-train")  # doctest: +SKIP
    """
    for path in iter_files(sources, _SUFFIXES):
        try:
            runs, meta = _runs_of(load_json(path), path)
        except ImporterError as err:
            report(err, on_error)
            continue
        first = next((v for v in runs.values() if _is_run(v)), None)
        source = _log_file(path, meta, first)
        for key, run in runs.items():
            try:
                yield convert(run, source, str(key), sketch=sketch)
            except ImporterError as err:
                report(err, on_error)
