"""The runtimes a board's Python offers to run a model's ONNX file (onnxruntime and OpenVINO,
served by the board's rpc_server as `edgetune.onnxruntime.*` and `edgetune.openvino.*`,
board_rpc_server.py), and the interleaved rounds every on-board comparison is timed in.

A runtime is timed only once its outputs on the reference input match the reference
(`load_runtimes`): one that cannot open the file or answers differently is said in the log and
left out. A runtime's turn is timed by the board's Python the way TVM's `time_evaluator` times a
library: a warm-up call, then `repeat` samples each filling `min_repeat_ms`. The artifact build
times the runtimes next to its libraries (edgetune.artifact.measure); a class run times them
alone at its start (`time_runtimes`), the time its tuning estimate is compared against.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tvm import rpc

from edgetune.artifact_format.files import sha256_file
from edgetune.artifact_format.manifest import Timing, Tolerance
from edgetune.artifact_format.reference import check_outputs, npz_bytes
from edgetune.inventory.schema import Measurement

log = logging.getLogger(__name__)

ONNXRUNTIME = "onnxruntime"
OPENVINO = "openvino"
RUNTIMES = (ONNXRUNTIME, OPENVINO)  # what a board's Python may have to run the ONNX file; the labels of their runs

Upload = Callable[[bytes, str], None]  # (data, the file's name in the board's rpc_server workpath)


@dataclass(frozen=True)
class OnnxModel:
    """The model's ONNX file, every input its graph takes (fixed ones included), and the outputs
    a runtime must answer (within `tolerance`) to be timed, for the boards that have a runtime
    to run next to the libraries."""

    path: Path
    inputs: Mapping[str, np.ndarray]
    expected: Mapping[str, np.ndarray]
    tolerance: Tolerance


@dataclass(frozen=True)
class LoadedRuntime:
    """A runtime that opened the model on the board and answered like the reference."""

    label: str  # "<runtime> <version>, <n> threads"
    outputs: dict[str, np.ndarray]


@dataclass(frozen=True)
class RuntimeTiming:
    label: str  # as LoadedRuntime's
    timing: Timing


def runtime_on_board(session: rpc.RPCSession, runtime: str) -> str:
    """The version of `runtime` (one of `RUNTIMES`) in the board's Python; "" where it has none,
    or its rpc_server is not edgetune's (started by something else, or before it offered it)."""
    try:
        return str(session.get_function(f"edgetune.{runtime}.version")())
    except (RuntimeError, AttributeError):  # TVM: the remote has no such function
        return ""


@contextmanager
def uploads(session: rpc.RPCSession) -> Iterator[Upload]:
    """An `Upload` into the board's rpc_server workpath; every file it uploaded is removed on exit."""
    uploaded: list[str] = []

    def upload(data: bytes, name: str) -> None:
        session.upload(bytearray(data), target=name)
        uploaded.append(name)

    try:
        yield upload
    finally:
        for name in uploaded:
            session.remove(name)


def load_runtimes(session: rpc.RPCSession, onnx: OnnxModel, upload: Upload) -> dict[str, LoadedRuntime]:
    """Upload the ONNX file and its inputs, open them with every runtime the board has and run
    each once: per runtime that answers like the reference, what runs it and its outputs. A
    runtime that cannot run the file there, or answers differently, is said in the log and left
    out."""
    versions = {name: version for name in RUNTIMES if (version := runtime_on_board(session, name))}
    if not versions:
        return {}
    model_name, inputs_name = f"edgetune-{sha256_file(onnx.path)[:16]}.onnx", "edgetune-runtime-inputs.npz"
    upload(onnx.path.read_bytes(), model_name)
    upload(npz_bytes(onnx.inputs), inputs_name)
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
        loaded[name] = LoadedRuntime(f"{name} {version}, {count}", outputs)
    return loaded


def runtime_timer(session: rpc.RPCSession, runtime: str, measurement: Measurement) -> Callable[[], list[float]]:
    """One turn of a loaded runtime: `compare.repeat` samples in seconds, timed on the board."""
    turn = session.get_function(f"edgetune.{runtime}.turn")
    compare = measurement.compare
    return lambda: json.loads(turn(compare.repeat, float(compare.min_repeat_ms), float(measurement.cooldown_ms)))


def time_runtimes(session: rpc.RPCSession, onnx: OnnxModel, measurement: Measurement) -> dict[str, RuntimeTiming]:
    """Every runtime the board has that answers like the reference, timed against the others in
    `measurement.compare.rounds` interleaved rounds; the uploads are removed afterwards."""
    with uploads(session) as upload:
        loaded = load_runtimes(session, onnx, upload)
        timings = timed(
            {name: runtime_timer(session, name, measurement) for name in loaded}, measurement.compare.rounds
        )
    return {name: RuntimeTiming(loaded[name].label, timing) for name, timing in timings.items()}


def timed(timers: Mapping[str, Callable[[], Sequence[float]]], rounds: int) -> dict[str, Timing]:
    """Every timer's samples of `rounds` interleaved rounds (`interleave`), as a Timing per label."""
    return {label: Timing.from_samples_s(values) for label, values in interleave(timers, rounds).items()}


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


def _npz(data: bytes | bytearray) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(bytes(data))) as loaded:
        return {name: loaded[name] for name in loaded.files}
