"""The host's TVM RPC tracker, the one place edgetune talks to it: started as TVM's tracker
server (`edgetune.fleet.rpc_tracker`) in its own process group, asked for its summary (the servers registered
under each key, free and busy), and asked for sessions on the boards of a device class.

Boards register with the tracker under their class name, so a device class is reached through
an `RpcEndpoint` (tracker address and key: what MetaSchedule's `RPCConfig` needs, too).
To reach *every* board of a class (not just any free one), `board_sessions` asks the tracker
for as many servers of the class as are registered and holds them all at once: each answer
names the server's address (the board's `--custom-addr`: `ssh_route.rpc_address`), so each
session is known to belong to one board. TVM's `TrackerSession.request` hides that address,
and its client stalls on every exchange (edgetune.tvm_compat.tracker_client), so
`_TrackerConnection` speaks TVM's tracker protocol (`tvm.rpc.base`) itself, for summaries too.
"""

from __future__ import annotations

import gc
import json
import socket
import struct
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tvm import rpc
from tvm.rpc import base

from edgetune.fleet.errors import FleetError
from edgetune.fleet.process import port_answers, running, spawn_detached, stop_group, wait_until
from edgetune.fleet.ssh_route import rpc_address
from edgetune.fleet.state import TrackerRecord, load_fleet_state
from edgetune.inventory.schema import Board, Fleet, Tracker

TRACKER_MODULE = "edgetune.fleet.rpc_tracker"
# In the tracker's command line, and in that of `tvm.exec.rpc_tracker`, which older state files name.
TRACKER_MARKER = "rpc_tracker"
START_TIMEOUT_S = 30.0
SESSION_TIMEOUT_S = 600  # a board ends a session of `board_sessions` older than this
REQUEST_TIMEOUT_S = 120.0  # how long `board_sessions` waits for a busy board
SUMMARY_TIMEOUT_S = 10.0  # a tracker answers a summary in well under a millisecond


@dataclass(frozen=True)
class RpcEndpoint:
    """Where the boards of a device class are reached: the tracker's address and the key they
    register under (what `RPCConfig(tracker_host=host, tracker_port=port, tracker_key=key)` needs)."""

    host: str
    port: int
    key: str

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class ClassQueue:
    free: int
    pending: int


@dataclass(frozen=True)
class ClassLoad:
    """The servers of one key as the tracker sees them now."""

    registered: int
    free: int
    busy: int  # registered but handed out
    pending: int  # requests waiting for a free server


@dataclass(frozen=True)
class TrackerSummary:
    """What the tracker knows: registered server addresses per key, and free/pending per key."""

    servers: Mapping[str, tuple[str, ...]]  # key -> addresses of registered rpc_servers
    queues: Mapping[str, ClassQueue]

    def registered(self, key: str, address: str) -> bool:
        return address in self.servers.get(key, ())

    def load(self, key: str) -> ClassLoad:
        registered = len(self.servers.get(key, ()))
        queue = self.queues.get(key, ClassQueue(0, 0))
        return ClassLoad(registered, queue.free, max(registered - queue.free, 0), queue.pending)

    @classmethod
    def from_tvm(cls, summary: Mapping) -> TrackerSummary:
        servers: dict[str, list[str]] = {}
        for info in summary.get("server_info", []):
            key = info["key"].split(":", 1)[1]  # 'server:gateway-v2' -> 'gateway-v2'
            servers.setdefault(key, []).append(str(info["addr"][0]))
        queues = {k: ClassQueue(int(v["free"]), int(v["pending"])) for k, v in summary.get("queue_info", {}).items()}
        return cls({k: tuple(sorted(v)) for k, v in servers.items()}, queues)


def tracker_alive(record: TrackerRecord | None) -> bool:
    return record is not None and running(record.pid, TRACKER_MARKER) and port_answers(record.host, record.port)


def start_tracker(tracker: Tracker, log_dir: Path) -> TrackerRecord:
    """Start the tracker on the first free port of its range and wait until it answers."""
    port = _free_port(tracker)
    argv = [
        sys.executable,
        "-m",
        TRACKER_MODULE,
        "--host",
        tracker.bind_host,
        "--port",
        str(port),
        "--port-end",
        str(port + 1),
    ]
    log = log_dir / f"tracker-{tracker.name}.log"
    proc = spawn_detached(argv, log)
    record = TrackerRecord(tracker.name, tracker.public_address, port, proc.pid)
    wait_until(lambda: port_answers(record.host, port) or proc.poll() is not None, START_TIMEOUT_S)
    if not tracker_alive(record):
        stop_group(proc.pid, TRACKER_MARKER)
        raise FleetError(f"tracker {tracker.name} did not start on {tracker.bind_host}:{port}; see {log}")
    return record


def stop_tracker(record: TrackerRecord) -> bool:
    return stop_group(record.pid, TRACKER_MARKER)


def query_tracker(record: TrackerRecord) -> TrackerSummary:
    if not port_answers(record.host, record.port):
        raise FleetError(f"tracker {record.name} at {record.address} does not answer; run `edgetune fleet up`")
    return read_summary(record.host, record.port)


def read_summary(host: str, port: int) -> TrackerSummary:
    with _TrackerConnection(host, port, SUMMARY_TIMEOUT_S) as tracker:
        return tracker.summary()


def rpc_endpoint(fleet: Fleet, device_class: str) -> RpcEndpoint:
    """The tracker address and key through which the boards of `device_class`'s tuning pool are
    measured: the tracker `fleet up` started (its recorded port), or, if edgetune did not start
    it, the inventory's tracker address and port."""
    boards = fleet.pool_of(device_class)
    if not boards:
        raise FleetError(f"no board of class '{device_class}' in {fleet.path}")
    tracker = fleet.tracker(boards[0].tracker)
    record = load_fleet_state(fleet).trackers.get(tracker.name)
    if record is None:
        return RpcEndpoint(tracker.public_address, tracker.port, device_class)
    if not tracker_alive(record):
        raise FleetError(f"tracker '{tracker.name}' is not running; run `edgetune fleet up -f {fleet.path}`")
    return RpcEndpoint(record.host, record.port, device_class)


def class_load(endpoint: RpcEndpoint) -> ClassLoad:
    """Registered, free, busy and pending servers of the endpoint's key, now."""
    return read_summary(endpoint.host, endpoint.port).load(endpoint.key)


def wait_for_servers(endpoint: RpcEndpoint, timeout_s: float) -> int:
    """Servers registered under the endpoint's key, waiting up to `timeout_s` for the first."""
    deadline = time.monotonic() + timeout_s
    while (registered := class_load(endpoint).registered) == 0 and time.monotonic() < deadline:
        time.sleep(1.0)
    return registered


@contextmanager
def board_sessions(
    endpoint: RpcEndpoint, boards: Sequence[Board], wait_s: float = REQUEST_TIMEOUT_S
) -> Iterator[tuple[dict[str, rpc.RPCSession], dict[str, str]]]:
    """(sessions by board name, failures by board name), one held session per registered board."""
    with _TrackerConnection(endpoint.host, endpoint.port, wait_s) as tracker:
        registered = set(tracker.summary().servers.get(endpoint.key, ()))
        addresses = {b.name: rpc_address(b) for b in boards}
        by_address = {addresses[b.name]: b for b in boards if addresses[b.name] in registered}
        failed = {
            b.name: f"{b.name}: not registered with the tracker under '{endpoint.key}': run `edgetune fleet up`"
            for b in boards
            if addresses[b.name] not in registered
        }
        sessions: dict[str, rpc.RPCSession] = {}
        for _ in range(len(registered)):
            if len(sessions) == len(by_address):
                break
            try:
                address, port, matchkey = tracker.request(endpoint.key)
            except TimeoutError:
                break
            board = by_address.get(address)
            if board is not None and board.name not in sessions:
                sessions[board.name] = rpc.connect(address, port, matchkey, session_timeout=SESSION_TIMEOUT_S)
        for board in by_address.values():
            if board.name not in sessions:
                failed[board.name] = (
                    f"{board.name}: busy for more than {wait_s:g} s (another job holds it); retry later"
                )
        try:
            yield sessions, failed
        finally:
            # An RPCSession has no close(): its connection ends, and the board goes back to the
            # tracker's free list, only when the object is freed. Free it now, not at some later GC.
            sessions.clear()
            gc.collect()


def request_session(endpoint: RpcEndpoint, session_timeout_s: float, tries: int = 5) -> rpc.RPCSession:
    """A session on a free board of the endpoint's class, waiting up to `session_timeout_s` for
    one, as TVM's `TrackerSession.request` opens it: a board the tracker hands out that refuses
    the connection (it has just died) costs a try, and the tracker is asked again."""
    refused: list[str] = []
    with _TrackerConnection(endpoint.host, endpoint.port, session_timeout_s) as tracker:
        for _ in range(tries):
            address, port, matchkey = tracker.request(endpoint.key)
            try:
                return rpc.connect(address, port, matchkey, session_timeout=session_timeout_s)
            except RuntimeError as err:  # TVM's connection errors
                refused.append(f"{address}:{port}: {str(err).splitlines()[0]}")
    raise FleetError(f"no board of class {endpoint.key} took a session in {tries} tries: {'; '.join(refused)}")


class _TrackerConnection:
    """TVM's tracker protocol, keeping what `TrackerSession.request` hides: which server
    (address, port, match key) the tracker handed out."""

    def __init__(self, host: str, port: int, timeout_s: float):
        self._address, self._timeout = (host, port), timeout_s
        self._sock: socket.socket | None = None

    def __enter__(self) -> _TrackerConnection:
        try:
            self._sock = socket.create_connection(self._address, timeout=self._timeout)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            magic = struct.unpack("<i", base.recvall(self._sock, 4))[0]
        except OSError as err:
            raise FleetError(
                f"tracker {self._address[0]}:{self._address[1]} does not answer ({err}): run `edgetune fleet up`"
            ) from None
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
        """One request and its answer. The request goes in one write, and the answer's parts
        are acknowledged at once: TVM's client writes a message's length and body apart, and the
        tracker answers the same way, so Nagle's algorithm and delayed ACKs would hold each
        exchange (edgetune.tvm_compat.tracker_client)."""
        data = json.dumps(message).encode("utf-8")
        self._sock.sendall(struct.pack("<i", len(data)) + data)
        self._acknowledge_at_once()
        size = struct.unpack("<i", base.recvall(self._sock, 4))[0]
        self._acknowledge_at_once()
        code, value = json.loads(base.recvall(self._sock, size))
        if code != base.TrackerCode.SUCCESS:
            raise FleetError(f"tracker refused {message[0]}: {value}")
        return value

    def _acknowledge_at_once(self) -> None:
        """Linux's TCP_QUICKACK (it lasts until the kernel leaves quick-ACK mode again: set it
        before each read); elsewhere the answer waits for the delayed ACK."""
        if hasattr(socket, "TCP_QUICKACK"):
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)


def _free_port(tracker: Tracker) -> int:
    for port in range(tracker.port, tracker.port_end + 1):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((tracker.bind_host, port))
                return port
            except OSError:
                continue
    raise FleetError(
        f"tracker {tracker.name}: no free port in {tracker.port}-{tracker.port_end} on {tracker.bind_host} "
        "(is the address configured on this host? for a simulated fleet run `edgetune sim up` first)"
    )
