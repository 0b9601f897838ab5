"""Transfer tuning: seed a class's search with another class's best schedules.

For every task that has no trial yet in the borrowing class, the donor class's best traces
for the same kernel are replayed on the task, built for the borrower's target and re-measured
on the borrower's own boards; the results are committed to the borrower's database like any
other trial (they count against their tasks' shares and the class budget), and they train the
class's cost model. MetaSchedule's evolutionary search then starts from them: it seeds its
population with the best records of the database (`init_measured_ratio`), so good donor
schedules become the parents of the first round, ranked by a cost model that has seen them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import tvm
from tvm.s_tir import meta_schedule as ms

from edgetune.tune.database import ClassDatabasePaths, open_database, snapshot
from edgetune.tune.runner import build_and_measure

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
    tasks: dict[str, ms.TuneContext],
    target: tvm.target.Target,
    builder: ms.builder.Builder,
    runner: ms.runner.Runner,
    per_task: int,
    cost_model: ms.cost_model.CostModel,
) -> dict[str, int]:
    """Re-measure up to `per_task` of the donor's best schedules of each task (workload hash ->
    tuning context) on the borrower's boards, commit them to `database` and train `cost_model`
    on them; return the trials spent per workload hash."""
    spent = {}
    for workload_hash, context in tasks.items():
        mod = context.mod
        if not donor.has_workload(mod):
            continue
        schedules = [_replay(mod, r.trace) for r in donor.get_top_k(donor.commit_workload(mod), per_task)]
        if not schedules:
            continue
        workload = database.commit_workload(mod)
        candidates = [
            ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True))
            for sch in schedules
        ]
        run_secs = _measure(schedules, target, builder, runner)
        for candidate, secs in zip(candidates, run_secs):
            database.commit_tuning_record(
                ms.database.TuningRecord(
                    trace=candidate.sch.trace,
                    workload=workload,
                    run_secs=secs,
                    target=target,
                    args_info=candidate.args_info,
                )
            )
        cost_model.update(context, candidates, [ms.runner.RunnerResult(secs, None) for secs in run_secs])
        spent[workload_hash] = len(schedules)
    return spent


def _replay(mod: tvm.IRModule, trace: tvm.s_tir.schedule.Trace) -> tvm.s_tir.Schedule:
    sch = tvm.s_tir.Schedule(mod)
    trace.apply_to_schedule(sch, remove_postproc=False)
    return sch


def _measure(schedules, target, builder, runner) -> list[list[float]]:
    """Build the schedules on the host and run them on the class's boards; a schedule that
    fails to build or run gets FAILED_RUN_SECS (and its error is logged)."""
    run_secs = []
    for measured in build_and_measure([sch.mod for sch in schedules], target, builder, runner):
        if measured.error:
            log.warning("a borrowed schedule failed here: %s", measured.error.strip().splitlines()[-1])
        run_secs.append(measured.run_secs or FAILED_RUN_SECS)
    return run_secs
