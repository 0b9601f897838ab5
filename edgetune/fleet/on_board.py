"""What the host does on one board over SSH: probe it, preflight it, start and stop its
TVM rpc_server (board_rpc_server.py, uploaded to the board's workdir and run detached in its
own session so its group can be stopped).

A board needs only what `board_requirements` names (Python >= 3.10, the TVM runtime, numpy,
cryptography, and what TVM's rpc_server imports): the preflight names what is missing and the
command that installs it.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata, resources
from typing import Any

import tvm
from tvm.target.codegen import llvm_get_cpu_features

from edgetune.compiler.tir.common import HALF_WIDTH_DATAPATH_CPUS
from edgetune.fleet.board_rpc_server import SERVING
from edgetune.fleet.errors import BoardNotReady
from edgetune.fleet.sim import sim_firmware_file_on_board
from edgetune.fleet.ssh import BoardSession, tail
from edgetune.fleet.ssh_route import network_address
from edgetune.fleet.state import TrackerRecord, TunnelRecord
from edgetune.inventory.schema import Board, Fleet

RPC_SERVER_SCRIPT = "edgetune-rpc-server.py"  # board_rpc_server.py, as the board's copy is named
# What a recorded rpc_server's command line holds: this script, or TVM's module, which boards
# ran before it (so `fleet up` and `fleet down` still recognise those).
_RPC_SERVER_COMMAND = rf"{RPC_SERVER_SCRIPT}|tvm\.exec\.rpc_server"
RPC_SERVER_PORT = 9090
RPC_SERVER_PORT_END = 9200
RPC_SERVER_LOG = "rpc_server.log"
RPC_SERVER_PID = "rpc_server.pid"
MIN_FREE_MB = 256
MIN_PYTHON = (3, 10)
# The modules the agent and TVM's rpc_server import beside TVM, and the distribution of each.
BOARD_MODULES = {"numpy": "numpy", "cryptography": "cryptography", "psutil": "psutil", "cloudpickle": "cloudpickle"}
# x86 instruction sets a kernel may use, as LLVM names them; /proc/cpuinfo's flags name the same
# without '.', '_' and '-' (sse4.1 / sse4_1, avx512vnni / avx512_vnni, amx-int8 / amx_int8).
X86_INSTRUCTION_SETS = frozenset(
    {
        "ssse3",
        "sse4.1",
        "sse4.2",
        "popcnt",
        "movbe",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "bmi2",
        "avx512f",
        "avx512bw",
        "avx512cd",
        "avx512dq",
        "avx512vl",
        "avx512vnni",
        "avx512bf16",
        "avx512fp16",
        "avx512ifma",
        "avx512vbmi",
        "avx512vbmi2",
        "avx512bitalg",
        "avx512vpopcntdq",
        "avxvnni",
        "amx-tile",
        "amx-int8",
        "amx-bf16",
    }
)
# x86 CPUs whose AVX-512 units are 256 bits wide, by /proc/cpuinfo's vendor_id and cpu family
# (with the avx512f flag: family 25's Zen 3 has none): what to call them, and LLVM's name.
HALF_WIDTH_AVX512_CPUS = {("AuthenticAMD", "25"): ("AMD Zen 4", "znver4")}
STOP_GRACE_TENTHS = 30  # SIGTERM, then SIGKILL after 3 s
START_WAIT_S = 30.0  # the most `start_server` waits for the rpc_server to serve
_EXITED = 4  # the start command's status when the rpc_server exited as it started

# Prints the board's facts as JSON: Python, the installed TVM's version (imported only where no
# package metadata names it: a build from source), free space; for the preflight (argument 1)
# also the modules a board needs that are missing and the CPU. TVM is not imported otherwise:
# that takes seconds on a small board, and the rpc_server imports it (`start_server` waits for it).
_PROBE = """\
import importlib.util, json, platform, shutil, sys

def tvm_version():
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
if sys.argv[1] == "1":
    facts["missing"] = [name for name in sys.argv[2:] if importlib.util.find_spec(name) is None]
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                key = {"flags": "cpu_flags", "vendor_id": "cpu_vendor", "cpu family": "cpu_family"}.get(key.strip())
                if key and key not in facts:
                    facts[key] = value.split() if key == "cpu_flags" else value.strip()
    except OSError:
        pass
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
    missing: tuple[str, ...] = ()  # of BOARD_MODULES (known only after a preflight probe)
    cpu_flags: tuple[str, ...] = ()  # an x86 board's /proc/cpuinfo flags (after a preflight probe)
    cpu_vendor: str = ""  # an x86 board's /proc/cpuinfo vendor_id and cpu family (after a preflight probe)
    cpu_family: str = ""


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


def probe(session: BoardSession, fleet: Fleet, preflight: bool) -> BoardFacts:
    """The board's Python, TVM, free disk in its workdir, and firmware fingerprint; for the
    `preflight` also the modules it lacks and its CPU."""
    board = session.board
    workdir = shlex.quote(board.workdir)
    script = shlex.join([board.python, "-I", "-c", _PROBE, str(int(preflight)), *BOARD_MODULES])
    command = f"mkdir -p {workdir} && cd {workdir} && {script}"
    facts = json.loads(session.run(command).stdout.strip().splitlines()[-1])
    return BoardFacts(
        facts["python"],
        facts.get("tvm"),
        facts.get("tvm_error"),
        int(facts["free_mb"]),
        read_firmware(session, fleet),
        tuple(facts.get("missing", ())),
        tuple(facts.get("cpu_flags", ())),
        facts.get("cpu_vendor", ""),
        facts.get("cpu_family", ""),
    )


def board_requirements() -> dict[str, tuple[str, ...]]:
    """What a board's Python needs, pinned as this edgetune asks for it: the distribution's
    dependencies without extras (pyproject.toml), by distribution name: one requirement, or one
    per Python version where the pins differ (with the environment marker pip evaluates on the
    board)."""
    found: dict[str, tuple[str, ...]] = {}
    for requirement in metadata.requires("edgetune") or ():
        if "extra ==" not in requirement:
            name = re.split(r"[=<>!~ ;\[]", requirement, maxsplit=1)[0].lower()
            found[name] = (*found.get(name, ()), requirement.strip())
    return found


def install_command(python: str, distributions: list[str]) -> str:
    """The command that installs `distributions` (all a board needs if empty) into `python`."""
    pins = board_requirements()
    return shlex.join([python, "-m", "pip", "install", *(pin for d in (distributions or pins) for pin in pins[d])])


def missing_instruction_sets(target: Mapping[str, Any], cpu_flags: tuple[str, ...]) -> list[str]:
    """The x86 instruction sets code built for `target` may use that a CPU with `cpu_flags` lacks
    (none when the board shows no x86 flags: another architecture)."""
    if not cpu_flags:
        return []
    has = {_isa_name(flag) for flag in cpu_flags}
    needed = X86_INSTRUCTION_SETS.intersection(llvm_get_cpu_features(tvm.target.Target(dict(target))))
    return sorted(name for name in needed if _isa_name(name) not in has)


def datapath_advice(board: Board, target: Mapping[str, Any], facts: BoardFacts) -> str | None:
    """Why a board's class profile builds for it less well than one naming its CPU would, where
    the board's CPU runs AVX-512 on half-width units that the target's CPU does not (None: no
    such mismatch known). Code built either way is correct; only its speed differs."""
    cpu = HALF_WIDTH_AVX512_CPUS.get((facts.cpu_vendor, facts.cpu_family))
    mcpu = str(target.get("mcpu", ""))
    if cpu is None or "avx512f" not in facts.cpu_flags or mcpu in HALF_WIDTH_DATAPATH_CPUS:
        return None
    if "avx512f" not in llvm_get_cpu_features(tvm.target.Target(dict(target))):
        return None
    name, llvm_cpu = cpu
    return (
        f"{board.name}: its CPU is an {name} ({facts.cpu_vendor} family {facts.cpu_family}), whose AVX-512 units "
        f"compute a 512-bit operation as two 256-bit ones; its class {board.device_class} targets "
        f"{mcpu or 'a CPU'} with full-width units, so some convolutions are built padded to 512-bit vectors that "
        f"are slower on this board; a profile with mcpu {llvm_cpu} (device_profiles/x86-zen4.yaml) builds for it"
    )


def _isa_name(name: str) -> str:
    return re.sub(r"[._-]", "", name.lower())


def check_ready(board: Board, facts: BoardFacts, host_tvm: str, target: Mapping[str, Any]) -> None:
    """Raise BoardNotReady unless the board can run the agent and what this host builds for
    `target` (its class's)."""
    if tuple(int(part) for part in facts.python_version.split(".")[:2]) < MIN_PYTHON:
        raise BoardNotReady(
            f"{board.name}: {board.python} is Python {facts.python_version}; a board needs Python "
            f"{'.'.join(map(str, MIN_PYTHON))} or newer (name another in the board's `python` field)"
        )
    if facts.missing:
        raise BoardNotReady(
            f"{board.name}: {board.python} lacks {', '.join(facts.missing)}, which a board needs; install with: "
            f"{install_command(board.python, [BOARD_MODULES[name] for name in facts.missing])}"
        )
    if facts.tvm_version is None:
        raise BoardNotReady(
            f"{board.name}: {board.python} cannot import the TVM runtime: {facts.tvm_error}; install it with: "
            f"{install_command(board.python, ['apache-tvm', 'apache-tvm-ffi'])}"
        )
    if facts.tvm_version != host_tvm:
        raise BoardNotReady(
            f"{board.name}: board runs TVM {facts.tvm_version}, this host runs TVM {host_tvm}; the Relax VM "
            f"refuses executables built by another TVM version; install this host's: "
            f"{install_command(board.python, ['apache-tvm', 'apache-tvm-ffi'])}"
        )
    lacking = missing_instruction_sets(target, facts.cpu_flags)
    if lacking:
        raise BoardNotReady(
            f"{board.name}: its class {board.device_class} targets {target.get('mcpu', 'a CPU')} ({json.dumps(dict(target))}), "
            f"whose code uses {', '.join(lacking)}, which this board's CPU lacks (its kernels would die of SIGILL); "
            "give the board a class whose profile names its CPU"
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


@dataclass(frozen=True)
class ServerPlace:
    """Where a board's rpc_server listens and how it reaches the tracker."""

    tracker: str  # HOST:PORT, as the board reaches the tracker
    listen: str  # the board's address it listens on
    custom_addr: str  # the address the tracker lists it under
    port: int = RPC_SERVER_PORT
    port_end: int = RPC_SERVER_PORT_END  # one past the last port to try


def direct_place(board: Board, tracker: TrackerRecord) -> ServerPlace:
    """The direct transport: the server listens on the board's own address (only while the
    fleet is up) and reaches the tracker by its address."""
    address = network_address(board)
    return ServerPlace(tracker.address, address, address)


def tunnelled_place(tunnel: TunnelRecord) -> ServerPlace:
    """The SSH transport: the server listens on the board's loopback only and reaches the
    tracker through the forward of its SSH connection (fleet/tunnel.py)."""
    return ServerPlace(
        f"127.0.0.1:{tunnel.tracker_port}", "127.0.0.1", tunnel.address, tunnel.rpc_port, tunnel.rpc_port + 1
    )


def free_loopback_port(session: BoardSession) -> int:
    """The first port of RPC_SERVER_PORT.. free on the board's loopback."""
    script = (
        f"import socket\nfor port in range({RPC_SERVER_PORT}, {RPC_SERVER_PORT_END}):\n"
        "    with socket.socket() as s:\n        try:\n            s.bind(('127.0.0.1', port))\n"
        "        except OSError:\n            continue\n    print(port)\n    break\n"
    )
    found = session.run(shlex.join([session.board.python, "-I", "-c", script])).stdout.split()
    if not found:
        raise BoardNotReady(
            f"{session.board.name}: no free port in {RPC_SERVER_PORT}-{RPC_SERVER_PORT_END - 1} on its loopback"
        )
    return int(found[0])


def start_server(session: BoardSession, place: ServerPlace, key: str, threads: int, tunnelled: bool) -> int:
    """Upload board_rpc_server.py, check that it reaches the tracker, start it detached
    (`setsid nohup ... &`) and return its PID (= its group) once it serves (or after
    START_WAIT_S still importing: its registration is awaited then). A server that exits as it
    starts (a TVM that does not import) is a BoardNotReady naming the end of its log."""
    board = session.board
    script = f"{board.workdir}/{RPC_SERVER_SCRIPT}"
    session.put_file(script, resources.files("edgetune.fleet").joinpath("board_rpc_server.py").read_bytes())
    argv = [
        board.python,
        script,
        "--tracker",
        place.tracker,
        "--key",
        key,
        "--host",
        place.listen,
        "--custom-addr",
        place.custom_addr,
        "--port",
        str(place.port),
        "--port-end",
        str(place.port_end),
    ]
    checked = session.run(f"cd {shlex.quote(board.workdir)}; {shlex.join([*argv, '--check-only'])}", check=False)
    if checked.exit_status != 0:
        hint = "is the SSH transport's keeper running?" if tunnelled else "use `ssh: {transport: ssh}` for this board"
        raise BoardNotReady(f"{board.name}: {tail(checked.stderr, 1) or 'the rpc_server did not start'}; {hint}")
    tenths = int(10 * min(START_WAIT_S, 0.8 * board.ssh.command_timeout_s))
    command = (
        f"cd {shlex.quote(board.workdir)}; "
        f"TVM_NUM_THREADS={threads} setsid nohup {shlex.join(argv)} >{RPC_SERVER_LOG} 2>&1 </dev/null & "
        f"pid=$!; echo $pid >{RPC_SERVER_PID}; echo $pid; "
        f"for i in $(seq {tenths}); do grep -qF {shlex.quote(SERVING)} {RPC_SERVER_LOG} && exit 0; "
        f"kill -0 $pid 2>/dev/null || {{ tail -n 5 {RPC_SERVER_LOG} >&2; exit {_EXITED}; }}; sleep 0.1; done"
    )
    started = session.run(command, check=False)
    if started.exit_status == _EXITED:
        raise BoardNotReady(
            f"{board.name}: its rpc_server exited as it started; {board.workdir}/{RPC_SERVER_LOG} ends with:\n"
            f"{started.stderr.strip()}"
        )
    if started.exit_status != 0 or not started.stdout.split():
        raise BoardNotReady(f"{board.name}: the rpc_server did not start: {tail(started.stderr, 3)}")
    return int(started.stdout.split()[0])


def stop_leftover_server(session: BoardSession) -> bool:
    """Stop the rpc_server the board's pid file names, if it still runs: one a `fleet up` that
    was killed before it recorded what it started left behind."""
    pid_file = shlex.quote(f"{session.board.workdir}/{RPC_SERVER_PID}")
    found = session.run(f"cat {pid_file} 2>/dev/null", check=False).stdout.strip()
    return found.isdigit() and stop_server(session, int(found))


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
