"""What watches a running class: a runner guard that waits for the class's boards when none is
registered and notices when none comes back, and a measure callback that keeps each task's
account, prints progress and saves the cost model.

Both plug into MetaSchedule's own extension points (a PyRunner around the RPCRunner, a
PyMeasureCallback after the default ones); `scheduler.BudgetScheduler` acts on what they note.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerResult

from edgetune.durable import replaced_atomically
from edgetune.fleet.tracker import RpcEndpoint, class_load, wait_for_servers
from edgetune.inventory.schema import EarlyStop
from edgetune.tune.budget import TaskLedger, round_fits
from edgetune.tune.report import progress_line

log = logging.getLogger(__name__)

BOARD_RETURN_GRACE_S = 60.0  # how long a class without a registered board waits for one to come back
NO_BOARDS = (
    "no board of the class left (none came back to the tracker in time): "
    "see `edgetune fleet status`, restart them with `edgetune fleet up`, and re-run `edgetune tune` to resume"
)


@derived_object
class DoneFuture(PyRunnerFuture):
    """A measurement whose result is already known: one that could not start, or one the runner
    waited for."""

    def __init__(self, result: RunnerResult) -> None:
        super().__init__()
        self._result = result

    def done(self) -> bool:
        return True

    def result(self) -> RunnerResult:
        return self._result


@derived_object
class BoardGuardRunner(PyRunner):
    """The class's RPCRunner, behind a check that the tracker still has a board of the class.
    With none registered, it waits up to `return_grace_s` for one to come back (a candidate that
    crashed a board's session takes the board off the tracker until its watchdog registers it
    again, about 15 s: edgetune.fleet.board_rpc_server); if none does, the batch fails at once
    instead of waiting out every session timeout, and the class is noted as having no board left.

    `exclusive`: return only when the batch is measured, so that MetaSchedule neither searches
    nor builds the next batch meanwhile. For boards that share the host's CPUs (simulated ones):
    a board timed while the host compiles measures the contention (2x on 2 cores, see docs/measurement.md)."""

    def __init__(
        self,
        endpoint: RpcEndpoint,
        boards: int,
        runner: ms.runner.RPCRunner,
        exclusive: bool,
        return_grace_s: float = BOARD_RETURN_GRACE_S,
    ) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.boards = boards
        self.runner = runner
        self.exclusive = exclusive
        self.return_grace_s = return_grace_s
        self.boards_lost = False

    def run(self, runner_inputs: list[ms.runner.RunnerInput]) -> list[ms.runner.RunnerFuture]:
        if not self._a_board_is_registered():
            self.boards_lost = True
            message = (
                f"no board of class {self.endpoint.key} registered with the tracker {self.endpoint.address} "
                f"within {self.return_grace_s:g} s"
            )
            return [DoneFuture(RunnerResult(run_secs=None, error_msg=message)) for _ in runner_inputs]
        futures = self.runner.run(runner_inputs)
        if not self.exclusive:
            return futures
        return [DoneFuture(future.result()) for future in futures]

    def _a_board_is_registered(self) -> bool:
        """Whether a board of the class is registered, waiting up to `return_grace_s` for one."""
        if class_load(self.endpoint).registered > 0:
            return True
        log.warning(
            "[%s] no board of the class is registered with the tracker %s; waiting up to %g s for one to come back",
            self.endpoint.key,
            self.endpoint.address,
            self.return_grace_s,
        )
        started = time.monotonic()
        if wait_for_servers(self.endpoint, self.return_grace_s) == 0:
            return False
        log.info("[%s] a board is back after %.0f s; measuring goes on", self.endpoint.key, time.monotonic() - started)
        return True


@dataclass
class RunState:
    """One class's run, shared by the monitor (which records) and the scheduler (which decides)."""

    device_class: str
    task_calls: dict[str, dict[str, int]]  # model -> workload hash -> calls
    ledgers: list[TaskLedger]  # per task id in the scheduler
    names: list[str]  # per task id
    run_budget: int  # trials this run may measure (UNBOUNDED_TRIALS less any borrowed: the time is the budget)
    trials_per_iter: int
    early_stop: EarlyStop | None
    time_limit_s: float | None
    time_is_the_budget: bool = False  # no trial budget: the time limit ends the run
    best: dict[str, float] = field(default_factory=dict)  # workload hash -> best latency this run
    stopped: str | None = None
    # time_limit_s counts from the first round: the set-up before it (design spaces, the cost
    # model, borrowing) is a class's own, not a share of the search
    first_round_started: float | None = None
    rounds_measured: int = 0
    # from a round's hand-over to TVM to its recording: what a time limit may be overrun by
    longest_round_s: float | None = None
    round_started_at: dict[int, float] = field(default_factory=dict)  # task id -> its round in flight

    @property
    def spent(self) -> int:
        return sum(ledger.spent for ledger in self.ledgers)

    def round_started(self, task_id: int) -> None:
        now = time.monotonic()
        if self.first_round_started is None:
            self.first_round_started = now
        self.round_started_at[task_id] = now

    def searched_s(self) -> float:
        """Seconds since the first round started (0 before it)."""
        return 0.0 if self.first_round_started is None else time.monotonic() - self.first_round_started

    def out_of_time(self, in_flight: int, measuring: int) -> bool:
        """Whether a round started now would end past the time limit (`budget.round_fits`), at the
        run's pace so far (seconds per round; rounds overlap). `in_flight`: rounds handed to the
        runner and not yet recorded (MetaSchedule hands a round's results over, and `record`
        counts it, only when its task is next chosen); `measuring`: those of them still measuring.

        Every round handed over counts toward the pace, measured or not: it was searched and built
        in the time elapsed. Counting only measured ones, one round measured and one measuring at
        4.2 s read as 4.2 s a round, and a 10 s limit ended the run two rounds early."""
        rounds = self.rounds_measured + in_flight
        pace = self.searched_s() / rounds if rounds else None
        return not round_fits(self.searched_s(), self.time_limit_s, pace, measuring)

    def record(self, task_id: int, results: list[RunnerResult]) -> None:
        self.rounds_measured += 1
        started = self.round_started_at.pop(task_id, None)
        if started is not None:
            self.longest_round_s = max(time.monotonic() - started, self.longest_round_s or 0.0)
        latencies = [_latency(result) for result in results]
        ledger = self.ledgers[task_id]
        ledger.record(latencies)
        valid = [x for x in latencies if x is not None]
        if valid:
            self.best[ledger.workload_hash] = min(min(valid), self.best.get(ledger.workload_hash, float("inf")))

    def estimates(self) -> dict[str, float | None]:
        return {
            model: (sum(n * self.best[h] for h, n in calls.items()) if all(h in self.best for h in calls) else None)
            for model, calls in self.task_calls.items()
        }


def _latency(result: RunnerResult) -> float | None:
    if result.error_msg is not None or not result.run_secs:
        return None
    return sum(float(s) for s in result.run_secs) / len(result.run_secs)


@derived_object
class RunMonitor(PyMeasureCallback):
    """After every batch: count it on its task, save the cost model, print progress, and note
    when the class has lost all its boards (the scheduler then ends the run)."""

    def __init__(
        self,
        state: RunState,
        runner: BoardGuardRunner,
        cost_model: ms.cost_model.XGBModel,
        cost_model_path: Path,
    ) -> None:
        super().__init__()
        self.state = state
        self.runner = runner
        self.cost_model = cost_model
        self.cost_model_path = cost_model_path

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        self.state.record(task_id, list(runner_results))
        save_cost_model(self.cost_model, self.cost_model_path)
        if self.runner.boards_lost and self.state.stopped is None:
            self.state.stopped = NO_BOARDS
        busy, state = class_load(self.runner.endpoint).busy, self.state
        log.info(
            progress_line(
                state.device_class,
                state.spent,
                None if state.time_is_the_budget else state.run_budget,
                len(state.best),
                len(state.ledgers),
                state.estimates(),
                busy,
                self.runner.boards,
                None if state.time_limit_s is None else (state.searched_s(), state.time_limit_s),
            )
        )


# TVM names the booster file `model.bin`, so xgboost warns on every save and load that it
# picks, or guesses, its default format (UBJSON), which is the format TVM reads back: noise.
_XGB_FORMAT_WARNINGS = r".*(Saving model in the UBJSON format as default|Unknown file format: `bin`)"


def save_cost_model(cost_model: ms.cost_model.XGBModel, path: Path) -> None:
    """Save atomically, so that a SIGKILL mid-save leaves the previous model."""
    with replaced_atomically(path) as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_XGB_FORMAT_WARNINGS, category=UserWarning)
        cost_model.save(str(tmp))


def load_cost_model(cost_model: ms.cost_model.XGBModel, path: Path) -> None:
    """Load what `save_cost_model` saved into `cost_model`."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_XGB_FORMAT_WARNINGS, category=UserWarning)
        cost_model.load(str(path))
