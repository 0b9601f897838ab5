"""The intent journal of a rollout: what a rollout of one model is about to do to which boards, and
what each board it touched was last read back running, so that a host killed at any point
(`kill -9`, a power loss) leaves a record the next `rollout` or `fleet status` can finish.

`<fleet.workdir>/state/rollout-<model>.json` (schema `edgetune.rollout-journal`, version 1),
decoded by the schema codec and replaced atomically and durably (`durable.write_atomic`) at
each step:
- before a stage's installs: its boards, each with the version it is to run (`planned`);
- before a board's install or rollback is started: the version it ran before the rollout (read
  from its agent just before, or kept from an interrupted rollout's journal) and `unknown`, and
  `deployed.json` says `unknown` for it too;
- as soon as the board's answer comes, or it is read back: what it runs (`known`), and
  `deployed.json` with it.

A rollout holds `.rollout-<model>.lock` (an flock, released by the kernel however the process
ends) from its start to its end; the journal is removed when the rollout has recorded its end. A
journal whose lock is free is therefore one of an interrupted rollout: `interrupted_journals`.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from edgetune.artifact_format.codec import FrozenMap, canonical_bytes, load_versioned, rule, to_json
from edgetune.durable import fsync_dir, write_atomic
from edgetune.errors import DeployError
from edgetune.fleet.state import UNKNOWN, record_deployed
from edgetune.inventory.schema import Fleet
from edgetune.inventory.workdir import Workdir

JOURNAL_SCHEMA = "edgetune.rollout-journal"
JOURNAL_SCHEMA_VERSION = 1
PREFIX = "rollout-"
PLANNED, CHANGING, KNOWN = "planned", UNKNOWN, "known"


def _version(value: int | None) -> str | None:
    return None if value is None or value >= 1 else f"must be a version (an integer from 1), got {value}"


@dataclass(frozen=True)
class JournalBoard:
    """One board of a rollout. `previous` is known once its state is past `planned`."""

    stage: str  # the stage it is in: "canary <class>", "batch <n>"
    target: int = rule(check=_version)  # the version the rollout installs on it
    state: str = rule(
        PLANNED, allowed=(PLANNED, CHANGING, KNOWN)
    )  # planned | unknown (a change started, not read back) | known
    previous: int | None = rule(None, check=_version)  # what it ran before the rollout (None: no release)
    runs: int | None = rule(None, check=_version)  # what it runs, when `known` (None: no release)

    @property
    def touched(self) -> bool:
        return self.state != PLANNED

    @property
    def switched(self) -> bool:
        """Read back running something else than before the rollout."""
        return self.state == KNOWN and self.runs != self.previous


@dataclass(frozen=True)
class JournalRecord:
    model: str
    pid: int  # the rollout's process on this host
    started: str  # UTC, ISO 8601
    boards: Mapping[str, JournalBoard] = field(default_factory=FrozenMap)


def journal_path(fleet: Fleet, model: str) -> Path:
    return Workdir(fleet.workdir).state_file(f"{PREFIX}{model}")


def journalled_models(fleet: Fleet) -> list[str]:
    """The models with a rollout journal: a rollout under way, or interrupted."""
    directory = journal_path(fleet, "x").parent
    return sorted(p.name[len(PREFIX) : -len(".json")] for p in directory.glob(f"{PREFIX}*.json"))


def read_journal(fleet: Fleet, model: str) -> JournalRecord | None:
    """The journal of `model`'s rollout (None: there is none); a damaged one is a DeployError."""
    path = journal_path(fleet, model)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise DeployError(f"{path}: cannot be read ({err.strerror})") from None
    try:
        return load_versioned(JournalRecord, data, str(path), JOURNAL_SCHEMA, JOURNAL_SCHEMA_VERSION, error=DeployError)
    except DeployError as err:
        raise DeployError(
            f"{err}; edgetune replaces it atomically, so it was damaged or edited: read back what the boards "
            f"run (`edgetune fleet status`), then remove it"
        ) from None


class RolloutUnderWay(DeployError):
    """Another process holds the journal of this model's rollout."""


class RolloutJournal:
    """The journal of one model's rollout, held (locked) by this process; see the module docstring.
    Safe to update from the rollout's board threads."""

    def __init__(self, fleet: Fleet, model: str, interrupted: JournalRecord | None):
        self.fleet, self.model, self.path = fleet, model, journal_path(fleet, model)
        self.interrupted = interrupted  # the journal an interrupted rollout left, if any
        self._boards: dict[str, JournalBoard] = dict(interrupted.boards) if interrupted else {}
        self._started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._lock = threading.Lock()

    @classmethod
    @contextmanager
    def held(cls, fleet: Fleet, model: str) -> Iterator[RolloutJournal]:
        """The journal of `model` for the block, locked against other rollouts of it; an
        interrupted rollout's journal is taken over (`interrupted`). RolloutUnderWay if another
        process holds it."""
        path = journal_path(fleet, model)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(f".{path.stem}.lock"), "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                record = _quietly(read_journal, fleet, model)
                by = f" (its journal last written by pid {record.pid})" if record else ""
                raise RolloutUnderWay(
                    f"a rollout of {model} is under way on this host{by}, or `fleet status` is reading "
                    f"its boards back: wait for it to end"
                ) from None
            yield cls(fleet, model, read_journal(fleet, model))

    @property
    def boards(self) -> dict[str, JournalBoard]:
        with self._lock:
            return dict(self._boards)

    def plan_stage(self, stage: str, targets: Mapping[str, int]) -> None:
        """Before a stage's installs: its boards and the version each is to run."""
        with self._lock:
            for name, version in targets.items():
                entry = self._boards.get(name)
                self._boards[name] = (
                    replace(entry, stage=stage, target=version)
                    if entry and entry.touched
                    else JournalBoard(stage, version)
                )
            self._write()

    def changing(self, board: str, running: int | None) -> int | None:
        """Before a change of `board` is started (it runs `running` now): it is `unknown`, here and
        in deployed.json, until read back. Returns the version it ran before the rollout (kept
        from an earlier change or an interrupted rollout's journal, else `running`)."""
        with self._lock:
            entry = self._boards[board]
            previous = entry.previous if entry.touched else running
            self._boards[board] = replace(entry, state=CHANGING, previous=previous, runs=None)
            self._write()
        record_deployed(self.fleet, board, self.model, UNKNOWN)
        return previous

    def read_back(self, board: str, runs: int | str | None) -> None:
        """`board` was read back (or answered) running `runs` (UNKNOWN: it could not be read):
        deployed.json first, then the journal."""
        record_deployed(self.fleet, board, self.model, runs)
        with self._lock:
            entry = self._boards[board]
            self._boards[board] = (
                replace(entry, state=CHANGING, runs=None) if runs == UNKNOWN else replace(entry, state=KNOWN, runs=runs)
            )
            self._write()

    def close(self) -> None:
        """The rollout recorded its end: the journal is removed."""
        self.path.unlink(missing_ok=True)
        fsync_dir(self.path.parent)

    def _write(self) -> None:
        record = JournalRecord(self.model, os.getpid(), self._started, FrozenMap(self._boards))
        data = {"schema": JOURNAL_SCHEMA, "schema_version": JOURNAL_SCHEMA_VERSION, **to_json(record)}
        write_atomic(self.path, canonical_bytes(data) + b"\n")


def _quietly(read, *args):
    try:
        return read(*args)
    except DeployError:
        return None
