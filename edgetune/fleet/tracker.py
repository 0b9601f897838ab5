"""The host's TVM RPC tracker: started as TVM's own `tvm.exec.rpc_tracker` in its own process
group, and queried the way `tvm.exec.query_rpc_tracker` does (`connect_tracker().summary()`).
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from tvm import rpc

from edgetune.fleet.errors import FleetError
from edgetune.fleet.process import port_answers, running, spawn_detached, stop_group, wait_until
from edgetune.fleet.state import TrackerRecord
from edgetune.inventory.schema import Tracker

TRACKER_MODULE = "tvm.exec.rpc_tracker"
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ClassQueue:
    free: int
    pending: int


@dataclass(frozen=True)
class TrackerSummary:
    """What the tracker knows: registered server addresses per key, and free/pending per key."""

    servers: Mapping[str, tuple[str, ...]]  # key -> addresses of registered rpc_servers
    queues: Mapping[str, ClassQueue]

    def registered(self, key: str, address: str) -> bool:
        return address in self.servers.get(key, ())

    @classmethod
    def from_tvm(cls, summary: Mapping) -> "TrackerSummary":
        servers: dict[str, list[str]] = {}
        for info in summary.get("server_info", []):
            key = info["key"].split(":", 1)[1]  # 'server:gateway-v2' -> 'gateway-v2'
            servers.setdefault(key, []).append(str(info["addr"][0]))
        queues = {k: ClassQueue(int(v["free"]), int(v["pending"])) for k, v in summary.get("queue_info", {}).items()}
        return cls({k: tuple(sorted(v)) for k, v in servers.items()}, queues)


def tracker_alive(record: TrackerRecord | None) -> bool:
    return record is not None and running(record.pid, TRACKER_MODULE) and port_answers(record.host, record.port)


def start_tracker(tracker: Tracker, log_dir: Path) -> TrackerRecord:
    """Start the tracker on the first free port of its range and wait until it answers."""
    port = _free_port(tracker)
    argv = [sys.executable, "-m", TRACKER_MODULE, "--host", tracker.bind_host,
            "--port", str(port), "--port-end", str(port + 1)]  # fmt: skip
    log = log_dir / f"tracker-{tracker.name}.log"
    proc = spawn_detached(argv, log)
    record = TrackerRecord(tracker.name, tracker.public_address, port, proc.pid)
    wait_until(lambda: port_answers(record.host, port) or proc.poll() is not None, START_TIMEOUT_S)
    if not tracker_alive(record):
        stop_group(proc.pid, TRACKER_MODULE)
        raise FleetError(f"tracker {tracker.name} did not start on {tracker.bind_host}:{port}; see {log}")
    return record


def stop_tracker(record: TrackerRecord) -> bool:
    return stop_group(record.pid, TRACKER_MODULE)


def query_tracker(record: TrackerRecord) -> TrackerSummary:
    if not port_answers(record.host, record.port):
        raise FleetError(f"tracker {record.name} at {record.address} does not answer; run `edgetune fleet up`")
    session = rpc.connect_tracker(record.host, record.port)
    try:
        return TrackerSummary.from_tvm(session.summary())
    finally:
        session.close()


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
