"""edgetune.tvm_compat.record_lines: TVM's Python `as_json` refuses a record whose trace holds an
IndexMap; the JSON database's own lines carry it."""

from __future__ import annotations

import pytest
import tvm
from tvm import s_tir, te
from tvm.s_tir import meta_schedule as ms

from edgetune.tvm_compat.record_lines import RecordLineWriter, commit_lines

TARGET = tvm.target.Target({"kind": "llvm"})


def transposed_copy() -> tuple[tvm.IRModule, s_tir.Schedule]:
    """A kernel and a schedule of it whose trace holds an IndexMap (a `transform_layout`)."""
    a = te.placeholder((8, 16), name="a")
    func = te.create_prim_func([a, te.compute((8, 16), lambda i, j: a[i, j] + 1.0, name="b")])
    mod = tvm.IRModule({"main": func})
    schedule = s_tir.Schedule(mod)
    schedule.transform_layout(schedule.get_sblock("b"), ("write", 0), lambda i, j: (j, i))
    return mod, schedule


def record(database: ms.database.Database | RecordLineWriter) -> ms.database.TuningRecord:
    mod, schedule = transposed_copy()
    return ms.database.TuningRecord(
        schedule.trace, database.commit_workload(mod), [1e-5], TARGET, ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    )


@pytest.mark.xfail(strict=True, reason="TVM 0.27: TuningRecord.as_json refuses a trace holding an IndexMap")
def test_a_record_with_an_index_map_converts_to_json():
    record(ms.database.MemoryDatabase()).as_json()


def test_the_records_lines_carry_it_to_another_database(tmp_path):
    writer = RecordLineWriter(tmp_path / "sent")
    lines = writer.lines_of([record(writer)])
    assert len(lines) == 1 and writer.lines_of([]) == []  # each line is handed out once
    received = ms.database.MemoryDatabase()
    commit_lines(received, lines)
    (committed,) = received.get_all_tuning_records()
    assert "transform_layout" in str(committed.trace) and [float(s) for s in committed.run_secs] == [
        pytest.approx(1e-5)
    ]
