"""The class database: crashes and stray blank lines are repaired (TVM 0.27 segfaults on a blank
record line), one process at a time tunes or repairs it, snapshots are consistent."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tvm

from edgetune.compiler.prepare import kernel_hash
from edgetune.errors import TuneError
from edgetune.tune.database import (
    ClassDatabasePaths,
    append_untuned,
    exclusive,
    faster_untuned,
    locked_database,
    open_database,
    open_for_build,
    read_trials,
    repair_lines,
    snapshot,
    untuned_times,
)

RECORD = json.dumps([0, [[[], []], [1e-5, 2e-5], {"kind": "llvm"}, []]])
FAILED = json.dumps([0, [[[], []], [1e10], {"kind": "llvm"}, []]])
TARGET = tvm.target.Target({"kind": "llvm"})

MAKE_DATABASE = """
import sys
import tvm
from tvm import s_tir, te
from tvm.s_tir import meta_schedule as ms

directory = sys.argv[1]
db = ms.database.JSONDatabase(path_workload=f"{directory}/database_workload.json",
                              path_tuning_record=f"{directory}/database_tuning_record.json", allow_missing=True)
for k in (1.0, 2.0):
    a = te.placeholder((16,), name="a")
    func = te.create_prim_func([a, te.compute((16,), lambda i: a[i] * k, name="b")])
    mod = tvm.IRModule({"main": func})
    workload = db.commit_workload(mod)
    schedule = s_tir.Schedule(mod)
    schedule.get_sblock("b")  # TVM's queries skip a record whose trace is empty
    for seconds in (1e-5, 2e-5):
        db.commit_tuning_record(ms.database.TuningRecord(
            schedule.trace, workload, [seconds], tvm.target.Target({"kind": "llvm"}),
            ms.arg_info.ArgInfo.from_prim_func(func)))
"""

LOAD_DATABASE = """
import sys
from pathlib import Path
from edgetune.tune.database import ClassDatabasePaths, open_database
print(len(open_database(ClassDatabasePaths(Path(sys.argv[1])))))
"""


@pytest.fixture(scope="module")
def real_database(tmp_path_factory) -> ClassDatabasePaths:
    """A database TVM wrote: 2 workloads, 2 records each (copy it before changing it)."""
    directory = tmp_path_factory.mktemp("real-db")
    subprocess.run([sys.executable, "-c", MAKE_DATABASE, str(directory)], check=True, capture_output=True)
    return ClassDatabasePaths(directory)


def _copy(paths: ClassDatabasePaths, into: Path) -> ClassDatabasePaths:
    into.mkdir()
    copy = ClassDatabasePaths(into)
    copy.workload.write_bytes(paths.workload.read_bytes())
    copy.tuning_record.write_bytes(paths.tuning_record.read_bytes())
    return copy


def test_torn_last_line_is_dropped(tmp_path):
    path = tmp_path / "records.json"
    path.write_text(RECORD + "\n" + RECORD[: len(RECORD) // 2])
    assert repair_lines(path) == len(RECORD) // 2
    assert path.read_text() == RECORD + "\n"
    assert repair_lines(path) == 0


def test_complete_last_line_without_newline_gets_one(tmp_path):
    path = tmp_path / "records.json"
    path.write_text(RECORD)
    assert repair_lines(path) == 0
    assert path.read_text() == RECORD + "\n"


def test_blank_lines_anywhere_are_dropped_with_a_torn_tail(tmp_path):
    path = tmp_path / "records.json"
    path.write_text("\n" + RECORD + "\n  \n" + FAILED + "\n\n" + RECORD[:7])
    assert repair_lines(path) == 1 + 3 + 1 + 7
    assert path.read_text() == RECORD + "\n" + FAILED + "\n"


def test_blank_lines_no_longer_crash_tvm(real_database, tmp_path):
    """TVM 0.27 dies with SIGSEGV (exit 139) loading a record file with a blank line."""
    paths = _copy(real_database, tmp_path / "db")
    lines = paths.tuning_record.read_text().splitlines()
    paths.tuning_record.write_text("\n".join([lines[0], "", *lines[1:3], " ", lines[3]]) + "\n\n")
    paths.workload.write_text(paths.workload.read_text().replace("\n", "\n\n", 1))
    loaded = subprocess.run([sys.executable, "-c", LOAD_DATABASE, str(paths.directory)], capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == "4"
    assert [t.latency_s for t in read_trials(paths)] == pytest.approx([1e-5, 2e-5, 1e-5, 2e-5])


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


def test_one_process_at_a_time_tunes_or_repairs_a_class(real_database, tmp_path):
    paths = _copy(real_database, tmp_path / "db")
    with locked_database(paths) as database:
        assert len(database) == 4
        with pytest.raises(
            TuneError, match=rf"{paths.directory} is in use by another edgetune process \(pid {os.getpid()}\)"
        ):
            with exclusive(paths):
                pass
    with exclusive(paths):  # released
        pass


APPEND_LIKE_A_TUNER = """
import json, sys
from pathlib import Path
directory = Path(sys.argv[1])
for workload in range(3000):  # at most 12 MB
    with open(directory / "database_workload.json", "a") as f:
        f.write(json.dumps([str(workload), "w" * 4000]) + "\\n")
    with open(directory / "database_tuning_record.json", "a") as f:
        f.write(json.dumps([workload, [[[], []], [1e-5], {"kind": "llvm"}, []]]) + "\\n")
"""


def test_snapshot_of_a_growing_database_never_points_past_its_workloads(tmp_path):
    """A tuner appends a workload line, then records that refer to it by line number, while a
    build takes snapshots: no snapshot may hold a record whose workload it lacks. (With the
    workload file copied first, most runs of this test saw such a snapshot.)"""
    live = ClassDatabasePaths(tmp_path / "live")
    live.directory.mkdir()
    live.workload.write_text("")
    live.tuning_record.write_text("")
    tuner = subprocess.Popen([sys.executable, "-c", APPEND_LIKE_A_TUNER, str(live.directory)])
    taken = 0
    try:
        while tuner.poll() is None:
            copy = snapshot(live, tmp_path / "snapshot")
            workloads = len(copy.workload.read_text().splitlines())
            referenced = [json.loads(line)[0] for line in copy.tuning_record.read_text().splitlines()]
            assert all(index < workloads for index in referenced), f"snapshot {taken}"
            shutil.rmtree(copy.directory)
            taken += 1
    finally:
        tuner.kill()
        tuner.wait()
    assert taken > 1


def test_untuned_times_are_read_back_the_latest_per_kernel_and_a_bad_line_is_skipped(tmp_path):
    paths = ClassDatabasePaths(tmp_path)
    append_untuned(paths, {"a": 2.5e-3, "b": None})
    append_untuned(paths, {"b": 4e-3})  # measured again after a failure: the latest line wins
    with paths.untuned.open("a") as file:
        file.write('{"schema_version": 2, "workload_hash": "c", "seconds": 1.0}\n')  # a newer edgetune's
        file.write('{"schema_version": 1, "workload_hash": "d", "seconds": -1}\n')  # not a time
        file.write('{"schema_version": 1, "workload_hash": "e", "sec')  # torn by a crash
    assert untuned_times(paths) == {"a": 2.5e-3, "b": 4e-3}


def test_a_build_keeps_unscheduled_the_kernels_measured_faster_so(real_database, tmp_path):
    """The real database's two kernels have best records of 10 us. One measured 5 us untuned:
    a build leaves its records out; the other's untuned 30 us does not (nor does a failed
    untuned measurement, or a time for a kernel with no record). A snapshot carries the times."""
    live = _copy(real_database, tmp_path / "live")
    hashes = [json.loads(line)[0] for line in live.workload.read_text().splitlines()]
    append_untuned(live, {hashes[0]: 5e-6, hashes[1]: 3e-5, "no-record": 1e-9})
    copy = snapshot(live, tmp_path / "snapshot")
    assert untuned_times(copy) == untuned_times(live)
    records = open_for_build(copy)
    assert records.kept_untuned == {hashes[0]} == faster_untuned(copy)
    workloads = {kernel_hash(r.workload.mod): r.workload.mod for r in open_database(copy).get_all_tuning_records()}
    assert records.database.query_tuning_record(workloads[hashes[0]], TARGET, "main") is None
    assert records.database.query_tuning_record(workloads[hashes[1]], TARGET, "main").run_secs[
        0
    ].value == pytest.approx(1e-5)
    append_untuned(copy, {hashes[0]: None})  # measured again and failed: the latest line wins
    assert faster_untuned(copy) == frozenset()
    assert open_for_build(copy).kept_untuned == frozenset()
