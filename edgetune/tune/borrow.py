"""Seeding a class run: schedules from another database replayed on the class's tasks that have
no trial yet, measured on the class's own boards.

A source of traces gives each task the schedules it has for it (`TraceSource.seeds`): a donor
class (`tuning.borrow`, `DonorTraces`: its best traces of the same kernel) or the profile's
starter records (`starters.StarterTraces`: of the same kernel, or transferred from a kernel of
its kind at other shapes). The schedules are built for the class's target and measured on its
boards; the results are committed to the class's database like any other trial (they count
against their tasks' shares and the class budget), and they train the class's cost model.
MetaSchedule's evolutionary search then starts from them: it seeds its population with the best
records of the database (`init_measured_ratio`), so good seeds become the parents of the first
round, ranked by a cost model that has seen them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import tvm
from tvm.s_tir import meta_schedule as ms

from edgetune.tune.database import ClassDatabasePaths, open_database, snapshot
from edgetune.tune.runner import build_and_measure

log = logging.getLogger(__name__)

FAILED_RUN_SECS = [1e10]
EXACT = "exact"  # the source's own schedules of the task's kernel
TRANSFER = "transfer"  # schedules of a kernel of the same kind at other shapes, adapted to the task's

# TVM's decision provider: (instruction, its inputs, its attributes, its decision) -> the decision to use
DecisionProvider = Callable[[tvm.s_tir.schedule.Instruction, list, list, object], object]


@dataclass(frozen=True)
class Seeds:
    """The schedules a source has for one task, and how it found them (EXACT or TRANSFER)."""

    how: str
    schedules: list[tvm.s_tir.Schedule]


@dataclass(frozen=True)
class Seeded:
    """What seeding spent on one task."""

    trials: int
    how: str


class TraceSource(Protocol):
    def seeds(self, mod: tvm.IRModule, count: int) -> Seeds | None:
        """Up to `count` schedules of the kernel `mod`, best first; None when the source has none."""


class DonorTraces:
    """A donor class's database: its best traces of the task's own kernel."""

    def __init__(self, database: ms.database.Database) -> None:
        self.database = database

    def seeds(self, mod: tvm.IRModule, count: int) -> Seeds | None:
        if not self.database.has_workload(mod):
            return None
        records = self.database.get_top_k(self.database.commit_workload(mod), count)
        return Seeds(EXACT, [s for s in (replay(mod, r.trace) for r in records) if s is not None])


def snapshot_donor(donor: ClassDatabasePaths, into: Path) -> ms.database.JSONDatabase | None:
    """A read-only copy of the donor's database (its tuner may be appending right now)."""
    if not donor.tuning_record.exists():
        return None
    return open_database(snapshot(donor, into))


def replay(
    mod: tvm.IRModule,
    trace: tvm.s_tir.schedule.Trace,
    decisions: Callable[[tvm.s_tir.Schedule], DecisionProvider] | None = None,
) -> tvm.s_tir.Schedule | None:
    """`trace` applied to `mod`, postprocessing included; with `decisions`, each sampling decision
    passes through the provider it makes for the schedule being replayed. None (logged at debug
    level) when the trace does not apply."""
    sch = tvm.s_tir.Schedule(mod)
    try:
        trace.apply_to_schedule(sch, remove_postproc=False, decision_provider=decisions and decisions(sch))
    except Exception as err:  # noqa: BLE001 -- TVM raises its own errors for a trace that does not fit
        log.debug("a trace does not apply here: %s", (str(err).strip().splitlines() or ["?"])[-1])
        return None
    return sch


def seed_tasks(
    source: TraceSource,
    database: ms.database.Database,
    tasks: dict[str, ms.TuneContext],
    target: tvm.target.Target,
    builder: ms.builder.Builder,
    runner: ms.runner.Runner,
    per_task: int,
    cost_model: ms.cost_model.CostModel,
) -> dict[str, Seeded]:
    """Measure up to `per_task` of the source's schedules of each task (workload hash -> tuning
    context) on the class's boards, commit them to `database` and train `cost_model` on them;
    return what was spent per workload hash (tasks the source has nothing for are left out)."""
    spent = {}
    for workload_hash, context in tasks.items():
        found = source.seeds(context.mod, per_task)
        if found is None or not found.schedules:
            continue
        _measure_and_commit(found.schedules, context, database, target, builder, runner, cost_model)
        spent[workload_hash] = Seeded(len(found.schedules), found.how)
    return spent


def _measure_and_commit(schedules, context, database, target, builder, runner, cost_model) -> None:
    workload = database.commit_workload(context.mod)
    candidates = [
        ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)) for sch in schedules
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


def _measure(schedules, target, builder, runner) -> list[list[float]]:
    """Build the schedules on the host and run them on the class's boards; a schedule that
    fails to build or run gets FAILED_RUN_SECS (and its error is logged)."""
    run_secs = []
    for measured in build_and_measure([sch.mod for sch in schedules], target, builder, runner):
        if measured.error:
            log.warning("a seeded schedule failed here: %s", measured.error.strip().splitlines()[-1])
        run_secs.append(measured.run_secs or FAILED_RUN_SECS)
    return run_secs
