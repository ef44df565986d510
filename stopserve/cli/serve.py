"""``stopserve serve``: the service in uvicorn (:func:`stopserve.service.app.serve`)."""

from __future__ import annotations

import argparse
from typing import Any

from stopserve.cli._args import flag_words, positive_int

__all__ = ["add_parsers", "serve_command"]


def add_parsers(sub: Any) -> None:
    """Add ``serve`` to ``sub``."""
    p = sub.add_parser("serve", help="serve continue-or-stop decisions over HTTP")
    p.add_argument("--model", metavar="DIR", help="model directory (default: the shipped models/default)")
    p.add_argument("--host", help="bind address (default 127.0.0.1; STOPSERVE_HOST)")
    p.add_argument("--port", type=int, help="port (default 8080; STOPSERVE_PORT)")
    p.add_argument("--log-dir", metavar="DIR", help="decision and trace log folder (STOPSERVE_LOG_DIR)")
    p.add_argument(
        "--workers",
        type=positive_int,
        help="worker processes (default 1; STOPSERVE_WORKERS); more than 1 needs the shared run store "
        "STOPSERVE_STORE=redis://... (docs/service.md)",
    )
    p.add_argument("--no-model", action="store_true", help="run on safety nets alone")


def serve_command(args: argparse.Namespace) -> int:
    """``stopserve serve``: options override STOPSERVE_ settings; runs uvicorn."""
    from stopserve.service.app import serve

    with flag_words(workers="--workers", host="--host"):
        return serve(
            model_dir=args.model,
            host=args.host,
            port=args.port,
            log_dir=args.log_dir,
            workers=args.workers,
            no_model=args.no_model,
        )
