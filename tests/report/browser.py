"""Headless Chromium (Debian's ``chromium``, never a downloaded browser) driven by Playwright.

Flags as the house runs a browser in tests: no sandbox (root in CI), no GPU, no QUIC, no
first-run, background networking, component updates or sync; a fresh profile in the test's
tmp dir. Tests skip, saying why, where the browser or the driver is missing (``.ci/run``
installs both).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

__all__ = ["CHROMIUM", "FLAGS", "chromium"]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


@contextmanager
def chromium(profile: Path, *, width: int = 1300, height: int = 900) -> Iterator[Any]:
    """A browser context with a fresh ``--user-data-dir`` (``profile``); yields a new page."""
    why = "playwright is not installed (the [dev] extra)"
    sync_api = pytest.importorskip("playwright.sync_api", reason=why)
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM}: apt-get install chromium (.ci/run does)")
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=list(FLAGS),
            viewport={"width": width, "height": height},
        )
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()
