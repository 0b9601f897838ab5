"""Run built libraries on every board of a device class through the fleet's TVM tracker.

Boards register with the tracker under their class name. To reach *every* board (not just any
free one), `board_sessions` asks the tracker for as many servers of the class as are
registered and holds them all at once: each answer names the server's address (the board's
`--custom-addr`), so each session is known to belong to one board. Boards are then driven one
at a time, so that boards sharing a host (the simulated fleet) do not disturb each other's
timing.

On a board: upload the `.so`, load it, run it under `relax.VirtualMachine` with the stateful
API (set_input / invoke_stateful / get_outputs, which works over RPC for tuple outputs too),
then time `invoke_stateful` with the profile's measurement settings.
"""

from __future__ import annotations

import gc
import logging
import socket
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np
import tvm
from tvm import relax, rpc
from tvm.rpc import base

from edgetune.artifact.files import sha256_file
from edgetune.artifact.manifest import Timing
from edgetune.errors import EdgetuneError, FleetError
from edgetune.fleet.parallel import GroupResult
from edgetune.fleet.ssh import BoardSession
from edgetune.fleet.status import RpcEndpoint
from edgetune.fleet.tracker import TrackerSummary
from edgetune.inventory.schema import Board, DeviceProfile, Measurement

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
    """Every library (label -> .so) run and timed on every board; per-board results as data."""
    succeeded: dict[str, dict[str, RunResult]] = {}
    with board_sessions(endpoint, boards) as (sessions, failed):
        for name, session in sessions.items():
            try:
                succeeded[name] = {
                    label: run_library(session, path, entry, args, measurement)
                    for label, path in libraries.items()
                }
            except (EdgetuneError, RuntimeError, ValueError, OSError) as err:  # TVM raises RuntimeError subclasses
                failed[name] = f"{name}: running the library failed: {err}"
                continue
            log.info("  %s: %s", name, ", ".join(f"{k} {r.timing.median_ms:.3f} ms" for k, r in succeeded[name].items()))
    return GroupResult(succeeded, failed)


def run_library(
    session: rpc.RPCSession, library: Path, entry: str, args: Sequence[np.ndarray], measurement: Measurement
) -> RunResult:
    """Upload, load, run once for the outputs, then time the library on one board."""
    remote_name = f"edgetune-{sha256_file(library)[:16]}.so"
    session.upload(str(library), target=remote_name)
    try:
        dev = session.cpu()
        vm = relax.VirtualMachine(session.load_module(remote_name), dev)
        vm.set_input(entry, *[tvm.runtime.tensor(a, dev) for a in args])
        vm.invoke_stateful(entry)
        outputs = output_dict(vm.get_outputs(entry))
        timer = vm.time_evaluator(
            "invoke_stateful",
            dev,
            number=measurement.number,
            repeat=measurement.repeat,
            min_repeat_ms=measurement.min_repeat_ms,
            cooldown_interval_ms=measurement.cooldown_ms,
            f_preproc="cache_flush_cpu_non_first_arg" if measurement.enable_cpu_cache_flush else "",
        )
        return RunResult(Timing.from_samples_s(list(timer(entry).results)), outputs)
    finally:
        session.remove(remote_name)


def firmware_fingerprint(board: Board, profile: DeviceProfile) -> str:
    """The output of the profile's firmware command on the board (over SSH)."""
    with BoardSession(board) as ssh:
        return ssh.run(profile.firmware_command, check=False).stdout.strip()


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
