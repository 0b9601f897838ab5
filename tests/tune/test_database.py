"""A crash can tear the last line of a tuning database file; it is repaired, never fatal."""

import json

import pytest

from edgetune.tune.database import ClassDatabasePaths, open_database, read_trials, repair_torn_tail

RECORD = json.dumps([0, [[[], []], [1e-5, 2e-5], {"kind": "llvm"}, []]])
FAILED = json.dumps([0, [[[], []], [1e10], {"kind": "llvm"}, []]])


def test_torn_last_line_is_dropped(tmp_path):
    path = tmp_path / "records.json"
    path.write_text(RECORD + "\n" + RECORD[: len(RECORD) // 2])
    assert repair_torn_tail(path) == len(RECORD) // 2
    assert path.read_text() == RECORD + "\n"
    assert repair_torn_tail(path) == 0


def test_complete_last_line_without_newline_gets_one(tmp_path):
    path = tmp_path / "records.json"
    path.write_text(RECORD)
    assert repair_torn_tail(path) == 0
    assert path.read_text() == RECORD + "\n"


def test_trials_are_counted_per_workload_failed_ones_included(tmp_path):
    paths = ClassDatabasePaths(tmp_path)
    paths.workload.write_text(json.dumps(["123", "x"]) + "\n")
    paths.tuning_record.write_text(RECORD + "\n" + FAILED + "\n" + RECORD[:10])
    trials = read_trials(paths)
    assert [t.workload_hash for t in trials] == ["123", "123"]
    assert trials[0].latency_s == pytest.approx(1.5e-5) and trials[1].latency_s is None


def test_empty_database_opens(tmp_path):
    database = open_database(ClassDatabasePaths(tmp_path / "db"))
    assert len(database) == 0
