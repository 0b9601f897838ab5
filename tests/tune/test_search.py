"""The class run's search strategy (edgetune.tune.search): a resumed run measures only schedules
the database does not hold yet (TVM's evolutionary search alone measured some of them again)."""

from __future__ import annotations

import tvm
import tvm_ffi
from onnx_samples import write_separable_block
from tvm.s_tir import meta_schedule as ms

from edgetune.compiler.intrinsics import load_cpu_intrinsics
from edgetune.compiler.models import load_model
from edgetune.compiler.prepare import extract_tasks, prepare
from edgetune.inventory.schema import Model, ModelInput
from edgetune.tune.candidate_builder import make_builder
from edgetune.tune.search import UnmeasuredSearch

AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 1})
TRIALS = 8


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
    return ms.database.JSONDatabase(str(directory / "workloads.json"), str(directory / "records.json"), allow_missing=True)


def tune_run(task: ms.ExtractedTask, database: ms.database.Database, seed: int, tmp_path) -> None:
    """One run of TRIALS trials of `task` on this host into `database`, as a class run searches."""
    search = UnmeasuredSearch(ms.search_strategy.EvolutionarySearch(population_size=16, init_measured_ratio=0.2,
                                                                     genetic_num_iters=1))  # fmt: skip
    contexts, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(
        [task], work_dir=str(tmp_path / "logs"), num_threads=1, seed=seed, strategy=search)
    ms.tune.tune_tasks(
        tasks=contexts, task_weights=[1.0], work_dir=str(tmp_path), max_trials_global=TRIALS,
        max_trials_per_task=TRIALS, num_trials_per_iter=TRIALS, builder=make_builder(str(tmp_path), None, 1),
        runner=ms.runner.LocalRunner(evaluator_config=ms.runner.EvaluatorConfig(number=1, repeat=1)),
        database=database, cost_model=ms.cost_model.RandomModel(),
    )  # fmt: skip


def test_a_resumed_run_measures_no_schedule_the_database_holds(tmp_path):
    model = Model("separable", (ModelInput("image", (1, 3, 32, 32)),),
                  onnx=write_separable_block(tmp_path / "separable.onnx"), layout="NHWC")  # fmt: skip
    (task,) = [t for t in extract_tasks(prepare(load_model(model), AVX2), AVX2) if "conv2d1_multiply" in t.task_name]
    load_cpu_intrinsics(AVX2)
    measured = []
    for run in range(3):  # TVM's search alone measured 6 to 8 of 24 schedules a second time here
        tune_run(task, class_database(tmp_path), seed=run, tmp_path=tmp_path)
        measured.append(schedules(class_database(tmp_path), task.dispatched[0]))
    assert len(measured[0]) == TRIALS
    assert len(measured[1]) > len(measured[0])  # the second run found schedules it had not measured
    assert len(set(measured[-1])) == len(measured[-1])  # and no run measured one again
