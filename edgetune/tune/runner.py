"""Measurement on a device class's boards: MetaSchedule's RPCRunner through the fleet tracker.

Boards of a class register with the tracker under the class name as key, so the tracker hands
each measurement to a free board of that class; as many measurements run at once as the class
has boards. A board that dies mid-measurement turns that candidate into a failed RunnerResult
(TVM's RPCRunner catches the broken session) and the tracker stops handing it out.
Inputs that a kernel indexes with are filled in range (`index_inputs.InRangeArguments`), so a
gather or an embedding lookup is measured instead of crashing the board's session.
"""

from __future__ import annotations

import gc
import shutil
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.support.popen_pool import PopenPoolExecutor

from edgetune.fleet.tracker import RpcEndpoint, wait_for_servers
from edgetune.inventory.schema import Measurement
from edgetune.tune.index_inputs import IndexBounds, InRangeArguments

SESSION_TIMEOUT_S = 60


def wait_for_boards(endpoint: RpcEndpoint) -> int:
    """Registered boards of the class, waiting for the first a little longer than a session
    timeout: after a host crash a board re-registers only once its orphaned session has timed
    out, or, if the session was reset, once its watchdog has started a new server
    (edgetune.fleet.board_rpc_server)."""
    return wait_for_servers(endpoint, SESSION_TIMEOUT_S + 15)


def freeze_imports() -> None:
    """A measurement worker's initializer: what it has imported so far is never garbage, so
    `measure_then_collect`'s collection skips it (50 ms a collection here, microseconds frozen)."""
    gc.freeze()


def measure_then_collect(measure, *args):
    """One measurement in a runner worker (MetaSchedule's `_worker_func`), then a garbage
    collection there. An RPCSession has no close(): its connection ends, and its board goes back
    to the tracker, only when the object is freed, and a finished measurement's session can be
    left in a reference cycle: one that raised (the traceback holds the evaluator's and the
    cleanup's frames), and one whose worker the tracker had first handed a board that had just
    died (measured: held in 6 of 8 such measurements, tests/tune/test_exclusive_runner.py). An
    idle worker allocates nothing and so never collects: with a board of the class dead, the
    other worker waited on the tracker for the board the idle one still held until the board
    timed that session out (SESSION_TIMEOUT_S, a minute; the idle worker caught by py-spy in its
    popen loop). A failure goes back as its text, so that nothing of it outlives the collection."""
    failure = None
    try:
        return measure(*args)
    except Exception:  # noqa: BLE001 (every failure becomes the trial's error, as in MetaSchedule)
        failure = traceback.format_exc()
    finally:
        gc.collect()
    raise RuntimeError(failure)


class CollectingPool:
    """An RPCRunner's worker pool whose every measurement is `measure_then_collect`."""

    def __init__(self, pool: PopenPoolExecutor) -> None:
        self.pool = pool

    def submit(self, measure, *args):
        return self.pool.submit(measure_then_collect, measure, *args)


def make_runner(
    endpoint: RpcEndpoint, boards: int, measurement: Measurement, index_bounds: Mapping[str, IndexBounds],
) -> ms.runner.RPCRunner:
    """An RPCRunner on the class's `boards` boards with the profile's measurement settings,
    filling the inputs its tasks index with in range (`index_inputs.class_index_bounds`)."""
    runner = ms.runner.RPCRunner(
        rpc_config=ms.runner.RPCConfig(
            tracker_host=endpoint.host,
            tracker_port=endpoint.port,
            tracker_key=endpoint.key,
            session_timeout_sec=SESSION_TIMEOUT_S,
        ),
        evaluator_config=ms.runner.EvaluatorConfig(
            number=measurement.number,
            repeat=measurement.repeat,
            min_repeat_ms=measurement.min_repeat_ms,
        ),
        cooldown_sec=measurement.cooldown_ms / 1000.0,
        max_workers=boards,
        initializer=freeze_imports,
        f_alloc_argument=InRangeArguments(index_bounds),
    )
    runner.pool = CollectingPool(runner.pool)
    return runner


@dataclass(frozen=True)
class Measured:
    """One module measured outside the tuning loop: its run_secs, or why it has none."""

    run_secs: list[float] | None
    error: str | None


def build_and_measure(mods: Sequence[tvm.IRModule], target: tvm.target.Target, builder: ms.builder.Builder,
                      runner: ms.runner.Runner) -> list[Measured]:
    """Build modules with the run's builder and measure them in one batch with its runner,
    outside the tuning loop (borrowed schedules, untuned kernels), in order. A module that fails
    to build or run comes back with its error, never raised; the builds' files are removed."""
    built = builder.build([ms.builder.BuilderInput(mod, target) for mod in mods])
    try:
        futures = iter(runner.run([
            ms.runner.RunnerInput(result.artifact_path, device_type=_device_type(target),
                                  args_info=ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True))
            for mod, result in zip(mods, built) if result.error_msg is None
        ]))
        return [_measured(result.error_msg, None if result.error_msg else next(futures).result()) for result in built]
    finally:
        for result in built:  # each candidate has a directory of its own (SharedLibraryExport)
            if result.artifact_path:
                shutil.rmtree(Path(result.artifact_path).parent, ignore_errors=True)


def _measured(build_error: str | None, result: ms.runner.RunnerResult | None) -> Measured:
    if build_error:
        return Measured(None, build_error)
    if result.error_msg or not result.run_secs:
        return Measured(None, result.error_msg or "no timing returned")
    return Measured([float(s) for s in result.run_secs], None)


def _device_type(target: tvm.target.Target) -> str:
    """The device the runner opens on the board ("cpu" for llvm); TVM's runtime does not
    accept the target kind's name ("llvm") as a device any more."""
    return tvm.runtime.device(target.get_target_device_type()).type
