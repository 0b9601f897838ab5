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
board also runs that file with each (`OnnxModel`; the board's rpc_server offers them as
`edgetune.onnxruntime.*` and `edgetune.openvino.*`, board_rpc_server.py) at the board's runtime
threads. Each runtime's outputs are checked against the reference first: one that answers
differently is said in the log and not timed. The others take their turns in the same
interleaved rounds, timed the same way (a warm-up call, then `repeat` samples each filling
`min_repeat_ms`) by the board's Python around one inference call. A board without a runtime is
simply not compared against it.

No cache flush: TVM's `cache_flush_cpu_non_first_arg` flushes the call's arguments after the
first, and for `invoke_stateful` the only argument is the function name (measured: no effect);
its `cache_flush_bytes` evicts once per repeat, which over a repeat of hundreds of calls is
noise. The timing is warm-cache, steady-state latency.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
from tvm import relax, rpc

from edgetune.artifact_format.files import sha256_file
from edgetune.artifact_format.manifest import Timing, Tolerance
from edgetune.artifact_format.reference import check_outputs
from edgetune.errors import EdgetuneError
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


ONNXRUNTIME = "onnxruntime"
OPENVINO = "openvino"
RUNTIMES = (ONNXRUNTIME, OPENVINO)  # what a board's Python may have to run the ONNX file; the labels of their runs


@dataclass(frozen=True)
class OnnxModel:
    """The model's ONNX file, every input its graph takes (fixed ones included), and the outputs
    a runtime must answer (within `tolerance`) to be timed, for the boards that have a runtime
    to run next to the libraries."""

    path: Path
    inputs: Mapping[str, np.ndarray]
    expected: Mapping[str, np.ndarray]
    tolerance: Tolerance


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
    uploaded: list[str] = []

    def upload(data: bytes, name: str) -> None:
        session.upload(bytearray(data), target=name)
        uploaded.append(name)

    try:
        for label, path in libraries.items():
            if remote_names[label] not in uploaded:
                upload(path.read_bytes(), remote_names[label])
        dev = session.cpu()
        tensors = [tvm.runtime.tensor(a, dev) for a in args]
        outputs, timers = {}, {}
        for label, remote_name in remote_names.items():
            vm = relax.VirtualMachine(session.load_module(remote_name), dev)
            vm.set_input(entry, *tensors)
            vm.invoke_stateful(entry)
            outputs[label] = output_dict(vm.get_outputs(entry))
            timers[label] = _round_timer(vm, dev, entry, measurement)
        runtimes = _load_runtimes(session, onnx, upload) if onnx is not None else {}
        for name, (_, answer) in runtimes.items():
            outputs[name] = answer
            timers[name] = _runtime_timer(session, name, measurement)
        timings = _timed(timers, measurement.compare.rounds)
        threads = tvm_threads(session)
    finally:
        for remote_name in uploaded:
            session.remove(remote_name)
    return {
        label: RunResult(timing, outputs[label], runtimes[label][0])
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
    return _timed(
        {label: _round_timer(vm, dev, entry, measurement) for label, vm in vms.items()}, measurement.compare.rounds
    )


def _timed(timers: Mapping[str, Callable[[], Sequence[float]]], rounds: int) -> dict[str, Timing]:
    """Every timer's samples of `rounds` interleaved rounds (`interleave`), as a Timing per label."""
    return {label: Timing.from_samples_s(values) for label, values in interleave(timers, rounds).items()}


def runtime_on_board(session: rpc.RPCSession, runtime: str) -> str:
    """The version of `runtime` (one of `RUNTIMES`) in the board's Python; "" where it has none,
    or its rpc_server is not edgetune's (started by something else, or before it offered it)."""
    try:
        return str(session.get_function(f"edgetune.{runtime}.version")())
    except (RuntimeError, AttributeError):  # TVM: the remote has no such function
        return ""


def _load_runtimes(session: rpc.RPCSession, onnx: OnnxModel, upload) -> dict[str, tuple[str, dict]]:
    """Upload the ONNX file and its inputs, open them with every runtime the board has and run
    each once: per runtime that answers like the reference, what runs it ("<runtime> <version>,
    <n> threads") and its outputs. A runtime that cannot run the file there, or answers
    differently, is said in the log and left out (the build goes on without it)."""
    versions = {name: version for name in RUNTIMES if (version := runtime_on_board(session, name))}
    if not versions:
        return {}
    model_name, inputs_name = f"edgetune-{sha256_file(onnx.path)[:16]}.onnx", "edgetune-runtime-inputs.npz"
    buffer = io.BytesIO()
    np.savez(buffer, **onnx.inputs)
    upload(onnx.path.read_bytes(), model_name)
    upload(buffer.getvalue(), inputs_name)
    loaded = {}
    for name, version in versions.items():
        try:
            threads = int(session.get_function(f"edgetune.{name}.load")(model_name, inputs_name))
            outputs = _npz(session.get_function(f"edgetune.{name}.outputs")())
        except RuntimeError as err:  # the remote's exception, its traceback in the message
            log.warning(
                "  %s %s on the board cannot run %s, so it is not compared there: %s",
                name,
                version,
                onnx.path.name,
                str(err).strip().splitlines()[-1],
            )
            continue
        check = check_outputs(outputs, onnx.expected, onnx.tolerance)
        if not check.ok:
            log.warning(
                "  %s %s on the board answers %s differently from the reference (%s), so it is not timed there",
                name,
                version,
                onnx.path.name,
                check.detail,
            )
            continue
        count = "its default threads" if threads == 0 else f"{threads} thread" + ("s" if threads > 1 else "")
        loaded[name] = (f"{name} {version}, {count}", outputs)
    return loaded


def _runtime_timer(session: rpc.RPCSession, runtime: str, measurement: Measurement) -> Callable[[], list[float]]:
    turn = session.get_function(f"edgetune.{runtime}.turn")
    compare = measurement.compare
    return lambda: json.loads(turn(compare.repeat, float(compare.min_repeat_ms), float(measurement.cooldown_ms)))


def _npz(data: bytes | bytearray) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(bytes(data))) as loaded:
        return {name: loaded[name] for name in loaded.files}


def interleave(timers: Mapping[str, Callable[[], Sequence[float]]], rounds: int) -> dict[str, tuple[float, ...]]:
    """Call every timer once per round, taking turns: in label order in even rounds, in
    reverse order in odd ones (A B, B A, A B ...), so that neither goes first every time.
    Turns follow each other without a pause (a random pause before each turn was tried and made
    throttled boards worse: docs/measurement.md). Returns all samples per label, in order."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    labels = list(timers)
    samples: dict[str, list[float]] = {label: [] for label in labels}
    for round_index in range(rounds):
        for label in labels if round_index % 2 == 0 else reversed(labels):
            samples[label].extend(timers[label]())
    return {label: tuple(values) for label, values in samples.items()}


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
