"""The live page's data: a log directory followed by file offset, so a look reads only what is new.

:class:`LiveLogs` keeps one :class:`~stopserve.report.summary.Summarizer` and, for every log
file it has read (known by device and inode, so a rotation -- a rename -- is followed), the
offset of the first byte it has not read. A look (:meth:`LiveLogs.page`) reads the bytes
appended since the last look, folds them, and draws the page; with nothing new it draws from
the same summary. Every look checks for new bytes (a ``stat`` per log when nothing is new), so
a reload shows every line the service has written; ``ttl_s`` > 0 would let looks that close
together share one check. The work of a look is bounded:

- the first look reads at most ``window_bytes`` of each log (decisions, traces), the newest:
  a 1 GB log is not read whole for a page (``stopserve report`` reads it whole);
- a later look reads what was appended; when that is more than ``window_bytes`` (nobody
  looked for a long time), or the fold holds more than ``max_runs`` runs, it starts over
  from the newest ``window_bytes``;
- whatever it read, it draws the most recent runs and timelines only (the summary's caps).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from stopserve.report.read import find_logs, model_units, read_champion, read_records
from stopserve.report.summary import Summarizer, Summary

__all__ = ["DEFAULT_WINDOW_BYTES", "LiveLogs"]

#: Bytes of each log the page covers at most (the newest).
DEFAULT_WINDOW_BYTES: Final = 32 << 20
#: Runs the fold may hold before it starts over from the window.
DEFAULT_MAX_RUNS: Final = 50_000


@dataclass
class _Follow:
    offset: int
    line: int | None  # the number of the line at ``offset`` (None: started inside the file)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


class LiveLogs:
    """A log directory, followed by file offset (see the module docstring)."""

    def __init__(
        self,
        log_dir: Path,
        *,
        model_store: Path | None = None,
        window_bytes: int = DEFAULT_WINDOW_BYTES,
        max_runs: int = DEFAULT_MAX_RUNS,
        ttl_s: float = 0.0,
        title: str = "stopserve live",
    ) -> None:
        self.log_dir = log_dir
        self.model_store = model_store
        self.window_bytes = window_bytes
        self.max_runs = max_runs
        self.ttl_s = ttl_s
        self.title = title
        self._lock = threading.Lock()
        self._files: dict[tuple[int, int], _Follow] = {}
        self._summarizer: Summarizer | None = None
        self._champion_sig: tuple[int, int] | None = None
        self._summary: Summary | None = None
        self._page: str | None = None
        self._checked = 0.0
        #: bytes read by the last look, and by all looks (what the bench measures)
        self.last_read = 0
        self.total_read = 0
        self._skipped: dict[str, int] = {}

    # ------------------------------------------------------------------ reading

    def _start(self) -> Summarizer:
        found = find_logs(self.log_dir, model_store=self.model_store)
        self._files.clear()
        self._skipped.clear()
        self._champion_sig = None
        s = Summarizer(units=model_units(found.store))
        self._summarizer = s
        return s

    def _stat(self, path: Path) -> os.stat_result | None:
        try:
            return path.stat()
        except OSError:
            return None

    def refresh(self) -> int:
        """Read what was appended since the last look; the bytes read."""
        with self._lock:
            return self._refresh()

    def _refresh(self) -> int:
        s = self._summarizer or self._start()
        found = find_logs(self.log_dir, model_store=self.model_store)
        logs = {
            "decisions": found.decisions,
            "traces": found.traces,
            "labels": found.labels,
            "promotions": [p for p in (found.promotions,) if p is not None],
        }
        # what each log would need read now; past the window: start over from the newest bytes
        plans: dict[str, list[tuple[Path, tuple[int, int], int, int]]] = {}
        backlog = 0
        for name, paths in logs.items():
            plan = []
            for path in paths:
                st = self._stat(path)
                if st is None:
                    continue
                key = (st.st_dev, st.st_ino)
                follow = self._files.get(key)
                start = follow.offset if follow is not None else -1
                plan.append((path, key, start, st.st_size))
                if follow is not None:
                    backlog += max(0, st.st_size - follow.offset)
            plans[name] = plan
        if self._files and (backlog > self.window_bytes or s.n_runs > self.max_runs):
            s = self._start()
            for plan in plans.values():
                plan[:] = [(p, k, -1, size) for p, k, _, size in plan]
        read = 0
        live_keys: set[tuple[int, int]] = set()
        for name, plan in plans.items():
            # unknown files: the newest first, until the window is spent (the first look, and a
            # start over); a file created since the last look (a rotation's new file) is read whole
            first_look = not any(start >= 0 for _, _, start, _ in plan)
            budget = self.window_bytes
            starts: dict[tuple[int, int], _Follow] = {}
            for _, key, start, size in reversed(plan):
                if start >= 0:
                    continue
                if not first_look or name in ("labels", "promotions"):
                    starts[key] = _Follow(0, 1)
                    continue
                take = min(size, max(0, budget))
                budget -= take
                starts[key] = _Follow(size - take, 1 if take == size else None)
                if take < size:
                    self._skipped[name] = self._skipped.get(name, 0) + size - take
            for path, key, start, _ in plan:
                live_keys.add(key)
                follow = self._files.get(key) if start >= 0 else starts[key]
                assert follow is not None
                at = follow.offset
                if follow.line is None and at > 0 and start < 0:
                    at = _next_line(path, at)  # started inside a line: from the next whole one
                chunk = read_records(path, s.add, at, first_line=follow.line, partial="leave")
                read += chunk.end - at
                s.read_file(str(path), chunk.records)
                for problem in chunk.problems:
                    s.problem(problem)
                self._files[key] = _Follow(
                    chunk.end, None if follow.line is None else follow.line + chunk.lines
                )
        for key in list(self._files):
            if key not in live_keys:
                del self._files[key]  # rotated away and deleted (retention)
        champion = found.champion
        if champion is not None:
            st = self._stat(champion)
            sig = (st.st_mtime_ns, st.st_ino) if st is not None else None
            if sig != self._champion_sig:
                self._champion_sig = sig
                s.champion = read_champion(champion)
        self.last_read = read
        self.total_read += read
        return read

    # ------------------------------------------------------------------ the page

    def summary(self) -> Summary:
        """Read what is new and summarise (cached for ``ttl_s`` and while nothing is new)."""
        with self._lock:
            return self._current()[0]

    def _current(self) -> tuple[Summary, bool]:
        now = time.monotonic()
        if self._summary is not None and now - self._checked < self.ttl_s:
            return self._summary, False
        read = self._refresh()
        self._checked = now
        if self._summary is not None and read == 0:
            return self._summary, False
        assert self._summarizer is not None
        self._summary = self._summarizer.summary(
            title=self.title, source=str(self.log_dir), window=self._window()
        )
        return self._summary, True

    def page(self, *, plotly_src: str | None = None, refresh_s: int = 30) -> str:
        """The live page's HTML (drawn again only when something new was read)."""
        from stopserve.report.views import render

        with self._lock:
            summary, fresh = self._current()
            if fresh or self._page is None:
                self._page = render(summary, live=True, plotly_src=plotly_src, refresh_s=refresh_s)
            return self._page

    def _window(self) -> str | None:
        if not self._skipped:
            return None
        parts = ", ".join(f"{name}: {_mib(n)} older not read" for name, n in sorted(self._skipped.items()))
        return (
            f"This page follows the newest {_mib(self.window_bytes)} of each log ({parts}); "
            f"everything logged since is added as it comes. `stopserve report {self.log_dir} --html "
            "report.html` reads the logs whole."
        )


def _next_line(path: Path, offset: int) -> int:
    """The offset of the first line that starts after ``offset`` (or the file's end)."""
    with path.open("rb") as fh:
        fh.seek(max(0, offset - 1))
        while True:
            block = fh.read(1 << 16)
            if not block:
                return fh.tell()
            i = block.find(b"\n")
            if i >= 0:
                return fh.tell() - len(block) + i + 1
