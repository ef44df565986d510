"""The service's side of learning from its own runs: follow the champion, retrain in the background.

* **Follow the champion.** When the model store (``STOPSERVE_MODEL_STORE``, default
  ``<log_dir>/models``) holds a champion, the service serves it; every tick it checks the
  champion pointer (one ``stat``) and reloads when a retrain promoted a model or a
  rollback restored one. Replicas that share the store (as they share the log
  directory) all follow it within a tick.
* **Retrain in the background.** With ``STOPSERVE_RETRAIN_EVERY=N`` every N-th finished run
  (counted by the run store: every replica's runs, on Redis) starts ``stopserve retrain``
  in a separate process at a lower priority: a decide call never waits on it (the
  GIL is not shared) and it takes no core from them that the machine needs first. A
  retrain already running (here, or in another replica: the store's lock) is not started
  twice. What it does is in the promotions log; its output in ``<store>/retrain.log``.
* **Shadow the refused candidate.** With exploration on, the candidate the last retrain
  refused (``<store>/candidate``) decides in the shadow as challenger ``candidate`` until
  a promotion removes it, and a stop it would not take is explored more often
  (``STOPSERVE_EXPLORE_DISAGREE``): the next retrain then has the runs to judge it.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

from stopserve.api import ChampionInfo
from stopserve.errors import ConfigError
from stopserve.model_store import Champion, ModelStore
from stopserve.service.metrics import Metrics
from stopserve.service.store import RunStore, StoreUnavailableError
from stopserve.settings import Settings

__all__ = ["LearningLoop"]

_log = logging.getLogger("stopserve.service")

#: Niceness of the background retrain: the service's decide calls get the CPU first.
RETRAIN_NICE = 10


#: The thread pools a retrain's libraries size from the environment (OpenMP, BLAS).
_THREAD_POOLS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _retrain_cores() -> set[int] | None:
    """The cores the background retrain may run on: all but one, which stays the service's.

    Even at idle priority, a retrain busy on every core lengthens decide's tail (measured on 2
    cores: an idle-class CPU burner on each core, 1.49x the quiet p99; on one core, 1.04x).
    None: a single core, or no affinity on this platform (then every core, as before).
    """
    if not hasattr(os, "sched_getaffinity"):
        return None
    mine = sorted(os.sched_getaffinity(0))
    return set(mine[1:]) if len(mine) > 1 else None


def _spawn_idle(cmd: list[str], out: IO[bytes]) -> subprocess.Popen[bytes]:
    """Start ``cmd`` at the background retrain's priority from its first instruction.

    A child inherits the scheduling of the thread that forks it, so the fork is made from a
    throwaway thread that first lowers its own priority (Linux: nice and policy are per
    thread; SCHED_IDLE runs only on CPU time nothing else wants) and leaves one core to the
    service (:func:`_retrain_cores`; thread pools sized to match): the interpreter's start-up
    and imports then never compete with a decide call, as the retrain's own ``--nice`` alone
    (applied once it has started) would let them.
    """
    env = dict(os.environ)
    cores = _retrain_cores()
    if cores is not None:
        for name in _THREAD_POOLS:
            env.setdefault(name, str(len(cores)))

    def spawn() -> subprocess.Popen[bytes]:
        try:
            if hasattr(os, "SCHED_IDLE"):
                os.setpriority(os.PRIO_PROCESS, 0, RETRAIN_NICE)  # 0: this thread, on Linux
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            if cores is not None:
                os.sched_setaffinity(0, cores)  # this thread too: the child inherits it
        except OSError as exc:  # not allowed here: the retrain's --nice still applies
            _log.debug("could not lower the retrain thread's priority: %s", exc)
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )

    # a pool of one thread, made and ended here: the lowered priority ends with it
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="stopserve-retrain-spawn") as pool:
        return pool.submit(spawn).result()


class LearningLoop:
    """One service process's champion pointer and background retrains."""

    def __init__(self, settings: Settings, metrics: Metrics, store: RunStore) -> None:
        self.settings = settings
        self.metrics = metrics
        self.store = store
        root = settings.resolved_model_store()
        self.models = ModelStore(root) if root is not None else None
        self.following = False
        self._seen: tuple[int, int] | None = None
        self._candidate_seen: tuple[int, int] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None
        self._lock = threading.Lock()

    def champion(self) -> Champion | None:
        """The store's champion now (and remember its pointer as seen); None without one."""
        if self.models is None:
            return None
        self._seen = self.models.signature()
        if self._seen is None:
            return None
        try:
            return self.models.champion()
        except ConfigError as exc:
            _log.error("model store: %s", exc)
            return None

    def changed(self) -> Champion | None:
        """The champion, when its pointer changed since it was last read; else None."""
        if self.models is None or self.models.signature() == self._seen:
            return None
        return self.champion()

    def candidate_changed(self) -> tuple[bool, Path | None]:
        """(changed since last asked, the store's kept candidate or None): with exploration on only.

        The last refused candidate decides in the shadow, so that exploration concentrates on
        the stops where it would go on (``STOPSERVE_EXPLORE_DISAGREE``): the runs the next
        retrain needs to judge a model like it.
        """
        if self.models is None or self.settings.explore <= 0:
            return False, None
        seen = self.models.candidate_signature()
        if seen == self._candidate_seen:
            return False, None
        self._candidate_seen = seen
        return True, None if seen is None else self.models.candidate_dir

    def info(self) -> ChampionInfo | None:
        """What ``GET /v1/model`` shows of the store's champion."""
        if self.models is None or self.models.signature() is None:
            return None
        try:
            champion = self.models.champion()
        except ConfigError:
            return None
        if champion is None:
            return None
        return ChampionInfo(
            store=str(self.models.root),
            version=champion.version,
            path=str(champion.path),
            promotions=max(0, len(champion.history) - 1),
            following=self.following,
        )

    # ------------------------------------------------------------------ background retrain

    def finished(self, served: Path | None) -> None:
        """One run finished: start a retrain when it is the N-th (``STOPSERVE_RETRAIN_EVERY``)."""
        every = self.settings.retrain_every
        if every is None or self.models is None:
            return
        try:
            n = self.store.count_outcome()
        except StoreUnavailableError as exc:
            _log.warning("cannot count finished runs for STOPSERVE_RETRAIN_EVERY: %s", exc)
            return
        if n % every == 0:
            self.start_retrain(served)

    def command(self, served: Path | None) -> list[str]:
        """The ``stopserve retrain`` command line the service runs."""
        s = self.settings
        assert self.models is not None
        cmd = [sys.executable, "-m", "stopserve", "retrain", "--model-store", str(self.models.root)]
        if s.log_dir is not None:
            cmd += ["--log-dir", str(s.log_dir)]
        if served is not None:
            cmd += ["--champion", str(served)]
        if s.lam is not None:
            cmd += ["--lambda", repr(s.lam)]
        elif s.cost_share is not None:
            cmd += ["--cost-share", repr(s.cost_share)]
        cmd += ["--nice", str(RETRAIN_NICE), "--no-progress", *shlex.split(s.retrain_args)]
        return cmd

    def start_retrain(self, served: Path | None) -> bool:
        """Start a background retrain unless one is running in this process; whether it started."""
        if self.models is None:
            return False
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                self.metrics.retrains.labels(result="busy").inc()
                return False
            self._reap()
            self.models.root.mkdir(parents=True, exist_ok=True)
            self._out = (self.models.root / "retrain.log").open("ab")
            cmd = self.command(served)
            try:
                self._proc = _spawn_idle(cmd, self._out)
            except OSError as exc:
                _log.error("could not start the background retrain %s: %s", cmd, exc)
                self.metrics.retrains.labels(result="failed").inc()
                return False
            self.metrics.retrains.labels(result="started").inc()
            _log.info("background retrain started (pid %d): %s", self._proc.pid, shlex.join(cmd))
            return True

    def running(self) -> bool:
        """A retrain this process started is still running."""
        with self._lock:
            return self._proc is not None and self._proc.poll() is None

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the retrain this process started (tests, shutdown); its exit code, None if none."""
        proc = self._proc
        return None if proc is None else proc.wait(timeout)

    def _reap(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    def close(self) -> None:
        """Leave a running retrain to finish on its own (its promotion is followed at the next start)."""
        with self._lock:
            self._reap()

    def state(self) -> dict[str, Any]:
        """A summary for logs and tests."""
        return {"following": self.following, "running": self.running()}
