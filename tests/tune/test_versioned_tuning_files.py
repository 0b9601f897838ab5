"""summary.json and runs.jsonl carry their schema_version, and a damaged one is named, not a traceback:
summary.json is a record decoded by the schema codec."""

from __future__ import annotations

import json

import pytest

from edgetune.compiler.tasks import KernelTask
from edgetune.errors import TuneError
from edgetune.tune.database import ClassDatabasePaths, TrialRecord, append_run, throughput
from edgetune.tune.report import RunInfo, TaskRow, read_summary, write_model_report

TASKS = (KernelTask("dense_a", "a", 1e6, 1.0, (("mlp", 1),)), KernelTask("dense_b", "b", 1e6, 2.0, (("mlp", 2),)))
TRIALS = [TrialRecord("a", 4e-3), TrialRecord("a", None), TrialRecord("b", 2e-3), TrialRecord("a", 3e-3)]


def written_summary(tmp_path, run_seconds: float = 12.5, firmware: dict | None = None):
    run = RunInfo(
        "gw",
        {"kind": "llvm"},
        str(tmp_path / "db"),
        None,
        4,
        run_seconds,
        None,
        firmware or {"b1": "fw 1"},
        {"a": "knee"},
    )
    return write_model_report(tmp_path / "report", "mlp", TASKS, TRIALS, run, {"a": 9e-3, "b": 5e-3})


def test_a_summary_as_written_reads_back_as_its_record(tmp_path):
    path = written_summary(tmp_path)
    raw = json.loads(path.read_text())
    assert (raw["schema"], raw["schema_version"]) == ("edgetune.tuning-summary", 1)
    summary = read_summary(path)
    assert (summary.device_class, summary.model, summary.trials, summary.tuning_time_s) == ("gw", "mlp", 4, 12.5)
    assert summary.tasks[0] == TaskRow("dense_a", "a", 1e6, 1, 3, 1, 3e-3, 1e6 / 3e-3 / 1e9, "knee")
    assert [(p.trials, round(p.latency_s * 1e3, 6)) for p in summary.curve_points()] == [(3, 8.0), (4, 7.0)]
    assert summary.early_points()[0].untuned == 2 and dict(summary.firmware) == {"b1": "fw 1"}
    assert summary.untuned_latency_s == raw["untuned_latency_s"] and summary.target == {"kind": "llvm"}


def test_a_second_run_adds_its_time_and_firmware_to_the_summary(tmp_path):
    written_summary(tmp_path)
    summary = read_summary(written_summary(tmp_path, 2.5, {"b2": "fw 2"}))
    assert summary.tuning_time_s == 15.0 and dict(summary.firmware) == {"b1": "fw 1", "b2": "fw 2"}


def test_a_summary_written_before_it_carried_its_schema_reads_as_version_1(tmp_path):
    path = written_summary(tmp_path)
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in raw.items() if k not in ("schema", "schema_version")}))
    assert read_summary(path).trials == 4


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda s: s.update(schema="something.else"), "schema: not an edgetune.tuning-summary file"),
        (lambda s: s.update(schema_version=2), "schema_version: 2 is not supported (this edgetune reads version 1)"),
        (lambda s: s.update(trials="16"), "trials: must be an integer, got str '16'"),
        (lambda s: s.update(trials=True), "trials: must be an integer, got boolean True"),
        (lambda s: s.update(tuning_time_s=None), "tuning_time_s: must be a number, got nothing"),
        (lambda s: s.update(firmware=[]), "firmware: must be a mapping, got a list"),
        (lambda s: s.update(trial=s.pop("trials")), "trial: unknown key (did you mean 'trials'?)"),
        (lambda s: s.pop("tasks_total"), "tasks_total: required field is missing"),
        (lambda s: s["tasks"][1].pop("workload_hash"), "tasks[1].workload_hash: required field is missing"),
        (lambda s: s["curve"].append([5]), "curve: point 2 has 1 numbers, not 2"),
    ],
)
def test_a_damaged_summary_is_named_with_its_field(tmp_path, change, expected):
    path = written_summary(tmp_path)
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))
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
