"""A class run's search split into shards, each searching its own tasks (on the Ray cluster of
`compute.ray.shards_per_class`, edgetune.tune.on_ray.shards), merged back into the class run.

The class run (the head) keeps the class database: it alone writes it, so it stays the one
resumable source of truth. Before the search it splits its searched tasks into shards of about
equal weight, each with its share of the run's budget (`split_state`). A shard searches its
tasks with its own tune contexts, a copy of the class's cost model and an in-memory database
seeded with the class's records of its tasks; `RecordStream` sends every measured record to the
head as the round is measured, and the head commits it to the class database at once
(`tvm_compat.record_lines.commit_lines`), so a shard that is lost keeps every trial it measured. When every shard has ended, the
head retrains the class's cost model on the merged records of every searched task
(`retrain_cost_model`) and adds up the shards' accounts (`merge_states`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback
from tvm.s_tir.meta_schedule.runner import RunnerResult

from edgetune.compiler.prepare import kernel_hash
from edgetune.tune import database as database_files
from edgetune.tune.budget import UNBOUNDED_TRIALS, TaskLedger
from edgetune.tune.monitor import RunState
from edgetune.tvm_compat.record_lines import RecordLines, RecordLineWriter

FAILED_RECORD_SECS = 1e10  # how MetaSchedule's AddToDatabase records a candidate that failed
SHARD_LOST = (
    "a shard of the search was lost with its node or process; every trial it measured is in the class "
    "database: re-run `edgetune tune` to resume"
)


@dataclass(frozen=True)
class ShardOutcome:
    """What a shard's search ended with: its account (the ledgers of its tasks, as the run
    changed them) and why it stopped (None: it spent its share)."""

    ledgers: tuple[TaskLedger, ...]
    stopped: str | None
    node: str = ""  # where it searched


@dataclass(frozen=True)
class ShardPlacement:
    """Where a shard searched, its tasks, and the trials it measured (None: it was lost)."""

    node: str | None
    tasks: int
    trials: int | None


def placement(state: RunState, outcome: ShardOutcome | None) -> ShardPlacement:
    if outcome is None:
        return ShardPlacement(None, len(state.ledgers), None)
    return ShardPlacement(outcome.node, len(outcome.ledgers), sum(ledger.spent for ledger in outcome.ledgers))


def split_state(state: RunState, shards: int) -> list[RunState]:
    """The run's searched tasks dealt into `shards` states of about equal weight (heaviest
    first, each to the lightest shard so far), each with the run budget in proportion to its
    tasks' shares (a time budget stays unbounded: the time limit ends every shard)."""
    order = sorted(range(len(state.ledgers)), key=lambda i: -state.ledgers[i].weight)
    groups: list[list[int]] = [[] for _ in range(min(shards, len(order)))]
    for index in order:
        min(groups, key=lambda g: sum(state.ledgers[i].weight for i in g)).append(index)
    shares = [sum(state.ledgers[i].share for i in group) or 1 for group in groups]
    budgets = _proportional(state.run_budget, shares)
    return [
        replace(
            state,
            device_class=f"{state.device_class} shard {n + 1}/{len(groups)}",
            ledgers=[state.ledgers[i] for i in group],
            names=[state.names[i] for i in group],
            run_budget=UNBOUNDED_TRIALS if state.time_is_the_budget else budget,
            best={},
            round_started_at={},
        )
        for n, (group, budget) in enumerate(zip(groups, budgets))
    ]


def _proportional(total: int, shares: list[int]) -> list[int]:
    """`total` split in proportion to `shares`, the rounding left to the largest."""
    parts = [total * share // sum(shares) for share in shares]
    parts[shares.index(max(shares))] += total - sum(parts)
    return parts


def merge_states(state: RunState, outcomes: Sequence[ShardOutcome | None]) -> list[str]:
    """Put each shard's ledgers back into the run's state; the reasons shards stopped early
    (SHARD_LOST for a shard that did not come back: None). A lost shard's trials are in the
    database, not in its ledgers: the run counts them when it resumes."""
    by_hash = {
        ledger.workload_hash: ledger for outcome in outcomes if outcome is not None for ledger in outcome.ledgers
    }
    state.ledgers = [by_hash.get(ledger.workload_hash, ledger) for ledger in state.ledgers]
    return [
        SHARD_LOST if outcome is None else outcome.stopped for outcome in outcomes if outcome is None or outcome.stopped
    ]


def seeded_database(
    class_database: ms.database.Database, contexts: Sequence[ms.TuneContext]
) -> ms.database.MemoryDatabase:
    """An in-memory database with the class's records of the shard's tasks (the evolutionary
    search starts from a task's best measured schedules)."""
    seeded = ms.database.MemoryDatabase()
    records = database_files.records_by_kernel(class_database)
    for context in contexts:
        workload = seeded.commit_workload(context.mod)
        for record in records.get(kernel_hash(context.mod), []):
            seeded.commit_tuning_record(_rebound(record, workload))
    return seeded


def _rebound(record: ms.database.TuningRecord, workload: ms.database.Workload) -> ms.database.TuningRecord:
    """The record attached to `workload` (databases find a workload's records by identity)."""
    return ms.database.TuningRecord(record.trace, workload, record.run_secs, record.target, record.args_info)


@derived_object
class RecordStream(PyMeasureCallback):
    """After every round of a shard: its records, as MetaSchedule's AddToDatabase makes them (a
    failed candidate with run_secs [1e10]), as the lines a JSON database of the shard's own in
    `directory` writes (edgetune.tvm_compat.record_lines), passed to `send`, which takes them to the head."""

    def __init__(self, send: Callable[[list[RecordLines]], None], directory: Path) -> None:
        super().__init__()
        self.send = send
        self.writer = RecordLineWriter(directory)

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        context = task_scheduler.tasks_[task_id].ctx
        workload = self.writer.commit_workload(context.mod)
        self.send(
            self.writer.lines_of(
                [
                    ms.database.TuningRecord(
                        candidate.sch.trace, workload, _run_secs(built, ran), context.target, candidate.args_info
                    )
                    for candidate, built, ran in zip(measure_candidates, builder_results, runner_results)
                ]
            )
        )


def _run_secs(built: ms.builder.BuilderResult, ran: RunnerResult) -> list[float]:
    if built.error_msg is not None or ran.error_msg is not None or not ran.run_secs:
        return [FAILED_RECORD_SECS]
    return [float(s) for s in ran.run_secs]


def retrain_cost_model(
    cost_model: ms.cost_model.XGBModel, contexts: Sequence[ms.TuneContext], database: ms.database.Database
) -> int:
    """Train `cost_model` on the class database's valid records of every context's task (the
    shards trained copies of it on their own tasks only); returns the records it trained on."""
    trained = 0
    records = database_files.records_by_kernel(database)
    for context in contexts:
        valid = [
            r
            for r in records.get(kernel_hash(context.mod), [])
            if float(r.run_secs[0]) < database_files.FAILED_RUN_SECS
        ]
        if valid:
            cost_model.update(
                context,
                [r.as_measure_candidate() for r in valid],
                [RunnerResult(run_secs=r.run_secs, error_msg=None) for r in valid],
            )
            trained += len(valid)
    return trained


def shard_hashes(state: RunState) -> list[str]:
    return [ledger.workload_hash for ledger in state.ledgers]
