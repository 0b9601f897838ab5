"""One MetaSchedule JSON database per device class, repaired before use and counted for resume.

Layout under `<fleet.workdir>/databases/<class>/`:
- `database_workload.json`: one line per kernel (workload), `[structural hash, module]`;
- `database_tuning_record.json`: one line per measured trial, `[workload line, [trace,
  run_secs, target, args_info]]`; a failed trial (build error, timeout, dead board) is
  recorded too, with run_secs `[1e10]`, so it counts against the budget like any other;
- `cost_model.tar`: the class's XGBoost cost model, saved after every batch;
- `logs/`: MetaSchedule's per-task logs.

TVM appends each line with one write, so a crash (SIGKILL, power loss) can at worst leave the
last line torn; `repair_torn_tail` drops it before TVM reads the file (TVM would refuse it).
Nothing else is ever removed: the database only grows.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tvm.s_tir import meta_schedule as ms

from edgetune.errors import TuneError

FAILED_RUN_SECS = 1e9  # MetaSchedule records a failed trial as 1e10 s


@dataclass(frozen=True)
class ClassDatabasePaths:
    """Where one device class's tuning state lives."""

    directory: Path

    @classmethod
    def of(cls, workdir: Path, device_class: str) -> "ClassDatabasePaths":
        return cls(Path(workdir) / "databases" / device_class)

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
    def logs(self) -> Path:
        return self.directory / "logs"


@dataclass(frozen=True)
class TrialRecord:
    """One line of the tuning-record file, reduced to what reports and resume need."""

    workload_hash: str
    latency_s: float | None  # mean of the measured repeats; None for a failed trial


def repair_torn_tail(path: Path) -> int:
    """Drop a last line that a crash left incomplete; return the number of bytes dropped.

    A complete last line that only lacks its newline gets one (TVM would join the next
    record onto it)."""
    if not path.exists():
        return 0
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return 0
    start = data.rfind(b"\n") + 1
    if _parses(data[start:]):
        with path.open("ab") as file:
            file.write(b"\n")
        return 0
    with path.open("r+b") as file:
        file.truncate(start)
        file.flush()
        os.fsync(file.fileno())
    return len(data) - start


def open_database(paths: ClassDatabasePaths) -> ms.database.JSONDatabase:
    """The class database, created if missing, repaired if a crash tore its last line."""
    paths.directory.mkdir(parents=True, exist_ok=True)
    for path in (paths.workload, paths.tuning_record):
        repair_torn_tail(path)
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


def _json_lines(path: Path) -> list:
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")
    return [json.loads(line) for line in lines if line.strip() and _parses(line)]


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True
