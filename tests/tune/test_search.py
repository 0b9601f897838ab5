"""The class run's search strategy (edgetune.tune.search): a resumed run measures only schedules
the database does not hold yet (TVM's evolutionary search alone measured some of them again)."""

from __future__ import annotations

import pytest
import tvm
import tvm_ffi
from support.onnx_samples import write_separable_block
from support.rule_tuning import brief_search, tune_briefly
from tvm.s_tir import meta_schedule as ms

from edgetune.compiler.models import load_model
from edgetune.compiler.prepare import extract_tasks, prepare
from edgetune.inventory.schema import Model, ModelInput
from edgetune.tune.search import UnmeasuredSearch

AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 1})
TRIALS = 8

pytestmark = pytest.mark.tvm


def schedules(database: ms.database.Database, workload: tvm.IRModule) -> list[int]:
    """The scheduled kernel of each of the workload's records (its trace replayed on it), by
    structural hash."""
    token, kernels = database.commit_workload(workload), []
    for record in (r for r in database.get_all_tuning_records() if r.workload.same_as(token)):
        sch = tvm.s_tir.Schedule(record.workload.mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        kernels.append(tvm_ffi.structural_hash(sch.mod))
    return kernels


def class_database(directory) -> ms.database.JSONDatabase:
    """The task's database as a class run opens it: from its files."""
    return ms.database.JSONDatabase(
        str(directory / "workloads.json"), str(directory / "records.json"), allow_missing=True
    )


def test_a_resumed_run_measures_no_schedule_the_database_holds(tmp_path):
    model = Model(
        "separable",
        (ModelInput("image", (1, 3, 32, 32)),),
        onnx=write_separable_block(tmp_path / "separable.onnx"),
        layout="NHWC",
    )
    (task,) = [t for t in extract_tasks(prepare(load_model(model), AVX2), AVX2) if "conv2d1_multiply" in t.task_name]
    measured = []
    for run in range(3):  # TVM's search alone measured 6 to 8 of 24 schedules a second time here
        tune_briefly(
            [task], AVX2, tmp_path, TRIALS, class_database(tmp_path), UnmeasuredSearch(brief_search()), seed=run
        )
        measured.append(schedules(class_database(tmp_path), task.dispatched[0]))
    assert len(measured[0]) == TRIALS
    assert len(measured[1]) > len(measured[0])  # the second run found schedules it had not measured
    assert len(set(measured[-1])) == len(measured[-1])  # and no run measured one again
