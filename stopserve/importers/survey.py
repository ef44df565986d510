"""Import traces in the survey artifact's schema (awesome-llm-mas-rl ``trace_schema.json``).

Format v1 is a superset of that schema, so a survey trace is mostly read as it is:
its ten event types map as the spec says (``SURVEY_TYPE_MAP`` in ``stopserve.trace``).
What the survey allows and v1 does not is repaired, never refused:

* events out of time order are sorted by ``t`` (stable: ties keep file order);
* a repeated event id gets a ``#2``, ``#3`` ... suffix (edges keep naming the first);
* edges naming no event are dropped and counted in ``metrics.survey_dropped_edges``;
* an extra event field whose name v1 reserves (``tokens``, ``value``, ``decision`` ...)
  but whose value does not fit v1 is kept as ``survey_<name>``;
* a cost v1 cannot hold (negative) moves to ``metrics.survey_cost_<name>``;
* an event that carries its text in an extra field (``content``, ``text``, ``message`` or
  ``output``, the first that is a string) and no ``sketch`` gets the text's sketch.

Files: ``.json`` (one trace, or a list), ``.jsonl``/``.jsonl.gz`` (one a line), or folders of them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, Final

from pydantic import ValidationError

from stopserve.errors import ImporterError
from stopserve.importers._common import OnError, fail, finish, iter_files, iter_json_records, report
from stopserve.signals.sketch import sketch
from stopserve.trace import Event, Trace

__all__ = ["convert", "read"]

#: v1 event fields the survey schema leaves free (``additionalProperties: true``)
_RESERVED: Final = (
    "tokens",
    "usd",
    "error",
    "value",
    "channel",
    "reason",
    "proposed",
    "grade",
    "decision",
    "role",
    "from",
    "to",
    "tool",
    "content_ref",
    "sketch",
)
#: extra event fields that may hold the event's text: the first string one is sketched
_TEXT_FIELDS: Final = ("content", "text", "message", "output")
_SUFFIXES: Final = (".json", ".jsonl", ".jsonl.gz", ".json.gz", ".ndjson")


def _fit_event(ev: dict[str, Any]) -> dict[str, Any]:
    """Rename reserved extra fields whose values v1 would reject; sketch an event's text if it has one."""
    if "sketch" not in ev:
        text = next((ev[k] for k in _TEXT_FIELDS if isinstance(ev.get(k), str)), None)
        if text is not None:
            ev = {**ev, "sketch": sketch(text)}
    try:
        Event.model_validate(ev, strict=True)
        return ev
    except ValidationError as exc:
        bad = {str(err["loc"][0]) for err in exc.errors() if err["loc"]}
    fixed = dict(ev)
    for key in _RESERVED:
        if key in bad and key in fixed:
            fixed[f"survey_{key}"] = fixed.pop(key)
    return fixed


def convert(data: Any, *, file: str | os.PathLike[str] = "<input>", line: int | None = None) -> Trace:
    """Turn one survey-schema trace object into a valid format-v1 :class:`Trace`."""
    if not isinstance(data, dict):
        raise fail(f"a trace must be a JSON object, got {type(data).__name__}", file=file, line=line)
    out = dict(data)
    events = data.get("events")
    metrics = dict(data["metrics"]) if isinstance(data.get("metrics"), dict) else data.get("metrics")
    if isinstance(events, list):
        fixed: list[Any] = []
        seen: dict[str, int] = {}
        for raw in events:
            if not isinstance(raw, dict):
                fixed.append(raw)  # reported by validation with its index
                continue
            ev = _fit_event(raw)
            eid = ev.get("id")
            if isinstance(eid, str):
                seen[eid] = seen.get(eid, 0) + 1
                if seen[eid] > 1:
                    ev = {**ev, "id": f"{eid}#{seen[eid]}", "survey_id": eid}
            fixed.append(ev)

        def when(ev: Any) -> float:
            t = ev.get("t") if isinstance(ev, dict) else None
            return float(t) if isinstance(t, int | float) and not isinstance(t, bool) else 0.0

        out["events"] = sorted(fixed, key=when)
        ids = {ev["id"] for ev in fixed if isinstance(ev, dict) and isinstance(ev.get("id"), str)}
        edges = data.get("edges")
        if isinstance(edges, list):
            kept = [
                e
                for e in edges
                if not isinstance(e, dict)
                or not (isinstance(e.get("src"), str) and isinstance(e.get("dst"), str))
                or (e["src"] in ids and e["dst"] in ids)
            ]
            if len(kept) < len(edges) and (metrics is None or isinstance(metrics, dict)):
                metrics = metrics or {}
                metrics["survey_dropped_edges"] = float(len(edges) - len(kept))
            out["edges"] = kept
    costs = data.get("costs")
    if isinstance(costs, dict) and (metrics is None or isinstance(metrics, dict)):
        moved = {
            k: v for k, v in costs.items() if isinstance(v, int | float) and not isinstance(v, bool) and v < 0
        }
        if moved:
            metrics = metrics or {}
            for key, value in moved.items():
                metrics[f"survey_cost_{key}"] = float(value)
            out["costs"] = {k: v for k, v in costs.items() if k not in moved}
    if metrics is not None:
        out["metrics"] = metrics
    return finish(out, file=file, line=line)


def read(
    sources: Sequence[str | os.PathLike[str]] | str | os.PathLike[str], *, on_error: OnError = None
) -> Iterator[Trace]:
    """Yield one :class:`Trace` per survey-schema trace in ``sources`` (files or folders).

    A trace that cannot be converted raises :class:`ImporterError` listing every problem,
    or goes to ``on_error`` and is skipped.
    """
    for path in iter_files(sources, _SUFFIXES):
        try:
            for line, item in iter_json_records(path):
                if isinstance(item, ImporterError):
                    report(item, on_error)
                    continue
                try:
                    yield convert(item, file=path, line=line)
                except ImporterError as err:
                    report(err, on_error)
        except ImporterError as err:
            report(err, on_error)
