"""What watches a running class: a runner guard that notices when no board of the class is left,
and a measure callback that prints progress, saves the cost model and stops the run on time.

Both plug into MetaSchedule's own extension points (a PyRunner around the RPCRunner, a
PyMeasureCallback after the default ones); the task scheduler itself is TVM's.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerResult
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

from edgetune.durable import replaced_atomically
from edgetune.fleet.tracker import RpcEndpoint, class_load
from edgetune.tune.report import progress_line

log = logging.getLogger(__name__)

NO_BOARDS = "no board of the class left"


@derived_object
class FailedFuture(PyRunnerFuture):
    """A measurement that could not start; MetaSchedule records it as a failed trial."""

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def done(self) -> bool:
        return True

    def result(self) -> RunnerResult:
        return RunnerResult(run_secs=None, error_msg=self.message)


@derived_object
class BoardGuardRunner(PyRunner):
    """The class's RPCRunner, behind a check that the tracker still has a board of the class:
    without one, a batch fails at once instead of waiting out every session timeout."""

    def __init__(self, endpoint: RpcEndpoint, boards: int, runner: ms.runner.RPCRunner) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.boards = boards
        self.runner = runner
        self.boards_lost = False

    def run(self, runner_inputs: list[ms.runner.RunnerInput]) -> list[ms.runner.RunnerFuture]:
        if class_load(self.endpoint).registered == 0:
            self.boards_lost = True
            message = f"no board of class {self.endpoint.key} is registered with the tracker {self.endpoint.address}"
            return [FailedFuture(message) for _ in runner_inputs]
        return self.runner.run(runner_inputs)


@dataclass
class RunState:
    """Counters of one class's run, shared by the monitor and the tuner."""

    device_class: str
    budget: int
    trials: int  # trials in the database for the selected tasks, this run included
    task_calls: dict[str, dict[str, int]]  # model -> workload hash -> calls
    task_hashes: list[str]  # task id in the scheduler -> workload hash
    best: dict[str, float] = field(default_factory=dict)  # workload hash -> best latency
    started: float = field(default_factory=time.monotonic)
    stopped: str | None = None

    def record(self, workload: str, results: list[RunnerResult]) -> None:
        self.trials += len(results)
        for result in results:
            if result.error_msg is None and result.run_secs:
                latency = sum(float(s) for s in result.run_secs) / len(result.run_secs)
                self.best[workload] = min(latency, self.best.get(workload, float("inf")))

    def estimates(self) -> dict[str, float | None]:
        return {
            model: (sum(n * self.best[h] for h, n in calls.items())
                    if all(h in self.best for h in calls) else None)
            for model, calls in self.task_calls.items()
        }


@derived_object
class RunMonitor(PyMeasureCallback):
    """After every batch: count it, save the cost model, print progress, stop on time limit
    or when the class has lost all its boards."""

    def __init__(
        self, state: RunState, runner: BoardGuardRunner, cost_model: ms.cost_model.XGBModel,
        cost_model_path: Path, time_limit_s: float | None,
    ) -> None:
        super().__init__()
        self.state = state
        self.runner = runner
        self.cost_model = cost_model
        self.cost_model_path = cost_model_path
        self.time_limit_s = time_limit_s

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        self.state.record(self.state.task_hashes[task_id], list(runner_results))
        save_cost_model(self.cost_model, self.cost_model_path)
        if self.runner.boards_lost:
            self._stop(task_scheduler, NO_BOARDS)
        elif self.time_limit_s and time.monotonic() - self.state.started > self.time_limit_s:
            self._stop(task_scheduler, f"time limit of {self.time_limit_s:g} s reached")
        busy = class_load(self.runner.endpoint).busy
        log.info(progress_line(
            self.state.device_class, self.state.trials, self.state.budget, len(self.state.best),
            len(set(self.state.task_hashes)), self.state.estimates(), busy, self.runner.boards,
        ))

    def _stop(self, task_scheduler, reason: str) -> None:
        self.state.stopped = reason
        for task_id, task in enumerate(task_scheduler.tasks_):
            if not task.is_terminated:
                task_scheduler.terminate_task(task_id)


def save_cost_model(cost_model: ms.cost_model.XGBModel, path: Path) -> None:
    """Save atomically, so that a SIGKILL mid-save leaves the previous model. TVM names the
    booster file `model.bin`, so xgboost warns on every save that it picks its default format
    (UBJSON), which is the format TVM's `load` reads back: that warning is noise, not news."""
    with replaced_atomically(path) as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*Saving model in the UBJSON format as default", category=UserWarning)
        cost_model.save(str(tmp))
