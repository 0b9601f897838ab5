"""One MetaSchedule JSON database per device class, repaired before use and counted for resume.

Layout under `<fleet.workdir>/databases/<class>/`:
- `database_workload.json`: one line per kernel (workload), `[structural hash, module]`;
- `database_tuning_record.json`: one line per measured trial, `[workload line, [trace,
  run_secs, target, args_info]]`; a failed trial (build error, timeout, dead board) is
  recorded too, with run_secs `[1e10]`, so it counts against the budget like any other;
- `cost_model.tar`: the class's XGBoost cost model, saved after every batch;
- `runs.jsonl`: one line per run that measured trials (schema_version, trials, seconds,
  boards), from which the plan tells how long the next run takes;
- `untuned.jsonl`: one line per kernel, its time without a schedule on the class's boards
  (schema_version, workload_hash, seconds; None where that measurement failed), from which the
  tuning curve starts (`untuned.py`), and by which a build keeps a kernel unscheduled where
  that is faster than its best record (`open_for_build`);
- `runtimes.jsonl`: one line per ONNX model timed under the runtimes of a board of the class at
  a class run's start (schema_version, model key, board, threads, each runtime's median time),
  what time to parity is measured against (`parity.py`);
- `clock.jsonl`: one line per recorded round (schema_version, trials in the record file once it
  was recorded, the class's tuning time then), from which a trial's minute of tuning is read;
- `logs/`: MetaSchedule's per-task logs.

A crash can leave the last line of a file torn, which TVM would refuse, and TVM crashes on a
blank line: `repair_lines` (edgetune.tvm_compat.database_lines) drops both before TVM reads a
file. Nothing else is ever removed: the database only grows.

One process at a time tunes or repairs a class database: it holds `exclusive(paths)`, an
flock on `<class dir>/.lock` (which holds its PID), so a repair never cuts a line that another
process is still writing. Readers do not lock: reports read complete lines only, and builds and
borrowing classes work on a `snapshot`, copied records first: records refer to workloads by
line number, and a workload line is always written before any record that refers to it.

A build applies the records `open_for_build` gives: the best of each kernel, except where the
kernel measured faster on the class's boards without any schedule (a small transpose or
element-wise kernel whose few trials all lost to the plain loop nest, say). There the build keeps
the kernel as the untuned build has it, so a tuned build is never slower kernel by kernel than
what was measured.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tvm.s_tir import meta_schedule as ms

from edgetune.artifact_format.codec import FrozenMap, SchemaError, decode, rule, to_json
from edgetune.compiler.prepare import kernel_hash
from edgetune.errors import TuneError
from edgetune.inventory.schema import Fleet
from edgetune.inventory.workdir import Workdir
from edgetune.tune.budget import Throughput
from edgetune.tvm_compat import vnni  # noqa: F401  (registers VNNI_DOT, which records may name)
from edgetune.tvm_compat.database_lines import parses_as_json, repair_lines

RUNS_VERSION = 1
UNTUNED_VERSION = 1
RUNTIMES_VERSION = 1
CLOCK_VERSION = 1
FAILED_RUN_SECS = 1e9  # MetaSchedule records a failed trial as 1e10 s
T = TypeVar("T")


@dataclass(frozen=True)
class ClassDatabasePaths:
    """Where one device class's tuning state lives."""

    directory: Path

    @classmethod
    def of(cls, workdir: Path, device_class: str) -> ClassDatabasePaths:
        return cls(Workdir(workdir).database(device_class))

    @property
    def workload(self) -> Path:
        return self.directory / "database_workload.json"

    @property
    def tuning_record(self) -> Path:
        return self.directory / "database_tuning_record.json"

    @property
    def cost_model(self) -> Path:
        return self.directory / "cost_model.tar"

    @property
    def runs(self) -> Path:
        return self.directory / "runs.jsonl"

    @property
    def untuned(self) -> Path:
        return self.directory / "untuned.jsonl"

    @property
    def runtimes(self) -> Path:
        return self.directory / "runtimes.jsonl"

    @property
    def clock(self) -> Path:
        return self.directory / "clock.jsonl"

    @property
    def logs(self) -> Path:
        return self.directory / "logs"

    @property
    def lock(self) -> Path:
        return self.directory / ".lock"


@dataclass(frozen=True)
class TrialRecord:
    """One line of the tuning-record file, reduced to what reports and resume need."""

    workload_hash: str
    latency_s: float | None  # mean of the measured repeats; None for a failed trial


@contextmanager
def exclusive(paths: ClassDatabasePaths) -> Iterator[None]:
    """Hold the class database for this process alone (tuning, repairing); a TuneError at once
    if another process holds it."""
    paths.directory.mkdir(parents=True, exist_ok=True)
    with open(paths.lock, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read(16).strip() or "unknown"
            raise TuneError(
                f"the tuning database {paths.directory} is in use by another edgetune process "
                f"(pid {holder}) that tunes or repairs it: wait for it to finish, or stop it, then re-run"
            ) from None
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def locked_database(paths: ClassDatabasePaths) -> Iterator[ms.database.JSONDatabase]:
    """The live class database, repaired and open, held by this process alone (`exclusive`)."""
    with exclusive(paths):
        yield open_database(paths)


def open_database(paths: ClassDatabasePaths) -> ms.database.JSONDatabase:
    """The class database, created if missing, repaired (`repair_lines`) before TVM reads it.
    A live class database is opened with `locked_database`; this is for private copies."""
    paths.directory.mkdir(parents=True, exist_ok=True)
    for path in (paths.workload, paths.tuning_record):
        repair_lines(path)
    try:
        return ms.database.JSONDatabase(
            path_workload=str(paths.workload),
            path_tuning_record=str(paths.tuning_record),
            allow_missing=True,
        )
    except Exception as err:  # TVM raises its own errors on malformed lines
        raise TuneError(
            f"tuning database {paths.directory} cannot be loaded ({err}); move it aside and "
            f"re-run `edgetune tune` to start that class over"
        ) from err


def snapshot(live: ClassDatabasePaths, into: Path) -> ClassDatabasePaths:
    """A repaired private copy of a class database that may be growing: the record file is
    copied before the workload file, so no copied record refers past the copied workloads."""
    copy = ClassDatabasePaths(into)
    into.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(live.tuning_record, copy.tuning_record)
    shutil.copyfile(live.workload, copy.workload)
    if live.untuned.exists():
        shutil.copyfile(live.untuned, copy.untuned)
    for path in (copy.tuning_record, copy.workload):
        repair_lines(path)
    return copy


@dataclass(frozen=True)
class BuildRecords:
    """What a build applies: `database` holds every kernel's records but those of `kept_untuned`
    (workload hashes), which measured faster without a schedule than with their best record."""

    database: ms.database.Database
    kept_untuned: frozenset[str]


def open_for_build(paths: ClassDatabasePaths) -> BuildRecords:
    """The records a build of a (snapshot) class database applies (`BuildRecords`)."""
    database = open_database(paths)
    kept = faster_untuned(paths)
    if not kept:
        return BuildRecords(database, kept)
    applied = ms.database.MemoryDatabase()
    for workload_hash, records in records_by_kernel(database).items():
        if workload_hash not in kept:
            applied.commit_workload(records[0].workload.mod)
            for record in records:
                applied.commit_tuning_record(record)
    return BuildRecords(applied, kept)


def records_by_kernel(database: ms.database.Database) -> dict[str, list[ms.database.TuningRecord]]:
    """Every record of an open database by its kernel's hash, failed ones included (TVM's
    `get_top_k` of a JSON database gives only the Pareto front of a kernel's records)."""
    by_hash: dict[str, list[ms.database.TuningRecord]] = {}
    hashes: dict[int, str] = {}  # a workload's hash, computed once per workload object
    for record in database.get_all_tuning_records():
        key = hashes.setdefault(record.workload.__chandle__(), kernel_hash(record.workload.mod))
        by_hash.setdefault(key, []).append(record)
    return by_hash


def faster_untuned(paths: ClassDatabasePaths) -> frozenset[str]:
    """The workload hashes whose recorded untuned time is shorter than their best trial's.
    Both were measured on the class's boards by the same runner; the best trial is the least of
    many noisy measurements, so noise favours the tuned kernel, not the untuned one."""
    best: dict[str, float] = {}
    for trial in read_trials(paths):
        if trial.latency_s is not None:
            best[trial.workload_hash] = min(trial.latency_s, best.get(trial.workload_hash, trial.latency_s))
    return frozenset(
        h for h, seconds in untuned_times(paths).items() if seconds is not None and h in best and seconds < best[h]
    )


def read_trials(paths: ClassDatabasePaths) -> list[TrialRecord]:
    """Every trial of the class in the order it was measured (read-only; skips a torn tail)."""
    hashes = [line[0] for line in _json_lines(paths.workload)]
    trials = []
    for workload_index, (_trace, run_secs, _target, _args) in _json_lines(paths.tuning_record):
        latency = sum(run_secs) / len(run_secs) if run_secs else None
        valid = latency is not None and latency < FAILED_RUN_SECS
        trials.append(TrialRecord(hashes[workload_index], latency if valid else None))
    return trials


def trials_per_workload(paths: ClassDatabasePaths) -> Counter[str]:
    """How many trials (failed ones included) each workload hash already has."""
    return Counter(trial.workload_hash for trial in read_trials(paths))


def recorded_trials(fleet: Fleet, device_class: str) -> Counter[str]:
    """Trials per workload hash in the class's database."""
    return trials_per_workload(ClassDatabasePaths.of(fleet.workdir, device_class))


@dataclass(frozen=True)
class RunLine:
    """One line of `runs.jsonl` (a line without `schema_version`, as written before lines
    carried it, reads as version 1)."""

    trials: int = rule(minimum=0)
    seconds: float = rule(minimum=0)
    boards: int = rule(minimum=0)
    schema_version: int = rule(RUNS_VERSION, allowed=(RUNS_VERSION,))


def append_run(paths: ClassDatabasePaths, trials: int, seconds: float, boards: int) -> None:
    """Log a run that measured trials (one write per line: a crash leaves at worst a torn
    last line, which `throughput` skips)."""
    line = json.dumps(
        {"schema_version": RUNS_VERSION, "trials": trials, "seconds": round(seconds, 3), "boards": boards}
    )
    with open(paths.runs, "a") as log:
        log.write(line + "\n")


def throughput(paths: ClassDatabasePaths) -> Throughput | None:
    """The trial rate of the class's logged runs; None before any run measured a trial. A
    line that is not a run of this version (torn by a crash, edited, written by a newer
    edgetune) is skipped: the rate is an estimate, and the next run logs a good line."""
    runs = [r for r in _lines(paths.runs, RunLine) if r.trials > 0 and r.seconds > 0]
    if not runs:
        return None
    return Throughput(sum(r.trials for r in runs), sum(r.seconds for r in runs), len(runs), runs[-1].boards)


@dataclass(frozen=True)
class UntunedLine:
    """One line of `untuned.jsonl`: a kernel's time without a schedule (None: its measurement
    failed, and it is not measured again)."""

    workload_hash: str
    seconds: float | None = rule(minimum=0)
    schema_version: int = rule(UNTUNED_VERSION, allowed=(UNTUNED_VERSION,))


def append_untuned(paths: ClassDatabasePaths, times: dict[str, float | None]) -> None:
    """Record kernels' untuned times, a line each (a torn last line is skipped when read)."""
    with open(paths.untuned, "a") as log:
        for workload_hash, seconds in times.items():
            log.write(
                json.dumps({"schema_version": UNTUNED_VERSION, "workload_hash": workload_hash, "seconds": seconds})
                + "\n"
            )


def untuned_times(paths: ClassDatabasePaths) -> dict[str, float | None]:
    """Each kernel's recorded untuned time by workload hash (the latest line of a kernel wins);
    a line that is not one of this version is skipped, as in `throughput`."""
    return {line.workload_hash: line.seconds for line in _lines(paths.untuned, UntunedLine)}


@dataclass(frozen=True)
class RuntimeTime:
    """One runtime's time for a model on a board: the median of its samples."""

    runtime: str  # what ran it: "<runtime> <version>, <n> threads"
    seconds: float = rule(positive=True)


@dataclass(frozen=True)
class RuntimesLine:
    """One line of `runtimes.jsonl`: an ONNX model timed under every runtime a board of the
    class has that answered like the reference (runtime name -> its time)."""

    model_key: str  # `parity.model_key`: the ONNX file's sha256 and the input shapes
    board: str
    threads: int = rule(minimum=0)  # the board's runtime threads the runtimes ran at
    times: Mapping[str, RuntimeTime] = rule(factory=FrozenMap)
    schema_version: int = rule(RUNTIMES_VERSION, allowed=(RUNTIMES_VERSION,))


def append_runtimes(paths: ClassDatabasePaths, line: RuntimesLine) -> None:
    """Record a model's runtime times."""
    _append(paths.runtimes, line)


def runtime_times(paths: ClassDatabasePaths) -> dict[tuple[str, int], RuntimesLine]:
    """The recorded runtime times by (model key, threads), the latest line of a key winning; a
    line that is not one of this version is skipped, as in `throughput`."""
    return {(line.model_key, line.threads): line for line in _lines(paths.runtimes, RuntimesLine)}


@dataclass(frozen=True)
class ClockLine:
    """One line of `clock.jsonl`: the class's tuning time when the record file had `trials`
    lines. `start`: the mark a run writes before its first round, once the untuned kernels and
    the runtimes are measured."""

    trials: int = rule(minimum=0)
    seconds: float = rule(minimum=0)
    start: bool = False
    schema_version: int = rule(CLOCK_VERSION, allowed=(CLOCK_VERSION,))


def append_clock(paths: ClassDatabasePaths, line: ClockLine) -> None:
    _append(paths.clock, line)


def _append(path: Path, record: object) -> None:
    """A record as one line, in one write (a torn last line is skipped when read: `_lines`)."""
    with open(path, "a") as log:
        log.write(json.dumps(to_json(record), sort_keys=True) + "\n")


def clock_lines(paths: ClassDatabasePaths) -> list[ClockLine]:
    """The clock's lines in the order they were written (lines of another version skipped)."""
    return _lines(paths.clock, ClockLine)


def _lines(path: Path, cls: type[T]) -> list[T]:
    if not path.exists():
        return []
    return [line for line in (_line(cls, raw) for raw in path.read_bytes().split(b"\n")) if line is not None]


def _line(cls: type[T], raw: bytes) -> T | None:
    try:
        return decode(cls, json.loads(raw))
    except (ValueError, SchemaError):
        return None


def _json_lines(path: Path) -> list:
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")
    return [json.loads(line) for line in lines if line.strip() and parses_as_json(line)]
