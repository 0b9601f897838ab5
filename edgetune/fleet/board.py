"""What the host does on one board over SSH: probe it, preflight it, start and stop its
TVM rpc_server (board_rpc_server.py, uploaded to the board's workdir and run detached in its
own session so its group can be stopped).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from importlib import resources

from edgetune.fleet.errors import BoardNotReady
from edgetune.fleet.ssh import BoardSession
from edgetune.fleet.state import TrackerRecord
from edgetune.fleet.sim import sim_firmware_file_on_board
from edgetune.inventory.schema import Board, Fleet

RPC_SERVER_SCRIPT = "edgetune-rpc-server.py"  # board_rpc_server.py, as the board's copy is named
# What a recorded rpc_server's command line holds: this script, or TVM's module, which boards
# ran before it (so `fleet up` and `fleet down` still recognise those).
_RPC_SERVER_COMMAND = rf"{RPC_SERVER_SCRIPT}|tvm\.exec\.rpc_server"
RPC_SERVER_PORT = 9090
RPC_SERVER_LOG = "rpc_server.log"
MIN_FREE_MB = 256
STOP_GRACE_TENTHS = 30  # SIGTERM, then SIGKILL after 3 s

# Prints the board's facts as JSON. With IMPORT=1 it imports the TVM runtime (the preflight
# check, seconds on a slow board); otherwise the installed package's version is enough.
_PROBE = """\
import json, platform, shutil, sys

def tvm_version():
    if sys.argv[1] == "0":
        try:
            from importlib.metadata import version
            return version("apache-tvm")
        except Exception:
            pass  # built from source: no package metadata
    import tvm, tvm.runtime
    return tvm.__version__

facts = {"python": platform.python_version(), "free_mb": shutil.disk_usage(".").free // 2**20}
try:
    facts["tvm"] = tvm_version()
except Exception as err:
    facts["tvm_error"] = f"{type(err).__name__}: {err}"
print(json.dumps(facts))
"""


@dataclass(frozen=True)
class BoardFacts:
    """What a board reports about itself."""

    python_version: str
    tvm_version: str | None
    tvm_error: str | None
    free_mb: int
    firmware: str


def firmware_command(fleet: Fleet, board: Board) -> str:
    """The shell command whose output is the board's firmware fingerprint: its profile's; a
    simulated board adds the firmware version `edgetune sim firmware` gave it."""
    command = fleet.device_class(board.device_class).profile.firmware_command
    if board.simulated is None:
        return command
    return f"{command}; cat {shlex.quote(sim_firmware_file_on_board(fleet, board))} 2>/dev/null || true"


def read_firmware(session: BoardSession, fleet: Fleet) -> str:
    """The board's firmware fingerprint, read over `session`."""
    return session.run(firmware_command(fleet, session.board), check=False).stdout.strip()


def probe(session: BoardSession, fleet: Fleet, import_runtime: bool) -> BoardFacts:
    """The board's Python, TVM, free disk in its workdir, and firmware fingerprint.
    `import_runtime` proves the TVM runtime imports (preflight) instead of reading its version."""
    board = session.board
    workdir = shlex.quote(board.workdir)
    script = f"{shlex.quote(board.python)} -c {shlex.quote(_PROBE)} {int(import_runtime)}"
    command = f"mkdir -p {workdir} && cd {workdir} && {script}"
    facts = json.loads(session.run(command).stdout.strip().splitlines()[-1])
    return BoardFacts(facts["python"], facts.get("tvm"), facts.get("tvm_error"), int(facts["free_mb"]), read_firmware(session, fleet))


def check_ready(board: Board, facts: BoardFacts, host_tvm: str) -> None:
    """Raise BoardNotReady unless the board can run what this host builds."""
    if facts.tvm_version is None:
        raise BoardNotReady(f"{board.name}: {board.python} cannot import the TVM runtime: {facts.tvm_error}")
    if facts.tvm_version != host_tvm:
        raise BoardNotReady(
            f"{board.name}: board runs TVM {facts.tvm_version}, this host runs TVM {host_tvm}; the Relax VM "
            "refuses executables built by another TVM version, so install the same TVM build on the board"
        )
    if facts.free_mb < MIN_FREE_MB:
        raise BoardNotReady(
            f"{board.name}: only {facts.free_mb} MB free in {board.workdir}; at least {MIN_FREE_MB} MB are needed"
        )


def _is_server(pid: int) -> str:
    """A shell test: is `pid` still our rpc_server (not a reused PID)?"""
    return f"tr '\\0' ' ' </proc/{pid}/cmdline 2>/dev/null | grep -qE {shlex.quote(_RPC_SERVER_COMMAND)}"


def server_running(session: BoardSession, pid: int) -> bool:
    return session.run(_is_server(pid), check=False).exit_status == 0


def start_server(session: BoardSession, tracker: TrackerRecord, key: str, threads: int) -> int:
    """Upload board_rpc_server.py, start it detached (`setsid nohup ... &`) and return its PID
    (= its group)."""
    board = session.board
    script = f"{board.workdir}/{RPC_SERVER_SCRIPT}"
    session.put_file(script, resources.files("edgetune.fleet").joinpath("board_rpc_server.py").read_bytes())
    argv = [board.python, script, "--tracker", tracker.address, "--key", key,
            "--host", board.address, "--custom-addr", board.address, "--port", str(RPC_SERVER_PORT)]  # fmt: skip
    command = (
        f"cd {shlex.quote(board.workdir)}; "
        f"TVM_NUM_THREADS={threads} setsid nohup {shlex.join(argv)} >{RPC_SERVER_LOG} 2>&1 </dev/null & echo $!"
    )
    return int(session.run(command).stdout.strip())


def stop_server(session: BoardSession, pid: int) -> bool:
    """Stop the rpc_server's process group (TERM, then KILL); False if it was not running."""
    command = (
        f"{_is_server(pid)} || exit 3; kill -TERM -- -{pid}; "
        f"for i in $(seq {STOP_GRACE_TENTHS}); do {_is_server(pid)} || exit 0; sleep 0.1; done; kill -KILL -- -{pid}"
    )
    return session.run(command, check=False).exit_status != 3


def server_log_tail(session: BoardSession, lines: int = 5) -> str:
    log = f"{session.board.workdir}/{RPC_SERVER_LOG}"
    return session.run(f"tail -n {lines} {shlex.quote(log)}", check=False).stdout.strip()
