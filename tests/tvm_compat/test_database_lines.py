"""edgetune.tvm_compat.database_lines: TVM crashes loading a JSON database file with a blank line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edgetune.tvm_compat.database_lines import repair_lines

# A database TVM writes: one workload, two records; then loaded again (exit 139: SIGSEGV).
MAKE = """
import sys
import tvm
from tvm import s_tir, te
from tvm.s_tir import meta_schedule as ms

directory = sys.argv[1]
db = ms.database.JSONDatabase(path_workload=f"{directory}/database_workload.json",
                              path_tuning_record=f"{directory}/database_tuning_record.json", allow_missing=True)
a = te.placeholder((16,), name="a")
func = te.create_prim_func([a, te.compute((16,), lambda i: a[i] * 2.0, name="b")])
mod = tvm.IRModule({"main": func})
workload = db.commit_workload(mod)
schedule = s_tir.Schedule(mod)
schedule.get_sblock("b")  # TVM's queries skip a record whose trace is empty
for seconds in (1e-5, 2e-5):
    db.commit_tuning_record(ms.database.TuningRecord(schedule.trace, workload, [seconds],
                            tvm.target.Target({"kind": "llvm"}), ms.arg_info.ArgInfo.from_prim_func(func)))
"""
LOAD = """
import sys
from tvm.s_tir import meta_schedule as ms
directory = sys.argv[1]
db = ms.database.JSONDatabase(path_workload=f"{directory}/database_workload.json",
                              path_tuning_record=f"{directory}/database_tuning_record.json")
print(len(db))
"""


@pytest.fixture
def records_with_a_blank_line(tmp_path):
    subprocess.run([sys.executable, "-c", MAKE, str(tmp_path)], check=True, capture_output=True, timeout=120)
    path = tmp_path / "database_tuning_record.json"
    first, second = path.read_text().splitlines()
    path.write_text(f"{first}\n\n{second}\n")
    return path


def load(directory) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LOAD, str(directory)], capture_output=True, text=True, timeout=120)


@pytest.mark.xfail(strict=True, reason="TVM 0.27: JSONDatabase dies with SIGSEGV on a blank line")
def test_tvm_loads_a_record_file_with_a_blank_line(records_with_a_blank_line):
    loaded = load(records_with_a_blank_line.parent)
    assert (loaded.returncode, loaded.stdout.strip()) == (0, "2"), loaded.stderr[-800:]


def test_a_repaired_file_loads(records_with_a_blank_line):
    assert repair_lines(records_with_a_blank_line) == 1
    loaded = load(records_with_a_blank_line.parent)
    assert (loaded.returncode, loaded.stdout.strip()) == (0, "2"), loaded.stderr[-800:]
