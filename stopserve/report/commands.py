"""What ``stopserve report LOGDIR`` and ``stopserve hook report --html`` show: read the logs, summarise, show.

Bad input never ends in a traceback: a missing directory is a one-line error; an empty,
truncated or foreign one gives one line on stderr (what and where: the first problem, and
how many more) and a report of what could be read.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import orjson

from stopserve.errors import ConfigError
from stopserve.report.read import Problem, find_logs, model_units, read_champion, read_records
from stopserve.report.summary import Summarizer, Summary

__all__ = ["report", "service_logs", "summarize_dirs", "write_html"]


def summarize_dirs(
    roots: Sequence[Path],
    *,
    model_store: Path | None = None,
    cost_unit: str | None = None,
    success_at: float = 0.5,
    title: str = "stopserve report",
) -> Summary:
    """Read every log of ``roots`` (decisions first, then traces, labels, promotions) into a Summary."""
    found = [find_logs(root, model_store=model_store) for root in roots]
    store = next((f.store for f in found if f.store is not None), None)
    s = Summarizer(units=model_units(store), cost_unit=cost_unit, success_at=success_at)
    paths = [p for f in found for p in f.decisions]
    paths += [p for f in found for p in f.traces]
    paths += [p for f in found for p in f.labels]
    paths += [p for f in found if (p := f.promotions) is not None]
    for path in paths:
        chunk = read_records(path, s.add)
        s.read_file(str(path), chunk.records)
        for problem in chunk.problems:
            s.problem(problem)
        if not chunk.records and chunk.problems:
            s.notes.append(f"{path}: nothing in it could be read (not a stopserve log?)")
    champion = next((f.champion for f in found if f.champion is not None), None)
    if champion is not None:
        s.champion = read_champion(champion)
        if s.champion is None:
            s.problem(Problem(str(champion), None, "not a readable champion pointer"))
    if not paths:
        s.notes.append(
            f"{', '.join(str(r) for r in roots)}: no stopserve log found (decisions.jsonl, traces.jsonl, "
            "a hook's decisions.jsonl or models/promotions.jsonl)"
        )
    return s.summary(title=title, source=", ".join(str(r) for r in roots))


def write_html(path: Path, html: str) -> None:
    """Write the page atomically (beside it, then rename): a reader never sees half a page."""
    path = path.resolve()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write the report: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(html)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ConfigError(f"{path}: cannot write the report: {exc.strerror or exc}") from None


def service_logs(text: str | Path) -> Path:
    """``text`` as a log directory that exists (a one-line error otherwise)."""
    root = Path(text)
    if not root.exists():
        raise ConfigError(
            f"{root}: no such directory (give the service's log directory, e.g. stopserve-logs)"
        )
    if not root.is_dir():
        raise ConfigError(
            f"{root}: a file, not a directory: give the folder that holds decisions.jsonl and traces.jsonl"
        )
    return root


def _say_problems(s: Summary, command: str) -> None:
    """One line on stderr: the first thing that could not be read, and how many more (or why nothing)."""
    if s.n_problems:
        more = [f"{s.n_problems - 1} more problems"] if s.n_problems > 1 else []
        unreadable = sum(1 for note in s.notes if note.endswith("(not a stopserve log?)"))
        if unreadable:
            more.append(f"{unreadable} file{'s' if unreadable > 1 else ''} with nothing readable")
        said = f" (and {', '.join(more)})" if more else ""
        print(f"{command}: {s.problems[0]}{said}; the rest was read", file=sys.stderr)
    elif s.notes:
        print(f"{command}: {s.notes[0]}", file=sys.stderr)


def _text(s: Summary) -> str:
    e = s.ends
    pct = f" ({100 * s.n_stopped / s.n_runs:.1f}%)" if s.n_runs else ""
    c = s.cost
    lines = [
        f"{s.source}: {s.n_runs} runs, {s.n_decisions} decisions",
        f"stopped by stopserve: {s.n_stopped}{pct}: budget {e['budget']}, rule {e['rule']}, "
        f"model {e['model']}; ended on their own: {e['agent']}; open: {e['open']}",
        f"loops caught: {s.n_loops}",
        f"cost: {c.spent:.4g} {c.unit} spent by {c.runs_costed} runs logged whole; saved, estimated:"
        f" {c.saved:.4g} {c.unit} (from cost_to_go: {c.methods['cost_to_go']} stops, from runs like it:"
        f" {c.methods['median']}, not estimated: {c.methods['none']})",
    ]
    labelled = sum(o.runs for o in s.outcomes)
    if labelled:
        parts = ", ".join(f"{o.end} {o.successes}/{o.runs}" for o in s.outcomes)
        ok = sum(o.successes for o in s.outcomes)
        lines.append(
            f"success (reward >= {s.success_at:g}): {100 * ok / labelled:.1f}% of {labelled} runs with an"
            f" outcome ({parts})"
        )
    else:
        lines.append("success: no outcome with a reward reported yet")
    m = s.models
    promoted = sum(1 for p in m.promotions if p.kind == "promotion")
    lines.append(
        f"champion: {m.champion or 'none promoted'}; retrains logged: "
        f"{sum(1 for p in m.promotions if p.kind != 'rollback')} ({promoted} promoted)"
    )
    return "\n".join(lines)


def report(
    roots: Sequence[Path],
    *,
    html: str | Path | None = None,
    as_json: bool = False,
    model_store: str | Path | None = None,
    cost_unit: str | None = None,
    success_at: float = 0.5,
    title: str = "stopserve report",
) -> int:
    """Summarise the logs of ``roots`` and show them: text, one JSON object (``as_json``) or one
    HTML page written to ``html``. Problems are one line on stderr, led by ``title``; 1 when
    nothing could be read, else 0."""
    html_out = Path(html) if html else None
    if html_out is not None:
        from stopserve.report.views import plotly_js

        plotly_js()  # a missing [report] extra is one line before anything is read
    store = Path(model_store) if model_store else None
    s = summarize_dirs(roots, model_store=store, cost_unit=cost_unit, success_at=success_at, title=title)
    _say_problems(s, title)
    if html_out is not None:
        from stopserve.report.views import render

        write_html(html_out, render(s))
        print(
            f"{html_out}: {s.n_runs} runs, {s.n_decisions} decisions, {s.n_stopped} stopped, "
            f"{s.n_loops} loops caught"
        )
    elif as_json:
        from dataclasses import asdict

        print(orjson.dumps(asdict(s), default=str).decode())
    else:
        print(_text(s))
    return 0 if s.files or not s.notes else 1
