"""Run built libraries on the boards of a device class's tuning pool through the fleet's TVM
tracker, and time the ones being compared against each other.

Every board asked for is held at once through the tracker (`edgetune.fleet.tracker.
board_sessions`, one session per board); boards are then driven one at a time, so that boards
sharing a host (the simulated fleet) do not disturb each other's timing.

On a board (`compare_on_board`): upload every library, load each under
`relax.VirtualMachine` with the stateful API (set_input / invoke_stateful / get_outputs, which
works over RPC for tuple outputs too), run each once for its outputs, then time them in
interleaved rounds (`interleave`): A B, B A, A B ... in the same session, so that whatever
drifts on the board (other load, throttling, clocks) falls on all of them alike. Each turn is
one `time_evaluator` call of `invoke_stateful`: a discarded warm-up call, then `repeat`
samples, each the mean of as many calls as fill `min_repeat_ms` (the profile's
`measurement.compare`). The libraries run on the threads of TVM's pool in the board's
rpc_server (TVM_NUM_THREADS, which `fleet up` sets to the board's runtime threads); the board's
own count is read back (`tvm_threads`) and kept with the timings.

Where the model came as an ONNX file and the board's Python has onnxruntime or OpenVINO, the
board also runs that file with each at the board's runtime threads (`OnnxModel`,
edgetune.fleet.board_runtimes: the runtimes a board offers, their outputs checked against the
reference first). The ones that answer alike take their turns in the same interleaved rounds,
timed the same way by the board's Python around one inference call. A board without a runtime is
simply not compared against it.

No cache flush: TVM's `cache_flush_cpu_non_first_arg` flushes the call's arguments after the
first, and for `invoke_stateful` the only argument is the function name (measured: no effect);
its `cache_flush_bytes` evicts once per repeat, which over a repeat of hundreds of calls is
noise. The timing is warm-cache, steady-state latency.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
from tvm import relax, rpc

from edgetune.artifact_format.files import sha256_file
from edgetune.artifact_format.manifest import Timing
from edgetune.errors import EdgetuneError
from edgetune.fleet.board_runtimes import RUNTIMES as RUNTIMES  # callers of the build's measurement name them here
from edgetune.fleet.board_runtimes import OnnxModel, load_runtimes, runtime_timer, timed, uploads
from edgetune.fleet.board_runtimes import interleave as interleave
from edgetune.fleet.board_runtimes import runtime_on_board as runtime_on_board
from edgetune.fleet.on_board import read_firmware
from edgetune.fleet.parallel import GroupResult
from edgetune.fleet.ssh import BoardSession
from edgetune.fleet.tracker import RpcEndpoint, board_sessions
from edgetune.inventory.schema import Board, Fleet, Measurement

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    """One library or runtime on one board: its timing and its outputs on the given input."""

    timing: Timing
    outputs: dict[str, np.ndarray]  # "output0", "output1", ... in the function's return order
    runtime: str = ""  # for a runtime: "<runtime> <version>, <n> threads"; "" for a library
    threads: int | None = None  # for a library: TVM's thread count in the board's process that timed it


def output_dict(result: object) -> dict[str, np.ndarray]:
    """A VM result (one tensor or a tuple of them) as {"output<i>": array}."""
    items = list(result) if isinstance(result, (list, tuple, tvm.ir.Array)) else [result]
    return {f"output{i}": item.numpy() for i, item in enumerate(items)}


def run_on_boards(
    endpoint: RpcEndpoint,
    boards: Sequence[Board],
    libraries: Mapping[str, Path],
    entry: str,
    args: Sequence[np.ndarray],
    measurement: Measurement,
    onnx: OnnxModel | None = None,
) -> GroupResult[dict[str, RunResult]]:
    """Every library (label -> .so) run and timed against the others on every board
    (`compare_on_board`), one board at a time; per-board results as data."""
    succeeded: dict[str, dict[str, RunResult]] = {}
    with board_sessions(endpoint, boards) as (sessions, failed):
        for name, session in sessions.items():
            try:
                succeeded[name] = compare_on_board(session, libraries, entry, args, measurement, onnx)
            except (EdgetuneError, RuntimeError, ValueError, OSError) as err:  # TVM raises RuntimeError subclasses
                failed[name] = f"{name}: running the library failed: {err}"
                continue
            log.info(
                "  %s: %s", name, ", ".join(f"{k} {r.timing.median_ms:.3f} ms" for k, r in succeeded[name].items())
            )
    return GroupResult(succeeded, failed)


def compare_on_board(
    session: rpc.RPCSession,
    libraries: Mapping[str, Path],
    entry: str,
    args: Sequence[np.ndarray],
    measurement: Measurement,
    onnx: OnnxModel | None = None,
) -> dict[str, RunResult]:
    """Upload and load every library, run each once for its outputs, then time them all in
    `measurement.compare.rounds` interleaved rounds; the uploads are removed afterwards. With
    `onnx`, every runtime of `RUNTIMES` the board has and that answers like the reference takes
    part too, labelled by its name."""
    remote_names = {label: f"edgetune-{sha256_file(path)[:16]}.so" for label, path in libraries.items()}
    with uploads(session) as upload:
        for name, path in {remote_names[label]: path for label, path in libraries.items()}.items():
            upload(path.read_bytes(), name)
        dev = session.cpu()
        tensors = [tvm.runtime.tensor(a, dev) for a in args]
        outputs, timers = {}, {}
        for label, remote_name in remote_names.items():
            vm = relax.VirtualMachine(session.load_module(remote_name), dev)
            vm.set_input(entry, *tensors)
            vm.invoke_stateful(entry)
            outputs[label] = output_dict(vm.get_outputs(entry))
            timers[label] = _round_timer(vm, dev, entry, measurement)
        runtimes = load_runtimes(session, onnx, upload) if onnx is not None else {}
        for name, loaded in runtimes.items():
            outputs[name] = loaded.outputs
            timers[name] = runtime_timer(session, name, measurement)
        timings = timed(timers, measurement.compare.rounds)
        threads = tvm_threads(session)
    return {
        label: RunResult(timing, outputs[label], runtimes[label].label)
        if label in runtimes
        else RunResult(timing, outputs[label], threads=threads)
        for label, timing in timings.items()
    }


def tvm_threads(session: rpc.RPCSession) -> int:
    """The threads TVM's thread pool runs parallel loops on in the board's rpc_server process
    (its TVM_NUM_THREADS, else the cores it may use)."""
    return int(session.get_function("runtime.NumThreads")())


def time_interleaved(
    vms: Mapping[str, relax.VirtualMachine], dev, entry: str, measurement: Measurement
) -> dict[str, Timing]:
    """Time VMs already loaded on one board, their inputs set (`vm.set_input(entry, ...)`), in
    `measurement.compare.rounds` interleaved rounds; every sample kept, per label."""
    return timed(
        {label: _round_timer(vm, dev, entry, measurement) for label, vm in vms.items()}, measurement.compare.rounds
    )


def _round_timer(vm: relax.VirtualMachine, dev, entry: str, measurement: Measurement) -> Callable[[], list[float]]:
    """One turn of a library: `compare.repeat` samples in seconds (TVM's time_evaluator on
    the board: a warm-up call, then per sample as many calls as fill `compare.min_repeat_ms`)."""
    timer = vm.time_evaluator(
        "invoke_stateful",
        dev,
        number=1,
        repeat=measurement.compare.repeat,
        min_repeat_ms=measurement.compare.min_repeat_ms,
        cooldown_interval_ms=measurement.cooldown_ms,
    )
    return lambda: list(timer(entry).results)


def firmware_fingerprint(fleet: Fleet, board: Board) -> str:
    """The board's firmware fingerprint (its class profile's command, over SSH)."""
    with BoardSession(board) as ssh:
        return read_firmware(ssh, fleet)
