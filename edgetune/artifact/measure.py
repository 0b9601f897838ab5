"""Run built libraries on every board of a device class through the fleet's TVM tracker, and
time the ones being compared against each other.

Boards register with the tracker under their class name. To reach *every* board (not just any
free one), `board_sessions` asks the tracker for as many servers of the class as are
registered and holds them all at once: each answer names the server's address (the board's
`--custom-addr`), so each session is known to belong to one board. Boards are then driven one
at a time, so that boards sharing a host (the simulated fleet) do not disturb each other's
timing.

On a board (`compare_on_board`): upload every library, load each under
`relax.VirtualMachine` with the stateful API (set_input / invoke_stateful / get_outputs, which
works over RPC for tuple outputs too), run each once for its outputs, then time them in
interleaved rounds (`interleave`): A B, B A, A B ... in the same session, so that whatever
drifts on the board (other load, throttling, clocks) falls on all of them alike. Each turn is
one `time_evaluator` call of `invoke_stateful`: a discarded warm-up call, then `repeat`
samples, each the mean of as many calls as fill `min_repeat_ms` (the profile's
`measurement.compare`).

No cache flush: TVM's `cache_flush_cpu_non_first_arg` flushes the call's arguments after the
first, and for `invoke_stateful` the only argument is the function name (measured: no effect);
its `cache_flush_bytes` evicts once per repeat, which over a repeat of hundreds of calls is
noise. The timing is warm-cache, steady-state latency.
"""

from __future__ import annotations

import gc
import logging
import socket
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import tvm
from tvm import relax, rpc
from tvm.rpc import base

from edgetune.artifact.files import sha256_file
from edgetune.artifact.manifest import Timing
from edgetune.errors import EdgetuneError, FleetError
from edgetune.fleet.board import read_firmware
from edgetune.fleet.parallel import GroupResult
from edgetune.fleet.ssh import BoardSession
from edgetune.fleet.status import RpcEndpoint
from edgetune.fleet.tracker import TrackerSummary
from edgetune.inventory.schema import Board, Fleet, Measurement

SESSION_TIMEOUT_S = 600  # a board ends a session older than this
REQUEST_TIMEOUT_S = 120.0  # how long to wait for a busy board

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    """One library on one board: its timing and its outputs on the given input."""

    timing: Timing
    outputs: dict[str, np.ndarray]  # "output0", "output1", ... in the function's return order


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
) -> GroupResult[dict[str, RunResult]]:
    """Every library (label -> .so) run and timed against the others on every board
    (`compare_on_board`), one board at a time; per-board results as data."""
    succeeded: dict[str, dict[str, RunResult]] = {}
    with board_sessions(endpoint, boards) as (sessions, failed):
        for name, session in sessions.items():
            try:
                succeeded[name] = compare_on_board(session, libraries, entry, args, measurement)
            except (EdgetuneError, RuntimeError, ValueError, OSError) as err:  # TVM raises RuntimeError subclasses
                failed[name] = f"{name}: running the library failed: {err}"
                continue
            log.info("  %s: %s", name, ", ".join(f"{k} {r.timing.median_ms:.3f} ms" for k, r in succeeded[name].items()))
    return GroupResult(succeeded, failed)


def compare_on_board(
    session: rpc.RPCSession,
    libraries: Mapping[str, Path],
    entry: str,
    args: Sequence[np.ndarray],
    measurement: Measurement,
) -> dict[str, RunResult]:
    """Upload and load every library, run each once for its outputs, then time them all in
    `measurement.compare.rounds` interleaved rounds; the uploads are removed afterwards."""
    remote_names = {label: f"edgetune-{sha256_file(path)[:16]}.so" for label, path in libraries.items()}
    uploaded: list[str] = []
    try:
        for label, path in libraries.items():
            if remote_names[label] not in uploaded:
                session.upload(str(path), target=remote_names[label])
                uploaded.append(remote_names[label])
        dev = session.cpu()
        tensors = [tvm.runtime.tensor(a, dev) for a in args]
        outputs, vms = {}, {}
        for label, remote_name in remote_names.items():
            vms[label] = relax.VirtualMachine(session.load_module(remote_name), dev)
            vms[label].set_input(entry, *tensors)
            vms[label].invoke_stateful(entry)
            outputs[label] = output_dict(vms[label].get_outputs(entry))
        timings = time_interleaved(vms, dev, entry, measurement)
    finally:
        for remote_name in uploaded:
            session.remove(remote_name)
    return {label: RunResult(timings[label], outputs[label]) for label in libraries}


def run_library(
    session: rpc.RPCSession, library: Path, entry: str, args: Sequence[np.ndarray], measurement: Measurement
) -> RunResult:
    """One library on one board: its outputs and `rounds` x `repeat` samples."""
    return compare_on_board(session, {"library": library}, entry, args, measurement)["library"]


def time_interleaved(
    vms: Mapping[str, relax.VirtualMachine], dev, entry: str, measurement: Measurement
) -> dict[str, Timing]:
    """Time VMs already loaded on one board, their inputs set (`vm.set_input(entry, ...)`), in
    `measurement.compare.rounds` interleaved rounds; every sample kept, per label."""
    timers = {label: _round_timer(vm, dev, entry, measurement) for label, vm in vms.items()}
    samples = interleave(timers, measurement.compare.rounds)
    return {label: Timing.from_samples_s(values) for label, values in samples.items()}


def interleave(timers: Mapping[str, Callable[[], Sequence[float]]], rounds: int) -> dict[str, tuple[float, ...]]:
    """Call every timer once per round, taking turns: in label order in even rounds, in
    reverse order in odd ones (A B, B A, A B ...), so that neither goes first every time.
    Turns follow each other without a pause (a random pause before each turn was tried and made
    throttled boards worse: README, "Measurement"). Returns all samples per label, in order."""
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


@contextmanager
def board_sessions(
    endpoint: RpcEndpoint, boards: Sequence[Board], wait_s: float = REQUEST_TIMEOUT_S
) -> Iterator[tuple[dict[str, rpc.RPCSession], dict[str, str]]]:
    """(sessions by board name, failures by board name), one held session per registered board."""
    with _TrackerConnection(endpoint.host, endpoint.port, wait_s) as tracker:
        registered = set(tracker.summary().servers.get(endpoint.key, ()))
        by_address = {b.address: b for b in boards if b.address in registered}
        failed = {
            b.name: f"{b.name}: not registered with the tracker under '{endpoint.key}': run `edgetune fleet up`"
            for b in boards
            if b.address not in registered
        }
        sessions: dict[str, rpc.RPCSession] = {}
        for _ in range(len(registered)):
            if len(sessions) == len(by_address):
                break
            try:
                address, port, matchkey = tracker.request(endpoint.key)
            except (socket.timeout, TimeoutError):
                break
            board = by_address.get(address)
            if board is not None and board.name not in sessions:
                sessions[board.name] = rpc.connect(address, port, matchkey, session_timeout=SESSION_TIMEOUT_S)
        for board in by_address.values():
            if board.name not in sessions:
                failed[board.name] = f"{board.name}: busy for more than {wait_s:g} s (another job holds it); retry later"
        try:
            yield sessions, failed
        finally:
            # An RPCSession has no close(): its connection ends, and the board goes back to the
            # tracker's free list, only when the object is freed. Free it now, not at some later GC.
            sessions.clear()
            gc.collect()


class _TrackerConnection:
    """TVM's tracker protocol, keeping what `TrackerSession.request` hides: which server
    (address, port, match key) the tracker handed out."""

    def __init__(self, host: str, port: int, timeout_s: float):
        self._address, self._timeout = (host, port), timeout_s
        self._sock: socket.socket | None = None

    def __enter__(self) -> "_TrackerConnection":
        try:
            self._sock = socket.create_connection(self._address, timeout=self._timeout)
            self._sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            magic = struct.unpack("<i", base.recvall(self._sock, 4))[0]
        except OSError as err:
            raise FleetError(f"tracker {self._address[0]}:{self._address[1]} does not answer ({err}): run `edgetune fleet up`") from None
        if magic != base.RPC_TRACKER_MAGIC:
            raise FleetError(f"{self._address[0]}:{self._address[1]} is not a TVM tracker")
        return self

    def __exit__(self, *exc) -> None:
        self._sock.close()

    def summary(self) -> TrackerSummary:
        return TrackerSummary.from_tvm(self._call([base.TrackerCode.SUMMARY]))

    def request(self, key: str) -> tuple[str, int, str]:
        """Wait (up to the timeout) for a free server of `key`: (address, port, match key)."""
        address, port, matchkey = self._call([base.TrackerCode.REQUEST, key, "", 1])
        return str(address), int(port), str(matchkey)

    def _call(self, message: list) -> object:
        base.sendjson(self._sock, message)
        code, value = base.recvjson(self._sock)
        if code != base.TrackerCode.SUCCESS:
            raise FleetError(f"tracker refused {message[0]}: {value}")
        return value
