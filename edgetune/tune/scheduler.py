"""The class's task scheduler: MetaSchedule's own tuning loop, with edgetune's budget rule
deciding which task measures the next round (`budget.choose_task`).

A PyTaskScheduler only chooses `next_task_id`; TVM's loop builds, measures, records and calls
the measure callbacks. Before each choice it collects every finished round but the one just
started (so decisions see fresh results while the host builds the next round as the boards
measure the last), stops tasks at their knee, and ends the run by returning -1 when the next
round would end past the time limit (so a run ends within a round of it), no board is left,
or no trial is left to give. The rounds `choose_task` deals by expected gain go first to the
kernels of models still slower than their faster runtime (`ParityBars`, told again before every
choice from the rounds recorded so far). TVM then collects the rounds
still measuring and records them: the run ends with a consistent database and no task is
terminated behind TVM's back (which aborted runs with `Check failed: (!task->is_terminated)`).
"""

from __future__ import annotations

import logging

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.task_scheduler import PyTaskScheduler

from edgetune.tune.budget import ParityBars, choose_task, stop_at_knee
from edgetune.tune.monitor import RunState
from edgetune.tune.stop import stop_requested

log = logging.getLogger(__name__)


@derived_object
class BudgetScheduler(PyTaskScheduler):
    def __init__(self, state: RunState, parity: ParityBars | None = None) -> None:
        super().__init__()
        self.state = state
        self.parity = parity or ParityBars()
        self.latest: int | None = None  # the task whose round was started last

    def next_task_id(self) -> int:
        self._collect(keep=self.latest)
        task_id = self._choose()
        if task_id is not None and task_id == self.latest and self._tasks()[task_id].runner_futures is not None:
            self._collect(keep=None)  # its round still measuring decides whether it goes on
            task_id = self._choose()
        if task_id is None:
            return -1
        if self._tasks()[task_id].runner_futures is not None:
            self._outer().join_running_task(task_id)
        self.state.ledgers[task_id].rounds += 1
        self.state.round_started(task_id)
        self.latest = task_id
        return task_id

    def _tasks(self):
        return self._outer().tasks_

    def _choose(self) -> int | None:
        """Stop on request, on time or without boards, stop tasks at their knee, then `choose_task`."""
        state, tasks = self.state, self._tasks()
        in_flight = {i: len(t.measure_candidates) for i, t in enumerate(tasks) if t.runner_futures is not None}
        measuring = sum(not all(f.done() for f in tasks[i].runner_futures) for i in in_flight)
        if state.stopped is None:
            state.stopped = stop_requested()
        if state.stopped is None and state.out_of_time(len(in_flight), measuring):
            state.stopped = f"time limit of {state.time_limit_s:g} s reached: a further round would end past it"
        if state.stopped:
            return None
        for task_id, ledger in enumerate(state.ledgers):
            if task_id in in_flight or tasks[task_id].is_terminated:
                continue
            if stop_at_knee(ledger, state.early_stop) or ledger.stopped:
                log.info(
                    "[%s] %s: %s after %d trials this run; its unspent trials go to tasks still gaining",
                    state.device_class,
                    state.names[task_id],
                    ledger.stopped,
                    ledger.spent,
                )
                self._outer().terminate_task(task_id)
        budget_left = state.run_budget - state.spent - sum(in_flight.values())
        task_id = choose_task(
            state.ledgers,
            [not t.is_terminated for t in tasks],
            in_flight,
            budget_left,
            state.trials_per_iter,
            state.trials_per_iter,  # expected gain: what a task's last round gained
            self.parity.behind(state.ledgers),
        )
        if task_id is None and budget_left > 0:
            state.stopped = "every task reached its knee, its cap or the end of its search space"
        return task_id

    def _collect(self, keep: int | None) -> None:
        """Record every round that is measuring, except `keep`'s."""
        for task_id, task in enumerate(self._tasks()):
            if task_id != keep and task.runner_futures is not None:
                self._outer().join_running_task(task_id)
