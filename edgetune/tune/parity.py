"""What time to parity is measured against and by, kept in the class database: each ONNX model's
time under the runtimes a board of the class would otherwise run it with, and the class's
tuning clock.

At a class run's start (after the untuned kernels are measured), each ONNX model of the run
with no record for its key (`model_key`: the file's sha256 and the input shapes) at the board's
runtime threads is timed on one board of the class's tuning pool under every runtime its Python
has (onnxruntime, OpenVINO: edgetune.fleet.board_runtimes), its outputs checked against the
reference first, in the profile's `measurement.compare` interleaved rounds, as the build times
them. The medians go to `runtimes.jsonl`, so a resumed run measures none of them again (nor
after a firmware update: the trials the estimate is made of are not measured again either). A
board whose Python has neither runtime records nothing, and a failure to measure is logged: the
run goes on, and the model's summary says "not measured".

The clock (`TuningClock`) writes `clock.jsonl`: a start mark once those measurements are done,
then a line per round as it is recorded. Its seconds are the class's tuning time as `runs.jsonl`
counts a run (from the run's taking the class database, before the untuned kernels and the
runtimes are measured, to the round's recording), the earlier runs' whole time added.
`report.parity_point` reads a crossing's minute from it.

With the runtimes' times, the scheduler deals the rounds it gives by expected gain to the
kernels of models still slower than their faster runtime first (`parity_bars`, `budget.ParityBars`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

from edgetune.artifact_format.codec import canonical_bytes, sha256_hex
from edgetune.artifact_format.files import sha256_file
from edgetune.artifact_format.reference import output_tolerance
from edgetune.compiler.models import reference_inputs, reference_outputs, rounding_spread
from edgetune.compiler.tasks import KernelTask
from edgetune.errors import EdgetuneError
from edgetune.fleet.board_runtimes import OnnxModel, time_runtimes
from edgetune.fleet.tracker import board_sessions, rpc_endpoint
from edgetune.inventory.schema import Board, Fleet, Model, ModelInput
from edgetune.tune.budget import ParityBar, ParityBars
from edgetune.tune.database import (
    ClassDatabasePaths,
    ClockLine,
    RuntimesLine,
    RuntimeTime,
    TrialRecord,
    append_clock,
    append_runtimes,
    clock_lines,
    read_trials,
    runtime_times,
    throughput,
)
from edgetune.tune.report import model_calls, scheduled_latency

log = logging.getLogger(__name__)


def model_key(onnx: Path, inputs: Sequence[ModelInput]) -> str:
    """What an ONNX model's runtime times are recorded under: its file's sha256 and its inputs."""
    shapes = [[i.name, list(i.shape), i.dtype] for i in inputs]
    return sha256_hex(canonical_bytes({"onnx": sha256_file(onnx), "inputs": shapes}))


def board_threads(fleet: Fleet, board: Board) -> int:
    """The threads the board's rpc_server runs at (`fleet up` sets its TVM_NUM_THREADS so)."""
    return board.threads or fleet.device_class(board.device_class).profile.runtime_threads


def recorded_runtimes(
    fleet: Fleet, device_class: str, models: Sequence[Model], paths: ClassDatabasePaths
) -> dict[str, Mapping[str, RuntimeTime]]:
    """Per ONNX model with a record at the threads of a board of the class's pool: each runtime's time."""
    recorded = runtime_times(paths)
    found = {}
    for model in models:
        line = _record_of(recorded, fleet, device_class, model)
        if line is not None:
            found[model.name] = line.times
    return found


def _record_of(
    recorded: Mapping[tuple[str, int], RuntimesLine], fleet: Fleet, device_class: str, model: Model
) -> RuntimesLine | None:
    if model.onnx is None:
        return None
    key = model_key(model.onnx, model.inputs)
    lines = (recorded.get((key, board_threads(fleet, board))) for board in fleet.pool_of(device_class))
    return next((line for line in lines if line is not None), None)


def measure_runtimes(fleet: Fleet, device_class: str, models: Sequence[Model], paths: ClassDatabasePaths) -> None:
    """Time the ONNX models that have no record yet under the runtimes of the first board of the
    class's pool that gives a session, and record what was measured. Nothing here fails the run:
    a failure is logged, and the models concerned are not measured."""
    recorded = runtime_times(paths)
    todo = [(m, m.onnx) for m in models if m.onnx is not None and _record_of(recorded, fleet, device_class, m) is None]
    if not todo:
        return
    endpoint = rpc_endpoint(fleet, device_class)
    for board in fleet.pool_of(device_class):
        try:
            with board_sessions(endpoint, [board]) as (sessions, failed):
                if board.name in failed:
                    log.warning("[%s] runtimes not timed on %s: %s", device_class, board.name, failed[board.name])
                    continue
                for model, onnx in todo:
                    _measure_model(fleet, device_class, board, sessions[board.name], model, onnx, paths)
                return
        except (EdgetuneError, OSError, RuntimeError) as err:  # the tracker's connection, TVM's RPC errors
            log.warning("[%s] runtimes not timed on %s: %s", device_class, board.name, _last_line(err))
    log.warning("[%s] no board gave a session: time to parity is not measured this run", device_class)


def _measure_model(
    fleet: Fleet, device_class: str, board: Board, session, model: Model, onnx_path: Path, paths: ClassDatabasePaths
) -> None:
    measurement = fleet.device_class(device_class).profile.measurement
    started = time.monotonic()
    try:
        inputs = reference_inputs(model)
        expected = {f"output{i}": out for i, out in enumerate(reference_outputs(model, inputs))}
        onnx = OnnxModel(onnx_path, inputs, expected, output_tolerance(rounding_spread(model, inputs)))
        timings = time_runtimes(session, onnx, measurement)
    except Exception as err:  # noqa: BLE001 -- the host's reference (onnxruntime), TVM's RPC: logged, never fatal
        log.warning(
            "[%s] %s: timing its runtimes on %s failed, so its time to parity is not measured: %s",
            device_class,
            model.name,
            board.name,
            _last_line(err),
        )
        return
    if not timings:
        log.info(
            "[%s] %s: no runtime on %s ran it (neither onnxruntime nor openvino in %s, or they answered "
            "differently): time to parity not measured",
            device_class,
            model.name,
            board.name,
            board.python,
        )
        return
    times = {name: RuntimeTime(t.label, t.timing.median_ms / 1e3) for name, t in timings.items()}
    key = model_key(onnx_path, model.inputs)
    append_runtimes(paths, RuntimesLine(key, board.name, board_threads(fleet, board), times))
    log.info(
        "[%s] %s on %s, what time to parity is measured against: %s (%.1f s)",
        device_class,
        model.name,
        board.name,
        "; ".join(f"{t.runtime}: {t.seconds * 1e3:.3f} ms" for t in times.values()),
        time.monotonic() - started,
    )


def _last_line(err: BaseException) -> str:
    """An error's last line (TVM's carry the remote's traceback), or its type where it says nothing."""
    text = str(err).strip()
    return text.splitlines()[-1] if text else type(err).__name__


def parity_bars(
    tasks: tuple[KernelTask, ...],
    runtimes: Mapping[str, Mapping[str, RuntimeTime]],
    trials: Sequence[TrialRecord],
    untuned: Mapping[str, float | None],
    scheduled: tuple[KernelTask, ...] = (),
) -> ParityBars:
    """Per model with runtime times, its kernels' calls and its faster runtime's time less the
    time of its kernels `prepare` scheduled (`scheduled_latency`: the searched kernels must beat
    what is left); per kernel, its best recorded latency, else its untuned time (the estimate
    before the run)."""
    bars = tuple(
        ParityBar(
            model_calls(tasks, model),
            min(run.seconds for run in times.values()) - (scheduled_latency(scheduled, model, untuned) or 0.0),
        )
        for model, times in runtimes.items()
        if times
    )
    best: dict[str, float] = {}
    for trial in trials:
        if trial.latency_s is not None:
            best[trial.workload_hash] = min(trial.latency_s, best.get(trial.workload_hash, trial.latency_s))
    return ParityBars(bars, {**{h: s for h, s in untuned.items() if s is not None}, **best})


class TuningClock:
    """The class's tuning clock, kept in `clock.jsonl` (the module's docstring)."""

    def __init__(self, paths: ClassDatabasePaths, run_started: float) -> None:
        """`run_started`: when this run took the class database (time.monotonic())."""
        earlier = throughput(paths)
        lines = clock_lines(paths)
        self.paths = paths
        self.offset = max(earlier.seconds if earlier else 0.0, lines[-1].seconds if lines else 0.0)
        self.run_started = run_started
        self.trials = len(read_trials(paths))

    def start(self) -> None:
        """The run's start mark: its untuned kernels and runtimes are measured."""
        append_clock(self.paths, ClockLine(self.trials, self.seconds(), start=True))

    def recount(self) -> None:
        """Count the record file again (after records committed outside the rounds: borrowed ones)."""
        self.trials = len(read_trials(self.paths))

    def advance(self, trials: int) -> None:
        """A round of `trials` records was recorded."""
        self.trials += trials
        append_clock(self.paths, ClockLine(self.trials, self.seconds()))

    def seconds(self) -> float:
        return round(self.offset + time.monotonic() - self.run_started, 3)


@derived_object
class ClockRounds(PyMeasureCallback):
    """Advance the clock by each round MetaSchedule records (after its AddToDatabase)."""

    def __init__(self, clock: TuningClock) -> None:
        super().__init__()
        self.clock = clock

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        self.clock.advance(len(runner_results))
