"""The SSH transport of a board (`ssh.transport: ssh`, the default, or `auto` behind a bastion): the tracker
and RPC over the board's own SSH connection, so that nothing but sshd listens on the board's
network and neither the host nor the board needs a route to the other (bastions included).

A keeper process on the host (this module's `main`, started detached by `fleet up`,
one per board, recorded in fleet.json) holds the board's SSH connection with two forwards
(fleet/forward.py):
- the board's loopback port `tracker_port` leads to the host's tracker: the board's rpc_server
  registers there;
- this host's `address:rpc_port` (the board's own address of 127/8: `ssh_route.rpc_address`)
  leads to the board's loopback `rpc_port`, where its rpc_server listens; the server registers
  under `address` (`--custom-addr`), so whatever the tracker hands out (MetaSchedule's runner,
  the build's measurements) is reached through the forward.
When the connection drops (closed, or MISSED_PINGS pings in a row unanswered: one slow answer on
a loaded machine is no reason to cut what runs through it), the keeper makes it again (backing
off up to MAX_BACKOFF_S) and binds
the same board port, so the rpc_server's own reconnects find the tracker again; meanwhile a
connection to the forward is closed at once and a measurement in flight fails as data. The
keeper writes its state (`connecting` / `up`, the last error) to a JSON file that `fleet up`
waits on. SIGTERM (`fleet down`) cancels the forwards and closes the connection.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import paramiko

from edgetune.durable import write_atomic
from edgetune.errors import EdgetuneError, FleetError
from edgetune.fleet.forward import LocalForward, RemoteForward
from edgetune.fleet.process import running, spawn_detached, stop_group
from edgetune.fleet.ssh import BoardSession
from edgetune.fleet.ssh_route import resolve_route, rpc_address
from edgetune.fleet.state import TrackerRecord, TunnelRecord
from edgetune.inventory.schema import Board, Fleet
from edgetune.inventory.workdir import Workdir

KEEPER_MODULE = "edgetune.fleet.tunnel"
# run as `-c`, not `-m`: the package imports this module before runpy would run it as __main__
KEEPER_START = f"import sys; from {KEEPER_MODULE} import main; sys.exit(main())"
PING_PERIOD_S = 5.0  # how often the keeper asks the board's sshd for an answer
PING_TIMEOUT_S = 10.0  # no answer in this long: a missed ping
MISSED_PINGS = 3  # in a row: the connection is dead, make it again (one missed ping is a busy host or board)
MAX_BACKOFF_S = 10.0
START_MARGIN_S = 15.0  # beyond each hop's connect timeout, how long `fleet up` waits for a new keeper

log = logging.getLogger(__name__)


# -- the host's side: start, watch and stop a keeper ---------------------------------------------


def status_path(fleet: Fleet, board: Board) -> Path:
    return Workdir(fleet.workdir).state_file(f"tunnels/{board.name}")


def read_status(path: Path) -> dict:
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


def tunnel_alive(record: TunnelRecord | None) -> bool:
    return record is not None and running(record.pid, KEEPER_MODULE)


def start_tunnel(fleet: Fleet, board: Board, tracker: TrackerRecord, rpc_port: int) -> TunnelRecord:
    """Start the board's keeper, its forward on this host at the board's `rpc_address`, and wait
    until its forwards are up; FleetError with the keeper's last error otherwise."""
    status = status_path(fleet, board)
    left = read_status(status).get("pid")
    stop_group(left if isinstance(left, int) else None, KEEPER_MODULE)  # one a killed `fleet up` left unrecorded
    status.parent.mkdir(parents=True, exist_ok=True)
    address = rpc_address(board)
    argv = [
        sys.executable,
        "-c",
        KEEPER_START,
        "--fleet",
        str(fleet.path),
        "--board",
        board.name,
        "--tracker",
        tracker.address,
        "--listen",
        f"{address}:{rpc_port}",
        "--status",
        str(status),
    ]
    write_atomic(status, b"{}")
    proc = spawn_detached(argv, Workdir(fleet.workdir).logs / f"tunnel-{board.name}.log")
    deadline = time.monotonic() + len(resolve_route(board).hops) * board.ssh.connect_timeout_s + START_MARGIN_S
    while time.monotonic() < deadline and proc.poll() is None and read_status(status).get("state") != "up":
        time.sleep(0.1)
    state = read_status(status)
    if state.get("state") == "up":
        return TunnelRecord(proc.pid, address, rpc_port, int(state["tracker_port"]))
    stop_group(proc.pid, KEEPER_MODULE)
    raise FleetError(f"{board.name}: the SSH transport did not come up: {state.get('error') or 'no answer in time'}")


def stop_tunnel(record: TunnelRecord | None) -> bool:
    return record is not None and stop_group(record.pid, KEEPER_MODULE)


# -- the keeper process ----------------------------------------------------------------------------


@dataclass(frozen=True)
class KeeperSettings:
    board: Board
    tracker: tuple[str, int]  # the host's tracker
    listen: tuple[str, int]  # this host's side of the RPC forward; its port is the board's too
    status: Path


class Keeper:
    """Holds the board's SSH connection and its two forwards until `stop()`."""

    def __init__(self, settings: KeeperSettings):
        self.settings = settings
        self.stopping = threading.Event()
        self.tracker_port = 0  # the board's side of the tracker forward, once bound

    def run(self) -> int:
        try:
            local = LocalForward(self.settings.listen, self.settings.listen[1])
        except OSError as err:
            host, port = self.settings.listen
            self._report(
                "failed",
                error=f"this host's {host}:{port}, where the board's forward listens, is taken ({err}): "
                "another fleet on this host with a board at the same address?",
            )
            return 2
        backoff = 1.0
        try:
            while not self.stopping.is_set():
                if self._hold(local):
                    backoff = 1.0
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
        finally:
            local.close()
        return 0

    def stop(self, *_signal) -> None:
        self.stopping.set()

    def _hold(self, local: LocalForward) -> bool:
        """Connect, forward, and wait until the connection dies or the keeper stops; whether
        the forwards were up."""
        board = self.settings.board
        session, remote = BoardSession(board), None
        try:
            transport = session.connect().get_transport()
            remote = RemoteForward(transport, self.tracker_port, self.settings.tracker)
            self.tracker_port = remote.port
            local.use(transport)
            self._report("up")
            log.info(
                "%s: forwards up (board port %d -> tracker %s:%d)", board.name, remote.port, *self.settings.tracker
            )
            missed = 0
            while missed < MISSED_PINGS and not self.stopping.wait(PING_PERIOD_S) and transport.is_active():
                missed = 0 if _answers(transport, PING_TIMEOUT_S) else missed + 1
            if not self.stopping.is_set():
                self._report("connecting", error="the SSH connection was lost")
                log.warning("%s: the SSH connection was lost; connecting again", board.name)
            return True
        except (EdgetuneError, paramiko.SSHException, OSError, EOFError) as err:
            self._report("connecting", error=str(err))
            log.warning("%s: %s", board.name, err)
            return False
        finally:
            local.use(None)
            if remote is not None:
                remote.close()
            session.close()

    def _report(self, state: str, error: str | None = None) -> None:
        status = {
            "state": state,
            "pid": os.getpid(),
            "tracker_port": self.tracker_port,
            "error": error,
            "time": time.time(),
        }
        write_atomic(self.settings.status, json.dumps(status).encode())


def _answers(transport: paramiko.Transport, timeout_s: float) -> bool:
    """Whether the other end answers a request within `timeout_s` (paramiko's own keepalive
    expects no answer, so a connection cut without a reset would look alive for good)."""
    answered = threading.Event()

    def ask() -> None:
        try:
            transport.global_request("keepalive@openssh.com", wait=True)
            answered.set()  # an answer, success or failure, is a live connection
        except (paramiko.SSHException, OSError, EOFError):
            pass

    threading.Thread(target=ask, daemon=True).start()
    return answered.wait(timeout_s) and transport.is_active()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    from edgetune.inventory import load_fleet

    parser = argparse.ArgumentParser(prog=KEEPER_MODULE, description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleet", required=True, type=Path)
    parser.add_argument("--board", required=True)
    parser.add_argument("--tracker", required=True, type=_address, help="HOST:PORT of the host's tracker")
    parser.add_argument(
        "--listen", required=True, type=_address, help="ADDR:PORT on this host; PORT is the board's too"
    )
    parser.add_argument("--status", required=True, type=Path, help="the JSON file to report the state in")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        board = load_fleet(args.fleet).board(args.board)
    except EdgetuneError as err:
        write_atomic(args.status, json.dumps({"state": "failed", "error": str(err)}).encode())
        return 2
    keeper = Keeper(KeeperSettings(board, args.tracker, args.listen, args.status))
    signal.signal(signal.SIGTERM, keeper.stop)
    signal.signal(signal.SIGINT, keeper.stop)
    return keeper.run()
