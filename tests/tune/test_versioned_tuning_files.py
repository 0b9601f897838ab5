"""summary.json and runs.jsonl carry their schema_version, and a damaged one is named, not a traceback."""

from __future__ import annotations

import json

import pytest

from edgetune.errors import TuneError
from edgetune.tune.database import ClassDatabasePaths, append_run, throughput
from edgetune.tune.report import SUMMARY_SCHEMA, SUMMARY_VERSION, read_summary

GOOD_SUMMARY = {"schema": SUMMARY_SCHEMA, "schema_version": SUMMARY_VERSION, "trials": 16, "tuning_time_s": 12.5,
                "firmware": {}}


def test_a_summary_as_written_reads_back(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(GOOD_SUMMARY))
    assert read_summary(path)["trials"] == 16


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"schema": "something.else"}, "schema: not an edgetune.tuning-summary file"),
        ({"schema_version": 2}, "schema_version: 2 is not supported (this edgetune reads version 1)"),
        ({"trials": "16"}, "trials: must be int, got str '16'"),
        ({"trials": True}, "trials: must be int, got boolean True"),
        ({"tuning_time_s": None}, "tuning_time_s: must be int or float, got nothing"),
        ({"firmware": []}, "firmware: must be dict, got a list"),
    ],
)
def test_a_damaged_summary_is_named_with_its_field(tmp_path, change, expected):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({**GOOD_SUMMARY, **change}))
    with pytest.raises(TuneError) as err:
        read_summary(path)
    assert str(err.value).startswith(f"{path}: {expected}") and "remove it" in str(err.value)


def test_a_summary_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text('{"trials": 1')
    with pytest.raises(TuneError, match=r"summary.json: not valid JSON"):
        read_summary(path)


def test_runs_lines_carry_their_version_and_bad_lines_are_skipped(tmp_path):
    paths = ClassDatabasePaths(tmp_path)
    append_run(paths, trials=10, seconds=5.0, boards=2)
    assert json.loads(paths.runs.read_text())["schema_version"] == 1
    with open(paths.runs, "a") as log:
        log.write(json.dumps({"trials": 30, "seconds": 10.0, "boards": 1}) + "\n")  # before lines had a version
        log.write(json.dumps({"schema_version": 2, "trials": 1000, "seconds": 1.0, "boards": 9}) + "\n")
        log.write(json.dumps({"trials": "many", "seconds": 1.0, "boards": 9}) + "\n")
        log.write('{"trials": 7, "sec')  # torn by a crash
    measured = throughput(paths)
    assert (measured.trials, measured.seconds, measured.runs, measured.boards) == (40, 15.0, 2, 1)
