"""Bodies of the ``stopserve validate`` and ``stopserve import`` commands."""

from __future__ import annotations

import argparse
import sys

from stopserve.trace import scan

__all__ = ["validate"]


def validate(args: argparse.Namespace) -> int:
    """List every problem in every file; exit 0 when all traces are valid, else 1."""
    n_traces = n_bad = n_issues = 0
    shown = 0
    for path in args.files:
        for record in scan(path, strict=args.strict):
            n_traces += record.trace is not None or bool(record.issues)
            if not record.issues:
                continue
            n_bad += 1
            n_issues += len(record.issues)
            for issue in record.issues:
                if shown < args.max_errors:
                    print(issue)
                    shown += 1
    if shown < n_issues:
        print(f"... {n_issues - shown} more problems not shown (--max-errors {args.max_errors})")
    files = len(args.files)
    if n_bad:
        print(
            f"{n_bad} of {n_traces} traces invalid ({n_issues} problems) in {files} file(s)",
            file=sys.stderr,
        )
        return 1
    print(f"all {n_traces} traces valid in {files} file(s)", file=sys.stderr)
    return 0
