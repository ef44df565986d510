"""Import mini-swe-agent ``.traj.json`` runs (and SWE-agent ``.traj`` files) as format v1.

Sources: a ``.traj.json`` file, a folder of them, a folder of ``<id>/<id>.traj.json``,
or a run folder holding ``trajs/``, ``results_summary.json`` and ``reports/`` (found
automatically). Outcomes come from a results summary (``instances[].resolved``,
SWE-bench's ``resolved_ids``, or ``{id: {"resolved": ...}}``) or per-instance
``<id>.report.json`` files; ``rewards.team`` is 1.0 when resolved, else 0.0, and
absent when no outcome is known.

One step (one model call) becomes:

* ``tool_use`` by ``agent``: ``tool="bash"``, ``tokens`` = prompt + completion tokens
  of that call's usage, ``usd`` = its usage cost (``usage.cost``, else the message's
  ``extra.cost``), ``t`` = its ``created`` time relative
  to the first call, ``content_ref`` = hash of the command;
* ``return`` by ``bash``: ``error`` = non-zero ``<returncode>`` (or a timeout),
  ``content_ref`` = hash of the output, ``progress`` = what the output shows (exit code,
  pytest / unittest counts, error signature, files changed:
  :func:`stopserve.signals.progress.extract`).

A reply without exactly one command (a format error) is a ``tool_use`` whose ref
hashes the reply, then a ``return`` with ``error: true`` and ``format_error: true``.
The final submitting step is a ``tool_use`` then a ``stop`` (``information_complete``,
``proposed: false``, ref = hash of the submission). ``LimitsExceeded`` ends in
``budget_exhausted`` with the limit hit; other exit statuses end in ``error``
(``external`` for a user interruption).

Runs whose calls carry no cost get ``info.model_stats.instance_cost`` spread over
those calls in proportion to their tokens, and ``metrics.usd_estimated = 1``.
``topology="harness"``, ``system="mini-swe-agent"`` (``"swe-agent"`` for SWE-agent),
``task_id`` = instance id; the repository is the part of the id before ``"__"``
(``django__django-10097`` -> ``django``): group by it to keep repositories apart.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from stopserve.errors import ImporterError
from stopserve.ids import content_refs
from stopserve.importers._common import OnError, fail, finish, iter_files, load_json, report
from stopserve.signals.progress import progress_fields
from stopserve.trace import FORMAT_TAG, Trace

__all__ = ["read", "repo_of", "trace_from_mini", "trace_from_swe_agent"]

_ACTION_RE: Final = re.compile(r"```(?:bash|mswea_bash_command)\s*\n(.*?)\n```", re.DOTALL)
_RETURNCODE_RE: Final = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
_OUTPUT_RE: Final = re.compile(r"<output>\n?(.*?)</output>", re.DOTALL)
_SUBMIT_MARKERS: Final = ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "MINI_SWE_AGENT_FINAL_OUTPUT")
_FORMAT_ERROR_HINTS: Final = ("Please always provide EXACTLY ONE action", "format your action")
_TIMEOUT_HINT: Final = "timed out and has been killed"

_MINI_SUFFIX: Final = ".traj.json"
_SWE_SUFFIX: Final = ".traj"


def repo_of(task_id: str) -> str:
    """The repository of a SWE-bench instance id: the part before ``"__"``."""
    return task_id.split("__", 1)[0]


# --------------------------------------------------------------------------- outcomes


@dataclass
class _Outcomes:
    resolved: dict[str, bool] = field(default_factory=dict)
    reports_dir: Path | None = None

    def get(self, instance_id: str) -> bool | None:
        if instance_id in self.resolved:
            return self.resolved[instance_id]
        if self.reports_dir is not None:
            for name in (f"{instance_id}.report.json", f"{instance_id}/report.json", f"{instance_id}.json"):
                path = self.reports_dir / name
                if path.is_file():
                    return _resolved_from_report(load_json(path), instance_id, path)
        return None


def _resolved_from_report(data: Any, instance_id: str, path: Path) -> bool:
    # a per-instance report is flat, or SWE-bench's {instance_id: {...}}
    if isinstance(data, dict) and isinstance(data.get(instance_id), dict):
        data = data[instance_id]
    if not isinstance(data, dict) or not isinstance(data.get("resolved"), bool):
        raise fail("expected a boolean 'resolved'", file=path, path="resolved")
    return bool(data["resolved"])


def _load_results(path: Path) -> dict[str, bool]:
    data = load_json(path)
    out: dict[str, bool] = {}
    if isinstance(data, dict) and isinstance(data.get("instances"), list):
        for i, item in enumerate(data["instances"]):
            if not isinstance(item, dict) or not isinstance(item.get("instance_id"), str):
                raise fail(
                    "expected an object with a string 'instance_id'", file=path, path=f"instances[{i}]"
                )
            resolved = item.get("resolved")
            if not isinstance(resolved, bool):
                raise fail("expected true or false", file=path, path=f"instances[{i}].resolved")
            out[item["instance_id"]] = resolved
        return out
    if isinstance(data, dict) and isinstance(data.get("resolved_ids"), list):
        # SWE-bench harness report: resolved_ids plus the ids it looked at
        for key in ("completed_ids", "submitted_ids", "unresolved_ids", "error_ids", "empty_patch_ids"):
            for iid in data.get(key) or []:
                if isinstance(iid, str):
                    out[iid] = False
        for iid in data["resolved_ids"]:
            if isinstance(iid, str):
                out[iid] = True
        return out
    if isinstance(data, dict) and data and all(isinstance(v, dict) for v in data.values()):
        for iid, item in data.items():
            resolved = item.get("resolved")
            if not isinstance(resolved, bool):
                raise fail("expected true or false", file=path, path=f"{iid}.resolved")
            out[iid] = resolved
        return out
    raise fail(
        "not a results summary: expected 'instances' (with 'resolved'), 'resolved_ids', "
        "or {instance_id: {'resolved': ...}}",
        file=path,
    )


# --------------------------------------------------------------------------- mini-swe-agent


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _call(k: int, t: float, tool: str, **fields: Any) -> dict[str, Any]:
    """Step ``k``'s model call as a ``tool_use`` event (the agent runs ``tool``); ids ``s<k+1>.call``."""
    event: dict[str, Any] = {
        "id": f"s{k + 1}.call",
        "t": t,
        "type": "tool_use",
        "agent": "agent",
        "role": "assistant",
        "tool": tool,
    }
    event.update(fields)
    return event


def _usage(msg: Mapping[str, Any]) -> tuple[dict[str, Any], float | None]:
    """(usage, created) of one model call, wherever this mini-swe-agent version put them."""
    extra = _dict(msg.get("extra"))
    response = _dict(extra.get("response") or extra.get("model_response"))
    usage = dict(_dict(response.get("usage") or msg.get("usage") or extra.get("usage")))
    created = response.get("created")
    if created is None:
        created = extra.get("timestamp", msg.get("timestamp"))
    if usage.get("cost") is None and isinstance(extra.get("cost"), int | float):
        usage["cost"] = extra["cost"]
    if isinstance(created, int | float) and not isinstance(created, bool) and math.isfinite(created):
        return usage, float(created)
    return usage, None


def _actions(msg: Mapping[str, Any]) -> list[str]:
    calls = msg.get("tool_calls")
    if isinstance(calls, list) and calls:
        out = []
        for call in calls:
            args: Any = _dict(_dict(call).get("function")).get("arguments")
            if isinstance(args, str):
                try:
                    args = orjson.loads(args)
                except ValueError:
                    args = {"command": args}
            out.append(str(args.get("command", args)) if isinstance(args, dict) else str(args))
        return out
    actions = _dict(msg.get("extra")).get("actions")
    if isinstance(actions, list) and actions:
        return [str(a.get("command", a)) if isinstance(a, dict) else str(a) for a in actions]
    return [m.strip() for m in _ACTION_RE.findall(_content_text(msg.get("content")))]


def _returncode(observations: Sequence[Mapping[str, Any]], text: str) -> int | None:
    # v2 keeps it in the observation's extra; v1 only in the text
    for obs in observations:
        extra = obs.get("extra")
        if isinstance(extra, dict) and isinstance(extra.get("returncode"), int):
            return int(extra["returncode"])
    match = _RETURNCODE_RE.search(text)
    return int(match.group(1)) if match else None


def _tokens(usage: Mapping[str, Any]) -> int:
    total = 0
    for key in ("prompt_tokens", "completion_tokens"):
        value = usage.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            total += int(value)
    return total


def _final_stop(
    t: float, reason: str, exit_status: Any, info: Mapping[str, Any], *, sketch: bool = True
) -> dict[str, Any]:
    """The run's own final stop event (both harnesses end with one; the submission's hash as its ref)."""
    event: dict[str, Any] = {
        "id": "end",
        "t": t,
        "type": "stop",
        "agent": "agent",
        "reason": reason,
        "proposed": False,
        "exit_status": exit_status,
    }
    if info.get("submission"):
        event.update(content_refs(str(info["submission"]), sketch=sketch))
    return event


def _stop_reason(
    exit_status: str, n_calls: int, usd: float, budget: Mapping[str, Any]
) -> tuple[str, str | None]:
    status = exit_status.lower()
    if status == "submitted":
        return "information_complete", None
    if status == "limitsexceeded":
        max_turns = budget.get("max_turns")
        max_usd = budget.get("max_usd")
        if max_usd is not None and usd >= max_usd:
            return "budget_exhausted", "usd"
        if max_turns is not None and n_calls >= max_turns:
            return "budget_exhausted", "turns"
        return "budget_exhausted", "turns" if max_turns is not None else "usd"
    if status in ("userinterruption", "keyboardinterrupt"):
        return "external", None
    return "error", None


def trace_from_mini(
    data: Any, file: str | os.PathLike[str], resolved: bool | None = None, *, sketch: bool = True
) -> Trace:
    """Convert one parsed mini-swe-agent trajectory (formats ``mini-swe-agent-1`` and ``-1.1``).

    ``sketch=False`` leaves the texts' sketches out (their hashes stay).
    """
    if not isinstance(data, dict):
        raise fail(f"expected a JSON object, got {type(data).__name__}", file=file)
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise fail("expected a list of messages", file=file, path="messages")
    info = data.get("info") if isinstance(data.get("info"), dict) else {}
    assert isinstance(info, dict)
    name = Path(file).name
    instance_id = data.get("instance_id")
    if not isinstance(instance_id, str) or not instance_id:
        instance_id = name.removesuffix(_MINI_SUFFIX).removesuffix(".json")
    config = info.get("config") if isinstance(info.get("config"), dict) else {}
    assert isinstance(config, dict)
    agent_cfg = config.get("agent") if isinstance(config.get("agent"), dict) else {}
    assert isinstance(agent_cfg, dict)
    budget: dict[str, Any] = {}
    if isinstance(agent_cfg.get("step_limit"), int) and agent_cfg["step_limit"] > 0:
        budget["max_turns"] = agent_cfg["step_limit"]
    if isinstance(agent_cfg.get("cost_limit"), int | float) and agent_cfg["cost_limit"] > 0:
        budget["max_usd"] = float(agent_cfg["cost_limit"])

    # group messages into steps: one assistant message and the observations after it
    steps: list[tuple[int, dict[str, Any], list[dict[str, Any]]]] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise fail("expected a message object", file=file, path=f"messages[{i}]")
        role = msg.get("role")
        if role == "assistant":
            steps.append((i, msg, []))
        elif steps and role in ("user", "tool", "exit"):
            steps[-1][2].append(msg)
    if not steps:
        raise fail("no assistant messages: nothing to import", file=file, path="messages")

    exit_status = str(info.get("exit_status") or "unknown")
    submitted = exit_status.lower() == "submitted"
    events: list[dict[str, Any]] = []
    first_created: float | None = None
    t = 0.0
    missing_cost: list[tuple[dict[str, Any], int]] = []
    n_format_errors = 0
    for k, (i, msg, observations) in enumerate(steps):
        usage, created = _usage(msg)
        if created is not None:
            if first_created is None:
                first_created = created
            t = max(t, created - first_created)  # clocks may step back; t never does
        tokens = _tokens(usage)
        actions = _actions(msg)
        text = "\n".join(_content_text(o.get("content")) for o in observations)
        use = _call(k, t, "bash", tokens=tokens, source_index=i)
        cost = usage.get("cost")
        if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0:
            use["usd"] = float(cost)
        else:
            missing_cost.append((use, tokens))
        is_last = k == len(steps) - 1
        command = actions[0] if len(actions) == 1 else None
        if command is not None and any(m in command for m in _SUBMIT_MARKERS) and (is_last or not text):
            use.update(content_refs(command, sketch=sketch))
            events.append(use)
            events.append(
                {
                    "id": f"s{k + 1}.stop",
                    "t": t,
                    "type": "stop",
                    "agent": "agent",
                    "reason": "information_complete" if submitted or is_last else "unknown",
                    "proposed": False,
                    **content_refs(str(info.get("submission") or text), sketch=sketch),
                }
            )
            break
        ret: dict[str, Any] = {
            "id": f"s{k + 1}.out",
            "t": t,
            "type": "return",
            "agent": "bash",
            "tool": "bash",
        }
        if command is None or any(h in text for h in _FORMAT_ERROR_HINTS):
            n_format_errors += 1
            use.update(content_refs(_content_text(msg.get("content")), sketch=sketch))
            use["format_error"] = True
            ret.update(error=True, format_error=True, **content_refs(text, sketch=sketch))
            ret.update(progress_fields(text, failed=True))
        else:
            use.update(content_refs(command, sketch=sketch))
            code = _returncode(observations, text)
            out = _OUTPUT_RE.search(text)
            output = out.group(1) if out else text
            ret.update(content_refs(output, sketch=sketch))
            if code is not None:
                ret["returncode"] = code
                ret["error"] = code != 0
            elif _TIMEOUT_HINT in text:
                ret.update(error=True, timeout=True)
            # the output the ref hashes, with the exit status read around it
            ret.update(progress_fields(output, tool="bash", exit_code=code, failed=ret.get("error")))
        events.append(use)
        if observations or not is_last:
            events.append(ret)

    metrics: dict[str, float] = {"n_steps": float(len(steps)), "format_errors": float(n_format_errors)}
    stats = info.get("model_stats") if isinstance(info.get("model_stats"), dict) else {}
    assert isinstance(stats, dict)
    instance_cost = stats.get("instance_cost")
    if missing_cost and isinstance(instance_cost, int | float) and instance_cost >= 0:
        known = sum(e.get("usd", 0.0) for e in events)
        left = max(0.0, float(instance_cost) - known)
        weight = sum(tok for _, tok in missing_cost) or len(missing_cost)
        for use, tok in missing_cost:
            use["usd"] = left * ((tok or (1 if weight == len(missing_cost) else 0)) / weight)
        metrics["usd_estimated"] = 1.0
    usd = float(sum(e.get("usd", 0.0) for e in events))

    last_t = events[-1]["t"]
    if events[-1]["type"] != "stop":
        reason, limit = _stop_reason(exit_status, len(steps), usd, budget)
        events.append(_final_stop(last_t, reason, exit_status, info, sketch=sketch))
    else:
        reason, limit = events[-1]["reason"], None
    by = "orchestrator" if reason in ("information_complete", "unknown") else "safety_net"
    if reason in ("external", "error"):
        by = "external"
    stop: dict[str, Any] = {"reason": reason, "by": by, "t": last_t}
    if limit:
        stop["limit"] = limit
    trace: dict[str, Any] = {
        "format": FORMAT_TAG,
        "trace_id": instance_id,
        "task_id": instance_id,
        "system": "mini-swe-agent",
        "topology": "harness",
        "events": events,
        "costs": {
            "tokens": float(sum(e.get("tokens", 0) for e in events)),
            "usd": usd,
            "wall_clock_s": float(last_t),
            "tool_calls": float(sum(1 for e in events if e["type"] == "tool_use")),
            "messages": float(len(messages)),
        },
        "stop": stop,
        "metrics": metrics,
    }
    if budget:
        trace["budget"] = budget
    if resolved is not None:
        trace["rewards"] = {"team": 1.0 if resolved else 0.0}
        metrics["task_success"] = 1.0 if resolved else 0.0
    return finish(trace, file=file)


# --------------------------------------------------------------------------- SWE-agent

_SWE_STOPS: Final[dict[str, tuple[str, str | None]]] = {
    "submitted": ("information_complete", None),
    "exit_cost": ("budget_exhausted", "usd"),
    "exit_context": ("budget_exhausted", "tokens"),
    "exit_total_execution_time": ("budget_exhausted", "seconds"),
    "exit_step_limit": ("budget_exhausted", "turns"),
}


def _swe_stop(exit_status: str) -> tuple[str, str | None]:
    status = exit_status.strip().lower()
    if status in _SWE_STOPS:
        return _SWE_STOPS[status]
    # "submitted (exit_cost)": autosubmitted when a limit hit
    match = re.match(r"submitted \((\w+)\)", status)
    if match and match.group(1) in _SWE_STOPS:
        return _SWE_STOPS[match.group(1)]
    return "error", None


def trace_from_swe_agent(
    data: Any, file: str | os.PathLike[str], resolved: bool | None = None, *, sketch: bool = True
) -> Trace:
    """Convert one parsed SWE-agent ``.traj`` (``trajectory`` of action/observation/state).

    SWE-agent logs token totals per run, not per step: each step gets an equal share
    (``metrics.tokens_estimated = 1``); ``t`` sums the steps' ``execution_time``; a
    step's ``error`` is unknown (SWE-agent records no return code) and left out.
    ``sketch=False`` leaves the texts' sketches out (their hashes stay).
    """
    if not isinstance(data, dict):
        raise fail(f"expected a JSON object, got {type(data).__name__}", file=file)
    steps = data.get("trajectory")
    if not isinstance(steps, list) or not steps:
        raise fail("expected a non-empty list of steps", file=file, path="trajectory")
    info = data.get("info") if isinstance(data.get("info"), dict) else {}
    assert isinstance(info, dict)
    stats = info.get("model_stats") if isinstance(info.get("model_stats"), dict) else {}
    assert isinstance(stats, dict)
    name = Path(file).name
    instance_id = str(data.get("instance_id") or info.get("instance_id") or name.removesuffix(_SWE_SUFFIX))
    total_tokens = 0
    for key in ("tokens_sent", "tokens_received"):
        value = stats.get(key)
        if isinstance(value, int | float) and value >= 0:
            total_tokens += int(value)
    cost = stats.get("instance_cost")
    usd_total = float(cost) if isinstance(cost, int | float) and cost >= 0 else None
    n = len(steps)
    events: list[dict[str, Any]] = []
    t = 0.0
    exit_status = str(info.get("exit_status") or "unknown")
    for k, step in enumerate(steps):
        if not isinstance(step, dict):
            raise fail("expected a step object", file=file, path=f"trajectory[{k}]")
        action = step.get("action")
        if not isinstance(action, str):
            raise fail("expected the action as a string", file=file, path=f"trajectory[{k}].action")
        words = action.strip().split(maxsplit=1)
        tool = words[0] if words else "empty"
        use = _call(k, t, tool, **content_refs(action, sketch=sketch))
        use["tokens"] = total_tokens // n + (1 if k < total_tokens % n else 0)
        if usd_total is not None:
            use["usd"] = usd_total / n
        events.append(use)
        elapsed = step.get("execution_time")
        if isinstance(elapsed, int | float) and elapsed > 0:
            t += float(elapsed)
        if tool == "submit" and k == n - 1:
            break
        observation = _content_text(step.get("observation"))
        ret: dict[str, Any] = {
            "id": f"s{k + 1}.out",
            "t": t,
            "type": "return",
            "agent": tool,
            "tool": tool,
            **content_refs(observation, sketch=sketch),
        }
        # an editor's sub-command (``str_replace_editor view ...``) says whether a file changed
        args = words[1].split(maxsplit=1) if len(words) > 1 else []
        ret.update(progress_fields(observation, tool=tool, tool_input={"command": args[0]} if args else None))
        events.append(ret)
    reason, limit = _swe_stop(exit_status)
    events.append(_final_stop(t, reason, exit_status, info, sketch=sketch))
    stop: dict[str, Any] = {"reason": reason, "by": "orchestrator" if limit is None else "safety_net", "t": t}
    if limit:
        stop["limit"] = limit
    if reason == "error":
        stop["by"] = "external"
    metrics: dict[str, float] = {"n_steps": float(n), "tokens_estimated": 1.0}
    trace: dict[str, Any] = {
        "format": FORMAT_TAG,
        "trace_id": instance_id,
        "task_id": instance_id,
        "system": "swe-agent",
        "topology": "harness",
        "events": events,
        "costs": {"tokens": float(total_tokens), "wall_clock_s": t, "tool_calls": float(n)},
        "stop": stop,
        "metrics": metrics,
    }
    if usd_total is not None:
        trace["costs"]["usd"] = usd_total
    if resolved is not None:
        trace["rewards"] = {"team": 1.0 if resolved else 0.0}
        metrics["task_success"] = 1.0 if resolved else 0.0
    return finish(trace, file=file)


# --------------------------------------------------------------------------- entry point


def read(
    sources: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    results: str | os.PathLike[str] | None = None,
    reports: str | os.PathLike[str] | None = None,
    *,
    on_error: OnError = None,
    sketch: bool = True,
) -> Iterator[Trace]:
    """Yield one :class:`Trace` per ``.traj.json`` (mini-swe-agent) or ``.traj`` (SWE-agent) file.

    A run folder's ``results_summary.json`` and ``reports/`` are used when ``results``
    and ``reports`` are not given. A file that cannot be converted raises
    :class:`ImporterError`, or goes to ``on_error`` and is skipped. ``sketch=False`` leaves
    the texts' sketches out (``stopserve import --no-sketch``).

    >>> traces = read("../shared/data/swe-verified-gemini3-train")  # doctest: +SKIP
    """
    if isinstance(sources, str | os.PathLike):
        sources = [sources]
    outcomes = _Outcomes()
    if results is not None:
        outcomes.resolved = _load_results(Path(results))
    if reports is not None:
        if not Path(reports).is_dir():
            raise fail("not a folder of <id>.report.json files", file=reports)
        outcomes.reports_dir = Path(reports)
    searched: list[Path] = []
    for source in sources:
        path = Path(source)
        here = path if path.is_dir() else path.parent
        # a run folder: <run>/results_summary.json, <run>/reports/, <run>/trajs/
        for base in (here, here.parent):
            summary = base / "results_summary.json"
            if results is None and not outcomes.resolved and summary.is_file():
                outcomes.resolved = _load_results(summary)
            if reports is None and outcomes.reports_dir is None and (base / "reports").is_dir():
                outcomes.reports_dir = base / "reports"
        trajs = path / "trajs"
        searched.append(trajs if trajs.is_dir() else path)
    for file in iter_files(searched, (_MINI_SUFFIX, _SWE_SUFFIX)):
        try:
            data = load_json(file)
            is_swe = file.name.lower().endswith(_SWE_SUFFIX) or (
                isinstance(data, dict) and "trajectory" in data and "messages" not in data
            )
            iid = _instance_id(data, file)
            resolved = outcomes.get(iid)
            if is_swe:
                yield trace_from_swe_agent(data, file, resolved, sketch=sketch)
            else:
                yield trace_from_mini(data, file, resolved, sketch=sketch)
        except ImporterError as err:
            report(err, on_error)


def _instance_id(data: Any, file: Path) -> str:
    if isinstance(data, dict):
        iid = data.get("instance_id")
        info = data.get("info")
        if not iid and isinstance(info, dict):
            iid = info.get("instance_id")
        if isinstance(iid, str) and iid:
            return iid
    return file.name.removesuffix(_MINI_SUFFIX).removesuffix(_SWE_SUFFIX)
