"""Transfer tuning: seed a class's search with another class's best schedules.

For every task that has no trial yet in the borrowing class, the donor class's best traces
for the same kernel are replayed on the task, built for the borrower's target and re-measured
on the borrower's own boards; the results are committed to the borrower's database like any
other trial (they count against its budget). MetaSchedule's evolutionary search then starts
from them: it seeds its population with the best records of the database
(`init_measured_ratio`), so good donor schedules become the parents of the first round.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import tvm
from tvm.s_tir import meta_schedule as ms

from edgetune.tune.database import ClassDatabasePaths, open_database, snapshot

log = logging.getLogger(__name__)

FAILED_RUN_SECS = [1e10]


def snapshot_donor(donor: ClassDatabasePaths, into: Path) -> ms.database.JSONDatabase | None:
    """A read-only copy of the donor's database (its tuner may be appending right now)."""
    if not donor.tuning_record.exists():
        return None
    return open_database(snapshot(donor, into))


def seed_from_donor(
    donor: ms.database.JSONDatabase,
    database: ms.database.Database,
    tasks: list[ms.ExtractedTask],
    target: tvm.target.Target,
    builder: ms.builder.Builder,
    runner: ms.runner.Runner,
    per_task: int,
) -> int:
    """Re-measure up to `per_task` of the donor's best schedules of each task on the
    borrower's boards and commit them to `database`; return the number of trials spent."""
    spent = 0
    for task in tasks:
        mod = task.dispatched[0]
        if not donor.has_workload(mod):
            continue
        schedules = [_replay(mod, r.trace) for r in donor.get_top_k(donor.commit_workload(mod), per_task)]
        if schedules:
            workload = database.commit_workload(mod)
            for sch, run_secs in zip(schedules, _measure(schedules, target, builder, runner)):
                database.commit_tuning_record(
                    ms.database.TuningRecord(
                        trace=sch.trace,
                        workload=workload,
                        run_secs=run_secs,
                        target=target,
                        args_info=ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True),
                    )
                )
            spent += len(schedules)
    return spent


def _replay(mod: tvm.IRModule, trace: tvm.s_tir.schedule.Trace) -> tvm.s_tir.Schedule:
    sch = tvm.s_tir.Schedule(mod)
    trace.apply_to_schedule(sch, remove_postproc=False)
    return sch


def _measure(schedules, target, builder, runner) -> list[list[float]]:
    """Build the schedules on the host and run them on the class's boards; a schedule that
    fails to build or run gets FAILED_RUN_SECS (and its error is logged)."""
    built = builder.build([ms.builder.BuilderInput(sch.mod, target) for sch in schedules])
    inputs = [
        ms.runner.RunnerInput(
            result.artifact_path,
            device_type=_device_type(target),
            args_info=ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True),
        )
        for sch, result in zip(schedules, built)
        if result.error_msg is None
    ]
    futures = iter(runner.run(inputs))
    run_secs = []
    for result in built:
        measured = next(futures).result() if result.error_msg is None else None
        error = result.error_msg or measured.error_msg
        if error:
            log.warning("a borrowed schedule failed here: %s", error.strip().splitlines()[-1])
        run_secs.append(FAILED_RUN_SECS if error else [float(s) for s in measured.run_secs])
        if result.artifact_path:
            shutil.rmtree(Path(result.artifact_path).parent, ignore_errors=True)
    return run_secs


def _device_type(target: tvm.target.Target) -> str:
    """The device the runner opens on the board ("cpu" for llvm); TVM's runtime does not
    accept the target kind's name ("llvm") as a device any more."""
    return tvm.runtime.device(target.get_target_device_type()).type
