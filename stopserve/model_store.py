"""The model store: promoted models, the champion the service serves, and the promotions log.

``stopserve retrain`` writes here and ``stopserve serve`` reads here (``STOPSERVE_MODEL_STORE``,
default ``<log_dir>/models``)::

    champion.json       the champion: its version and directory, and the champions before it
    versions/<version>/ every promoted model (a model directory, checked by sha256 when loaded)
    candidate/          the last candidate refused, until a promotion (with exploration on, the
                        service runs it as a shadow challenger and explores where it would go on)
    candidate.json      what its refusal saw (the last logged run the last retrain that judged it read,
                        its first look's figures): the next retrain judges it again on the runs since
    sequential.json     the sequential gate's evidence about one challenger against the champion (its
                        held-out runs' ids and paired differences): reset by a promotion or a rollback
    promotions.jsonl    one line per retrain, promoted or refused, and per rollback, with the evidence
    retrain.lock        held by a running retrain: one at a time, across replicas sharing the store

The pointer is replaced atomically (write beside, rename), so a reader sees the old
champion or the new one, never half of either. Every service process that reads this
store follows the pointer (``stopserve.service.engine``): a promotion or a rollback is
served by every replica within a tick.

>>> store = ModelStore(tmp_path)             # doctest: +SKIP
>>> store.champion() is None                 # doctest: +SKIP
True
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from stopserve.errors import ConfigError

__all__ = ["Champion", "KeptCandidate", "ModelStore", "RetrainBusyError"]

CHAMPION_FILE: Final = "champion.json"
PROMOTIONS_FILE: Final = "promotions.jsonl"
CANDIDATE_DIR: Final = "candidate"
CANDIDATE_FILE: Final = "candidate.json"
SEQUENTIAL_FILE: Final = "sequential.json"


class RetrainBusyError(ConfigError):
    """Another retrain holds the store's lock."""


@dataclass(frozen=True)
class Champion:
    """The model the store says to serve, and the champions it replaced (oldest first)."""

    version: str | None
    path: Path
    history: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return {"version": self.version, "path": str(self.path), "history": self.history}


@dataclass(frozen=True)
class KeptCandidate:
    """The last refused candidate (``candidate/``) and what the retrain that refused it saw."""

    path: Path
    #: the trace id of the last logged run that retrain read: the runs logged after it are new to it
    #: (None: not known -- kept by an older retrain)
    seen_through: str | None
    #: that retrain's figures of it (``mean``, ``ci90`` of candidate − champion, ``enough``)
    first_look: dict[str, Any] = field(default_factory=dict)


class ModelStore:
    """One model store directory (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    @property
    def promotions(self) -> Path:
        """The promotions log."""
        return self.root / PROMOTIONS_FILE

    def signature(self) -> tuple[int, int] | None:
        """A cheap fingerprint of the champion pointer (changes when it is replaced); None: no champion."""
        try:
            st = (self.root / CHAMPION_FILE).stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_ino

    def champion(self) -> Champion | None:
        """The champion, or None when nothing was ever promoted here."""
        path = self.root / CHAMPION_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: not a readable champion pointer: {exc}") from None
        where = Path(data["path"])
        return Champion(
            version=data.get("version"),
            path=where if where.is_absolute() else self.root / where,
            history=list(data.get("history", [])),
        )

    def promote(
        self,
        model_dir: str | os.PathLike[str],
        *,
        version: str,
        previous: Mapping[str, Any] | None,
        evidence: Mapping[str, Any],
    ) -> Champion:
        """Copy ``model_dir`` in as ``versions/<version>`` and make it the champion; log the evidence.

        ``previous`` (``version``, ``path``) is the model served until now: it starts the
        history when nothing was promoted here before, so a rollback can return to it.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        dest = self.root / "versions" / version
        if not dest.exists():
            tmp = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=self.root))
            shutil.copytree(model_dir, tmp / "model")
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / "model", dest)
            tmp.rmdir()
        now = time.time()
        current = self.champion()
        history = current.history if current is not None else []
        if not history and previous is not None:
            history = [{"version": previous.get("version"), "path": str(previous["path"]), "at": None}]
        rel = str(dest.relative_to(self.root))
        entry: dict[str, Any] = {"version": version, "path": rel, "at": now}
        champion = Champion(version, dest, [*history, entry])
        self._write_pointer(champion, rel)
        # a candidate refused against the champion before is stale: it no longer decides in the shadow,
        # and the evidence gathered against the champion before is about another champion
        shutil.rmtree(self.candidate_dir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (self.root / CANDIDATE_FILE).unlink()
        self.clear_sequential()
        self.log({"kind": "promotion", "version": version, "path": str(dest), "evidence": dict(evidence)})
        return champion

    @property
    def candidate_dir(self) -> Path:
        """Where the last refused candidate is kept (until a promotion)."""
        return self.root / CANDIDATE_DIR

    def candidate_signature(self) -> tuple[int, int] | None:
        """A cheap fingerprint of the kept candidate (changes when it is replaced); None: none kept."""
        try:
            st = (self.candidate_dir / "manifest.json").stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_ino

    def keep_candidate(
        self,
        model_dir: str | os.PathLike[str],
        *,
        seen_through: str | None = None,
        first_look: Mapping[str, Any] | None = None,
    ) -> Path:
        """Keep a refused candidate as ``candidate/`` (the last one only, until a promotion).

        ``seen_through``: the trace id of the last logged run the refusing retrain read (the
        runs logged after it are new to the candidate); ``first_look``: that retrain's figures.
        """
        dest = self.candidate_dir
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".candidate.", dir=self.root))
        shutil.copytree(model_dir, tmp / "model")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp / "model", dest)
        tmp.rmdir()
        record = {"seen_through": seen_through, "first_look": dict(first_look or {}), "at": time.time()}
        self._write_json(CANDIDATE_FILE, record)
        return dest

    def candidate_seen_through(self, seen_through: str | None) -> None:
        """The kept candidate stays kept, and has now seen the runs through ``seen_through`` too."""
        kept = self.kept_candidate()
        if kept is None:
            raise ConfigError(f"{self.root}: no refused candidate is kept")
        record = {"seen_through": seen_through, "first_look": kept.first_look, "at": time.time()}
        self._write_json(CANDIDATE_FILE, record)

    def sequential(self) -> dict[str, Any] | None:
        """The sequential gate's evidence (``sequential.json``); None: none, or unreadable."""
        try:
            data = json.loads((self.root / SEQUENTIAL_FILE).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def save_sequential(self, record: Mapping[str, Any]) -> None:
        """Replace the sequential gate's evidence (atomically: a reader sees the old or the new)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_json(SEQUENTIAL_FILE, record)

    def clear_sequential(self) -> None:
        """Forget the sequential gate's evidence (the next retrain starts from nothing)."""
        with contextlib.suppress(FileNotFoundError):
            (self.root / SEQUENTIAL_FILE).unlink()

    def kept_candidate(self) -> KeptCandidate | None:
        """The refused candidate kept here and what its refusal saw; None when none is kept."""
        if not (self.candidate_dir / "manifest.json").exists():
            return None
        try:
            record = json.loads((self.root / CANDIDATE_FILE).read_text())
        except (OSError, ValueError):
            record = {}  # kept by an older retrain, or the file is damaged: its runs are not known
        if not isinstance(record, dict):
            record = {}
        seen = record.get("seen_through")
        first = record.get("first_look")
        return KeptCandidate(
            self.candidate_dir,
            seen if isinstance(seen, str) else None,
            first if isinstance(first, dict) else {},
        )

    def rollback(self) -> Champion:
        """Make the champion before the current one the champion again (logged)."""
        current = self.champion()
        if current is None or len(current.history) < 2:
            raise ConfigError(
                f"{self.root}: nothing to roll back to: "
                + ("no model was ever promoted here" if current is None else "the champion is the first one")
            )
        back = current.history[-2]
        where = Path(back["path"])
        champion = Champion(
            back.get("version"), where if where.is_absolute() else self.root / where, current.history[:-1]
        )
        self._write_pointer(champion, back["path"])
        self.clear_sequential()
        self.log(
            {
                "kind": "rollback",
                "from": {"version": current.version, "path": str(current.path)},
                "to": {"version": champion.version, "path": str(champion.path)},
            }
        )
        return champion

    def log(self, record: Mapping[str, Any]) -> None:
        """Append one record (with its time) to the promotions log."""
        self.root.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"ts": time.time(), **record}, allow_nan=False, default=str) + "\n"
        fd = os.open(self.promotions, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def history(self) -> list[dict[str, Any]]:
        """Every record of the promotions log, oldest first."""
        try:
            lines = self.promotions.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the retrain lock, or raise :class:`RetrainBusyError` when another retrain holds it."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / "retrain.lock", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RetrainBusyError(
                    f"{self.root}: another retrain is running (retrain.lock is held)"
                ) from None
            yield
        finally:
            os.close(fd)

    def _write_json(self, name: str, record: Mapping[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=self.root)
        with os.fdopen(fd, "w") as out:
            json.dump(record, out, allow_nan=False, default=str)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.root / name)

    def _write_pointer(self, champion: Champion, path_text: str) -> None:
        self._write_json(
            CHAMPION_FILE, {"version": champion.version, "path": path_text, "history": champion.history}
        )
