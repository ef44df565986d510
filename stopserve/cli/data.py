"""``stopserve validate``, ``stopserve import`` and ``stopserve features``: traces in, checked,
converted or featurized."""

from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from stopserve.cli._args import TRACES_HELP, dask_options, label_options, no_progress, positive_int
from stopserve.errors import ImporterError, TraceFormatError

if TYPE_CHECKING:
    from stopserve.trace import Trace

__all__ = ["IMPORT_FORMATS", "add_parsers", "features_command", "import_traces", "validate"]

IMPORT_FORMATS: Final = (
    "survey",
    "mini-swe-agent",
    "openai-chat",
    "otel",
    "mint",
    "intercode",
    "claude-code",
    "codex",
)

_T = TypeVar("_T")

#: skipped sources listed one by one before the rest are only counted
_SHOW_SKIPS = 20


def add_parsers(sub: Any) -> None:
    """Add ``validate``, ``import`` and ``features`` to ``sub``."""
    p = sub.add_parser("validate", help="check trace files against format v1; list every error")
    p.add_argument("files", nargs="+", metavar="FILE", help=TRACES_HELP)
    p.add_argument("--strict", action="store_true", help="reject unknown top-level fields")
    p.add_argument(
        "--max-errors", type=positive_int, default=1000, help="stop listing problems after this many"
    )
    no_progress(p)

    p = sub.add_parser(
        "import",
        help="convert a foreign trace format to format v1 JSON Lines",
        description="Convert a foreign trace format to format v1 JSON Lines (docs/trace-format.md). "
        "A run that cannot be converted is skipped and listed on stderr with its file and field; "
        "the summary line counts the skips by reason.",
        epilog="Exit status: 0 when traces were written, skips or not; 1 with --strict when any run "
        "was skipped (the others are still written); 2 when nothing could be imported.",
    )
    p.add_argument("format", choices=IMPORT_FORMATS, help="the source format")
    p.add_argument("sources", nargs="+", metavar="SRC", help="files or folders to read")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="output .jsonl or .jsonl.gz")
    p.add_argument("--results", metavar="FILE", help="mini-swe-agent: results summary with resolved flags")
    p.add_argument("--reports", metavar="DIR", help="mini-swe-agent: folder of <id>.report.json files")
    p.add_argument("--reward", type=float, help="openai-chat: reward for runs that carry none")
    p.add_argument(
        "--labels", metavar="FILE", help="claude-code, codex: session rewards (the hook's labels.jsonl)"
    )
    p.add_argument(
        "--strict", action="store_true", help="exit 1 when any run was skipped (the rest is still written)"
    )
    p.add_argument(
        "--no-sketch",
        action="store_true",
        help="leave out the similarity sketches of the texts (content hashes only; docs/trace-format.md)",
    )
    no_progress(p)

    p = sub.add_parser(
        "features", help="write the features and labels of every decision point as CSV or Parquet"
    )
    p.add_argument("traces", nargs="+", metavar="TRACES", help=TRACES_HELP)
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("-o", "--output", metavar="CSV", help="one CSV file")
    out.add_argument(
        "--parquet",
        metavar="DIR",
        help="a new folder of Parquet files, one per input file, the same columns as the CSV "
        "(needs the dask extra)",
    )
    dask_options(p, "featurize on a Dask cluster, one task per input file")
    label_options(p)
    no_progress(p)


def validate(args: argparse.Namespace) -> int:
    """List every problem in every file, then one summary line; exit 0 when all valid, else 1.

    Problems go to stdout, one a line (``file:line: trace 'id': field: message``), and
    likely typos as ``warning:`` lines (an unknown field close to a known one: kept as an
    extra field; ``--strict`` makes them problems); the summary is the last line.
    """
    from stopserve.progress import progress
    from stopserve.trace import scan

    n_valid = n_invalid = n_unreadable = n_issues = n_warnings = 0
    shown = 0
    for path in args.files:
        records = progress(
            scan(path, strict=args.strict),
            desc=f"validate {path}",
            unit=" traces",
            enabled=not args.no_progress,
        )
        try:
            for record in records:
                n_warnings += len(record.warnings)
                for warning in record.warnings:
                    if shown < args.max_errors:
                        print(f"warning: {warning}")
                        shown += 1
                if record.trace is not None:
                    n_valid += 1
                    continue
                if record.readable:
                    n_invalid += 1
                else:
                    n_unreadable += 1
                n_issues += len(record.issues)
                for issue in record.issues:
                    if shown < args.max_errors:
                        print(issue)
                        shown += 1
        except TraceFormatError as exc:  # cannot open: report it like any other problem
            n_unreadable += 1
            n_issues += 1
            if shown < args.max_errors:
                print(exc)
                shown += 1
    if shown < n_issues + n_warnings:
        what = "problems and warnings" if n_warnings else "problems"
        print(f"... {n_issues + n_warnings - shown} more {what} not shown (--max-errors {args.max_errors})")
    files = len(args.files)
    total = n_valid + n_invalid
    warned = f"; {n_warnings} warning(s): likely typos, kept (--strict refuses them)" if n_warnings else ""
    if n_invalid or n_unreadable:
        parts = [f"{n_invalid} of {total} traces invalid"]
        if n_unreadable:
            parts.append(f"{n_unreadable} unreadable input(s)")
        print(f"invalid: {', '.join(parts)} ({n_issues} problems) in {files} file(s){warned}")
        return 1
    print(f"valid: all {total} traces in {files} file(s){warned}")
    return 0


#: Importers whose ``read`` takes ``sketch=False`` (the texts are not sketched at all).
_SKETCH_OPTION: Final = frozenset({"intercode", "mini-swe-agent", "mint"})


def _without_sketches(trace: Trace) -> Trace:
    """``trace`` with no event carrying a sketch (``stopserve import --no-sketch``)."""
    events = [e.model_copy(update={"sketch": None}) if e.sketch is not None else e for e in trace.events]
    return trace.model_copy(update={"events": events})


def import_traces(args: argparse.Namespace) -> int:
    """Convert foreign traces to format v1 JSON Lines; say how many were written and skipped.

    Exit 0 when traces were written, whether or not some runs were skipped (each skip is
    listed on stderr and counted in the summary); with ``--strict`` 1 when any was skipped
    (the rest is still written); 2 when nothing could be imported.
    """
    from stopserve.importers import IMPORTERS
    from stopserve.progress import progress
    from stopserve.trace import TraceWriter

    options: dict[str, Any] = {}
    if args.format == "mini-swe-agent":
        options.update(results=args.results, reports=args.reports)
    elif args.results or args.reports:
        raise ImporterError("--results and --reports apply to mini-swe-agent only")
    if args.format == "openai-chat":
        if args.reward is not None:
            options["reward"] = args.reward
    elif args.reward is not None:
        raise ImporterError("--reward applies to openai-chat only")
    if args.format in ("claude-code", "codex"):
        if args.labels is not None:
            options["labels"] = args.labels
    elif args.labels is not None:
        raise ImporterError("--labels applies to claude-code and codex only")
    if args.no_sketch and args.format in _SKETCH_OPTION:
        options["sketch"] = False  # not computed at all; the others' are dropped as they are written

    skipped: list[ImporterError] = []
    out = Path(args.output)
    if out.is_dir():
        raise TraceFormatError(f"{out}: is a folder; give the output file, e.g. {out / 'traces.jsonl'}")
    tmp = out.with_name(f".{out.name}.part")  # never leave a half-written OUT behind
    reader = IMPORTERS[args.format](args.sources, on_error=skipped.append, **options)
    try:
        with TraceWriter(tmp) as writer:
            bar = progress(reader, desc=f"import {args.format}", unit=" traces", enabled=not args.no_progress)
            for trace in bar:
                writer.write(_without_sketches(trace) if args.no_sketch else trace)
            count = writer.count
        if count == 0:
            tmp.unlink(missing_ok=True)
        else:
            try:
                os.replace(tmp, out)
            except OSError as exc:
                raise TraceFormatError(f"{out}: cannot write: {exc.strerror or exc}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

    for err in skipped[:_SHOW_SKIPS]:
        for line in [str(issue) for issue in err.issues] or [err.message]:
            print(f"skipped: {line}", file=sys.stderr)
    if len(skipped) > _SHOW_SKIPS:
        print(f"skipped: ... and {len(skipped) - _SHOW_SKIPS} more", file=sys.stderr)
    summary = f"imported {count} traces to {out}"
    if skipped:
        reasons = collections.Counter(_reason(err) for err in skipped)
        why = "; ".join(f"{n}x {reason}" for reason, n in reasons.most_common(5))
        summary += f"; skipped {len(skipped)} ({why})"
    else:
        summary += "; skipped 0"
    print(summary)
    if count == 0:
        print(f"stopserve import: error: nothing imported; {out} not written", file=sys.stderr)
        return 2
    return 1 if skipped and args.strict else 0


def _reason(err: ImporterError) -> str:
    # the message without its location, so equal causes group together
    if err.issues:
        return err.issues[0].message
    return err.message


def features_command(args: argparse.Namespace) -> int:
    """``stopserve features TRACES (-o CSV | --parquet DIR) [--dask ADDRESS|local:N]``."""
    from stopserve.training.labels import load_decision_points, write_features_csv

    if args.parquet is not None or args.dask is not None:
        return _features_dask(args)
    dp = load_decision_points(
        args.traces,
        cost_unit=args.cost_unit,
        labels_from_rewards=args.labels_from_rewards,
        progress=not args.no_progress,
    )
    write_features_csv(dp, args.output)
    return 0


def _features_dask(args: argparse.Namespace) -> int:
    """``features`` to Parquet, or on a Dask cluster (the dask extra)."""
    from stopserve.cli.train import dask_backend
    from stopserve.training.backend import TraceSource
    from stopserve.training.distributed import write_parquet
    from stopserve.training.labels import write_features_csv

    source = TraceSource([str(p) for p in args.traces])
    backend = dask_backend(args, progress=not args.no_progress)
    try:
        if args.parquet is not None:
            n_rows, n_files, unit = write_parquet(
                source,
                args.parquet,
                cost_unit=args.cost_unit,
                labels_from_rewards=args.labels_from_rewards,
                backend=backend,
            )
            print(
                f"wrote {n_rows} decision points to {n_files} Parquet files in {args.parquet} ({unit})",
                file=sys.stderr,
            )
            return 0
        assert backend is not None  # CSV without --dask is features_command's own path
        dp = backend.decision_points(
            source,
            cost_unit=args.cost_unit,
            labels_from_rewards=args.labels_from_rewards,
            group_by="task",
            progress=False,
            nets=None,
            normalize_cost=False,
        )
        write_features_csv(dp, args.output)
        return 0
    finally:
        if backend is not None:
            backend.close()
