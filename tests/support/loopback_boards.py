"""A loopback TVM tracker with rpc_servers on 127.0.0.1 that a test can kill (for fault
tests, which must not harm the shared `sim_fleet`); the `loopback` fixture of tests/tune."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edgetune.fleet.tracker import TRACKER_MODULE


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_port(port: int, timeout_s: float = 120.0) -> None:  # a loaded host starts TVM slowly
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


class Loopback:
    """A tracker and rpc_servers on 127.0.0.1, each in its own process group."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = _free_port()
        self.servers: dict[str, subprocess.Popen] = {}
        self.tracker = self._spawn(
            "tracker",
            [TRACKER_MODULE, "--host", "127.0.0.1", "--port", str(self.port), "--port-end", str(self.port + 1)],
        )  # as `fleet up` starts it
        _wait_port(self.port)

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.directory / f"{name}.log", "w")
        return subprocess.Popen(
            [sys.executable, "-m", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=None if env is None else {**os.environ, **env},
        )

    def start_board(self, name: str, key: str) -> None:
        """The rpc_server `fleet up` runs on a board (board_rpc_server), on a port of its own: two
        started at once on TVM's default range both bind 9090 (SO_REUSEADDR) and the second dies
        at listen() with EADDRINUSE. With one runtime thread, as `fleet up` starts it for the
        small fleets' profiles (`runtime_threads` 1): with TVM's default of a thread per host core,
        every candidate with a parallel loop paid ~5 us to wake the second one."""
        port = _free_port()
        self.servers[name] = self._spawn(
            name,
            [
                "edgetune.fleet.board_rpc_server",
                "--tracker",
                f"127.0.0.1:{self.port}",
                "--key",
                key,
                "--host",
                "127.0.0.1",
                "--custom-addr",
                "127.0.0.1",
                "--port",
                str(port),
                "--port-end",
                str(port + 1),
            ],
            env={"TVM_NUM_THREADS": "1"},
        )

    def wait_registered(self, count: int, timeout_s: float = 60.0) -> None:
        """Wait until `count` rpc_servers are registered with the tracker; say why not."""
        from tvm import rpc

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(rpc.connect_tracker("127.0.0.1", self.port).summary()["server_info"]) >= count:
                return
            time.sleep(0.3)
        raise TimeoutError(f"fewer than {count} rpc_servers registered after {timeout_s} s\n{self.logs()}")

    def connect_tracker(self) -> socket.socket:
        """A raw connection to the tracker, past TVM's handshake (for what TVM's client cannot do)."""
        from tvm.rpc import base

        connection = socket.create_connection(("127.0.0.1", self.port))
        connection.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
        assert struct.unpack("<i", base.recvall(connection, 4))[0] == base.RPC_TRACKER_MAGIC
        return connection

    def register_dead_board(self, key: str) -> socket.socket:
        """Register with the tracker, as a free server of `key`, an address where nothing
        listens: a board that died before the tracker noticed. The entry lasts while the
        returned connection does."""
        from tvm.rpc import base

        port = _free_port()
        connection = self.connect_tracker()
        base.sendjson(connection, [base.TrackerCode.UPDATE_INFO, {"key": f"server:{key}", "addr": ("127.0.0.1", port)}])
        assert base.recvjson(connection) == base.TrackerCode.SUCCESS
        base.sendjson(connection, [base.TrackerCode.PUT, key, (port, f"{key}:dead"), "127.0.0.1"])
        assert base.recvjson(connection) == base.TrackerCode.SUCCESS
        return connection

    def logs(self) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}" for log in sorted(self.directory.glob("*.log"))
        )

    def kill_board(self, name: str) -> None:
        _kill_group(self.servers.pop(name))

    def close(self) -> None:
        for process in [*self.servers.values(), self.tracker]:
            _kill_group(process)


@contextmanager
def class_boards(directory: Path, key: str, count: int) -> Iterator[Loopback]:
    """A loopback tracker with `count` boards of the class `key` registered (`key-0`, ...),
    all stopped on leaving."""
    boards = Loopback(directory)
    try:
        for index in range(count):
            boards.start_board(f"{key}-{index}", key)
        boards.wait_registered(count)
        yield boards
    finally:
        boards.close()


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
