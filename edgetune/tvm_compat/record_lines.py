"""Tuning records sent between processes as the lines a JSON database writes for them.

TVM 0.27: a `TuningRecord` pickled whole came back with a trace that crashed TVM when replayed,
and the Python `TuningRecord.as_json()` refuses a trace that holds an IndexMap (any
`transform_layout`, as RewriteLayout's pre-packing makes), while the C++ JSON database writes
both. No upstream issue found. `RecordLineWriter` has a JSON database of its own write the
records and hands out their lines; `commit_lines` commits such lines to another database.
Test: tests/tvm_compat/test_record_lines.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import tvm
from tvm.s_tir import meta_schedule as ms

# A record in transit: its workload's line and its own line, as a JSON database writes them.
RecordLines = tuple[str, str]


class RecordLineWriter:
    """A JSON database in `directory` (empty or new) whose records come out as `RecordLines`."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.workload_path = directory / "database_workload.json"
        self.record_path = directory / "database_tuning_record.json"
        self.database = ms.database.JSONDatabase(
            path_workload=str(self.workload_path), path_tuning_record=str(self.record_path), allow_missing=True
        )
        self.written = 0  # record lines already handed out

    def commit_workload(self, mod: tvm.IRModule) -> ms.database.Workload:
        return self.database.commit_workload(mod)

    def lines_of(self, records: Sequence[ms.database.TuningRecord]) -> list[RecordLines]:
        """Write `records` (of workloads committed here) and return their lines."""
        for record in records:
            self.database.commit_tuning_record(record)
        workloads = self.workload_path.read_text().splitlines()
        lines = self.record_path.read_text().splitlines()
        new = [(workloads[json.loads(line)[0]], line) for line in lines[self.written :]]
        self.written = len(lines)
        return new


def commit_lines(database: ms.database.Database, records: Sequence[RecordLines]) -> None:
    """Commit records in transit to `database`, each under the database's own workload."""
    for workload_line, record_line in records:
        workload = database.commit_workload(ms.database.Workload.from_json(json.loads(workload_line)).mod)
        database.commit_tuning_record(ms.database.TuningRecord.from_json(json.loads(record_line)[1], workload))
