"""The search strategy of a class run: MetaSchedule's evolutionary search, less the candidates
the class database has measured already.

TVM 0.27's EvolutionarySearch remembers only the schedules it picked in the current run (its
`measured_workloads_` starts empty: "TODO: add records from the database to avoid
re-measuring"), and it starts each round from the database's best schedules, which the cost
model, trained on them, scores highest. A resumed run so measures again what earlier runs have
measured. Here a
candidate whose trace (instructions and decisions) a record of the task already holds is
dropped before it is built (edgetune.tvm_compat.search_strategy).
"""

from __future__ import annotations

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.search_strategy import PySearchStrategy

from edgetune.tvm_compat.search_strategy import initialize_with_tune_context

# Rounds the inner search may be asked for while each of its candidates was measured before
# (it picks others each time: it remembers what it gave); then the round is empty, which the
# scheduler takes for the end of the task's search space.
MAX_REPEATED_ROUNDS = 3


def schedule_key(trace: tvm.s_tir.Trace) -> str:
    """What identifies a schedule of a task: its trace, instructions and decisions, as text."""
    return str(trace)


@derived_object
class UnmeasuredSearch(PySearchStrategy):
    """`inner`'s candidates, less those whose schedule the tuning database holds for the task."""

    def __init__(self, inner: ms.search_strategy.SearchStrategy) -> None:
        super().__init__()
        self.inner = inner
        self.workload: tvm.IRModule | None = None
        self.database: ms.database.Database | None = None
        self.measured: set[str] | None = None  # read from the database at the first round

    def _initialize_with_tune_context(self, context: ms.TuneContext) -> None:
        """PySearchStrategy's hook (TVM 0.27 names it so): initialize the inner strategy too."""
        initialize_with_tune_context(self.inner, context)
        self.workload = context.mod

    def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None, cost_model=None) -> None:
        self.inner.pre_tuning(max_trials, num_trials_per_iter, design_spaces, database, cost_model)
        self.database, self.measured = database, None

    def post_tuning(self) -> None:
        self.inner.post_tuning()
        self.database, self.measured = None, None

    def generate_measure_candidates(self) -> list[ms.MeasureCandidate] | None:
        measured = self._measured()
        for _ in range(MAX_REPEATED_ROUNDS):
            candidates = self.inner.generate_measure_candidates()
            if candidates is None:
                return None
            fresh = [c for c in candidates if schedule_key(c.sch.trace) not in measured]
            if fresh or not candidates:
                return fresh
        return []

    def notify_runner_results(self, measure_candidates, results) -> None:
        self.inner.notify_runner_results(measure_candidates, results)
        self.measured.update(schedule_key(c.sch.trace) for c in measure_candidates)

    def clone(self) -> ms.search_strategy.SearchStrategy:
        return UnmeasuredSearch(self.inner.clone())

    def _measured(self) -> set[str]:
        """The schedules the database holds for the task (read once per run, at its first round)."""
        if self.measured is None:
            self.measured = set()
            if self.database is not None:
                workload = self.database.commit_workload(self.workload)
                self.measured = {
                    schedule_key(record.trace)
                    for record in self.database.get_all_tuning_records()
                    if record.workload.same_as(workload)
                }
        return self.measured
