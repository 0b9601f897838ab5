"""What the schedule-rule tests share: a few real trials of one marked task, and the check
that the model built from them answers what onnxruntime answers."""

from __future__ import annotations

import functools

import numpy as np
import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from edgetune.compiler.intrinsics import load_cpu_intrinsics
from edgetune.compiler.models import entry_function, reference_inputs, reference_outputs
from edgetune.compiler.prepare import apply_database_and_build, count_tuned_tasks
from edgetune.compiler.tir.rules import register_schedule_rules
from edgetune.inventory.schema import Model
from edgetune.tune.candidate_builder import make_builder
from edgetune.tune.tuner import quiet_meta_schedule_logger

TRIALS = 4


@functools.cache
def local_runner() -> ms.runner.LocalRunner:
    """The process's LocalRunner (one measurement at a time, once each): a LocalRunner starts its
    worker process, which imports TVM, when it is made, so the tests share one."""
    return ms.runner.LocalRunner(evaluator_config=ms.runner.EvaluatorConfig(number=1, repeat=1))


def brief_search() -> ms.search_strategy.EvolutionarySearch:
    return ms.search_strategy.EvolutionarySearch(population_size=16, init_measured_ratio=0.2, genetic_num_iters=1)


def tune_briefly(
    tasks: list[ms.ExtractedTask],
    target: tvm.target.Target,
    tmp_path,
    trials: int = TRIALS,
    database: ms.Database | None = None,
    search=None,
    seed: int = 0,
) -> ms.Database:
    """`database` (default: a new one in memory) with `trials` more measured trials of each of
    `tasks` on this host (random cost model, `search` or `brief_search`); the best record of
    each is a trace of the rule's schedule."""
    quiet_meta_schedule_logger()  # earlier tests of the session may have left handlers on it
    load_cpu_intrinsics(target)  # as the class process does: TuneContext would import all of TVM's (15-50 s)
    register_schedule_rules()  # as the tuner does before it makes tune contexts
    contexts, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(
        tasks, work_dir=str(tmp_path / "logs"), num_threads=1, seed=seed, strategy=search or brief_search()
    )
    database = database if database is not None else ms.database.MemoryDatabase()
    ms.tune.tune_tasks(
        tasks=contexts,
        task_weights=[1.0] * len(tasks),
        work_dir=str(tmp_path),
        max_trials_global=trials * len(tasks),
        max_trials_per_task=trials,
        num_trials_per_iter=trials,
        builder=make_builder(str(tmp_path), None, 1),
        runner=local_runner(),
        database=database,
        cost_model=ms.cost_model.RandomModel(),
    )
    for task in tasks:
        (record,) = database.get_top_k(database.commit_workload(task.dispatched[0]), 1)
        assert "sch.sample_perfect_tile(" in str(record.trace) and "sch.vectorize(" in str(record.trace)
    return database


def assert_answers_like_onnxruntime(
    model: Model, prepared: tvm.IRModule, database: ms.Database, target, tuned_tasks: int = 1
) -> None:
    """The prepared model built with `database` (`tuned_tasks` tuned) gives onnxruntime's output."""
    assert count_tuned_tasks(prepared, database, target).tuned == tuned_tasks
    inputs = reference_inputs(model)
    vm = relax.VirtualMachine(apply_database_and_build(prepared, database, target), tvm.cpu())
    got = vm[entry_function(prepared)](*[tvm.runtime.tensor(inputs[i.name]) for i in model.inputs]).numpy()
    expected = reference_outputs(model, inputs)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert float(np.abs(expected).max()) > 0.1
