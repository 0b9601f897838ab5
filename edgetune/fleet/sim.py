"""The simulated fleet: real boards on this machine, one network namespace each.

For every board marked `simulated`, `sim_up` makes a namespace with a veth into the fleet's
bridge and the board's address, runs its own OpenSSH server there (own host key, config and
authorized_keys under `<workdir>/sim/<board>/`), and caps its CPU through a cgroup holding
that sshd. An emulated board (`arch: aarch64`) also gets its own copy of a cached arm64 root
file system (fleet/rootfs.py), which its sshd enters with ChrootDirectory. Host keys made here are recorded in known_hosts (we made them, so we may trust
them); a key that exists already is never re-trusted over a different recorded one.
Everything we create is named after the fleet and marked as ours (interface alias
`edgetune:<fleet>`); `sim_down` removes exactly that. Both are idempotent; sshd PIDs are
recorded in `<workdir>/state/sim.json`. Traffic stays on the bridge and in our namespaces.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import paramiko

from edgetune.fleet import cgroups, rootfs
from edgetune.fleet.errors import HostKeyMismatch, SimError
from edgetune.fleet.parallel import GroupResult, for_each_board
from edgetune.fleet.process import running, spawn_detached, stop_group, wait_until
from edgetune.fleet.ssh import known_hosts_name, record_host_key
from edgetune.fleet.ssh_route import resolve_route
from edgetune.fleet.state import load_sim_pids, save_sim_pids, state_path
from edgetune.inventory.schema import Board, Fleet
from edgetune.inventory.workdir import Workdir

SSHD = Path("/usr/sbin/sshd")
SSHD_READY_TIMEOUT_S = 10.0
BOARD_IFNAME = "eth0"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SimBoard:
    """The host-side names and files of one simulated board (pure planning, no side effects)."""

    board: Board
    netns: str
    veth: str  # host end of the veth pair; the board end is eth0
    cgroup: str
    dir: Path
    root: Path | None  # an emulated board's root file system; None: it shares this machine's

    @property
    def sshd_config(self) -> Path:
        return self.dir / "sshd_config"

    @property
    def host_key(self) -> Path:
        return self.dir / "host_ed25519"

    @property
    def firmware_file(self) -> Path:
        """The firmware version `sim_firmware` gave the board, as this host sees the file."""
        if self.root is None:
            return self.dir / "firmware"
        return self.root / rootfs.FIRMWARE_FILE.lstrip("/")


def sim_firmware_file(fleet: Fleet, board: Board) -> Path:
    """Where a simulated board keeps its firmware version, as this host sees the file."""
    return _sim_board(fleet, board).firmware_file


def sim_firmware_file_on_board(fleet: Fleet, board: Board) -> str:
    """The same file, as the board's own commands see it."""
    sim = _sim_board(fleet, board)
    return str(sim.firmware_file) if sim.root is None else rootfs.FIRMWARE_FILE


def sim_firmware(fleet: Fleet, board_name: str, version: str, cpu_quota: float | None = None) -> None:
    """A simulated firmware update of one board: its fingerprint changes to show `version`,
    and with `cpu_quota` its CPU quota changes for everything running on it, at once."""
    check_prerequisites()
    sim = {s.board.name: s for s in plan_sim(fleet)}.get(board_name)
    if sim is None:
        names = ", ".join(s.board.name for s in plan_sim(fleet))
        raise SimError(f"'{board_name}' is not a simulated board of {fleet.path} (simulated: {names})")
    if not version.strip() or "\n" in version or len(version) > 200:
        raise SimError(f"the firmware version must be one non-empty line of at most 200 characters, got {version!r}")
    if cpu_quota is not None and not 0.01 <= cpu_quota <= 64:
        raise SimError(f"--cpu-quota is a fraction of one core between 0.01 and 64, got {cpu_quota}")
    pid = load_sim_pids(fleet).get(board_name)
    if not running(pid, str(sim.sshd_config)):
        raise SimError(f"{board_name} is not up: run `edgetune sim up -f {fleet.path}` first")
    sim.firmware_file.parent.mkdir(parents=True, exist_ok=True)
    sim.firmware_file.write_text(f"sim-firmware {version}\n")
    if cpu_quota is not None:
        cgroups.limit_quota(sim.cgroup, cpu_quota)


def plan_sim(fleet: Fleet) -> tuple[SimBoard, ...]:
    return tuple(_sim_board(fleet, board) for board in fleet.simulated_boards())


def owner_tag(fleet: Fleet) -> str:
    return f"edgetune:{fleet.name}"


def sim_up(fleet: Fleet) -> GroupResult[int]:
    """Create what is missing of the simulated fleet; per board, the PID of its sshd."""
    check_prerequisites()
    plan = plan_sim(fleet)
    if not plan:
        return GroupResult()
    _check_collisions(fleet, plan)
    roots = _emulation_roots(fleet, plan)
    _ensure_bridge(fleet)
    for key in sorted({sim.board.ssh.key for sim in plan}):
        _ensure_client_key(Path(key))
    recorded = load_sim_pids(fleet)
    by_name = {sim.board.name: sim for sim in plan}
    # one board at a time: they share known_hosts; each takes a few ms
    result = for_each_board(
        [sim.board for sim in plan],
        lambda board: _board_up(fleet, by_name[board.name], recorded.get(board.name), roots),
        workers=1,
    )
    save_sim_pids(fleet, {**recorded, **result.succeeded})
    ready = for_each_board([sim.board for sim in plan if sim.board.name in result.succeeded], _await_sshd)
    failed = {**result.failed, **ready.failed}
    for reason in failed.values():
        log.info(f"FAILED: {reason}")
    for name in ready.succeeded:
        log.info(f"{name}: simulated board up at {by_name[name].board.address} (sshd pid {result.succeeded[name]})")
    return GroupResult({name: pid for name, pid in result.succeeded.items() if name not in failed}, failed)


def sim_down(fleet: Fleet) -> GroupResult[str]:
    """Stop every process in the fleet's namespaces, delete the namespaces, cgroups and bridge."""
    check_prerequisites()
    plan = plan_sim(fleet)
    recorded = load_sim_pids(fleet)
    by_name = {sim.board.name: sim for sim in plan}
    result = for_each_board(
        [sim.board for sim in plan], lambda board: _board_down(fleet, by_name[board.name], recorded.get(board.name))
    )
    for name, what in result.succeeded.items():
        log.info(f"{name}: {what}")
    for reason in result.failed.values():
        log.info(f"FAILED: {reason}")
    if fleet.sim is not None and _link_owner(fleet.sim.bridge) == owner_tag(fleet):
        _ip("link", "del", fleet.sim.bridge)
        log.info(f"bridge {fleet.sim.bridge} removed")
    if result.ok:
        state_path(fleet, "sim").unlink(missing_ok=True)
    else:
        save_sim_pids(fleet, {name: recorded[name] for name in result.failed if name in recorded})
    return result


def check_prerequisites() -> None:
    """Raise SimError saying how to proceed unless this machine can host simulated boards."""
    if os.geteuid() != 0:
        raise SimError("the simulated fleet needs root (network namespaces, cgroups): run edgetune as root")
    missing = [tool for tool in ("ip", "ssh-keygen") if shutil.which(tool) is None]
    if missing or not SSHD.exists():
        raise SimError(
            f"missing {', '.join(missing + ([] if SSHD.exists() else [str(SSHD)]))}: "
            "install them with `apt-get install -y openssh-server iproute2`"
        )
    if not cgroups.available():
        raise SimError(
            "no cgroup cpu controller under /sys/fs/cgroup: CPU quotas of simulated boards cannot be applied"
        )


def _sim_board(fleet: Fleet, board: Board) -> SimBoard:
    digest = hashlib.sha1(f"{fleet.name}/{board.name}".encode()).hexdigest()
    return SimBoard(
        board=board,
        netns=f"edgetune-{fleet.name}-{board.name}",
        veth=f"et{digest[:12]}",  # interface names are limited to 15 characters
        cgroup=f"edgetune-{fleet.name}-{board.name}",
        dir=Workdir(fleet.workdir).sim_board(board.name),
        root=rootfs.board_root(fleet.sim.cache, fleet.name, board.name) if board.emulated else None,
    )


def _emulation_roots(fleet: Fleet, plan: tuple[SimBoard, ...]) -> dict[str, Path | SimError]:
    """Per emulated architecture in the fleet, the cached root file system (built if missing),
    or why this host cannot have it: only that architecture's boards fail then."""
    roots: dict[str, Path | SimError] = {}
    for arch in sorted({sim.board.simulated.arch for sim in plan if sim.root is not None}):
        try:
            rootfs.check_emulation(arch)
            rootfs.check_chroot_path(rootfs.boards_dir(fleet.sim.cache))
            roots[arch] = rootfs.cached_root(fleet.sim.cache, arch)
        except SimError as err:
            roots[arch] = err
    return roots


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SimError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc


def _link_owner(ifname: str) -> str | None:
    """The alias of a host interface ('' if it has none), None if there is no such interface."""
    path = Path("/sys/class/net") / ifname
    if not path.exists():
        return None
    try:
        return (path / "ifalias").read_text().strip()
    except FileNotFoundError:
        return ""
    except OSError:  # ENODEV: the kernel is still removing it (a veth right after `ip netns del`)
        return None


def _check_collisions(fleet: Fleet, plan: tuple[SimBoard, ...]) -> None:
    """Refuse to use a bridge or addresses that belong to something on this host not made by us."""
    tag = owner_tag(fleet)
    bridge_owner = _link_owner(fleet.sim.bridge)
    if bridge_owner not in (None, tag):
        raise SimError(
            f"interface {fleet.sim.bridge} exists and was not made by edgetune for fleet '{fleet.name}'; "
            "choose another sim.bridge in the inventory"
        )
    network = ipaddress.IPv4Interface(fleet.sim.host_address).network
    ours = {fleet.sim.bridge, *(sim.veth for sim in plan)}
    for link in json.loads(_ip("-j", "addr", "show").stdout):
        if link["ifname"] in ours and _link_owner(link["ifname"]) == tag:
            continue
        for addr in link.get("addr_info", []):
            if addr.get("family") != "inet":
                continue
            existing = ipaddress.IPv4Interface(f"{addr['local']}/{addr['prefixlen']}")
            if existing.network.overlaps(network):
                raise SimError(
                    f"{link['ifname']} already has {existing}, which collides with the simulated network {network} "
                    f"(sim.host_address in {fleet.path}); choose a free subnet"
                )


def _ensure_bridge(fleet: Fleet) -> None:
    bridge, tag = fleet.sim.bridge, owner_tag(fleet)
    if _link_owner(bridge) is None:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("link", "set", bridge, "alias", tag)
        _ip("addr", "add", fleet.sim.host_address, "dev", bridge)
    _ip("link", "set", bridge, "up")


def _ensure_client_key(key: Path) -> None:
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        _keygen(key, "edgetune-sim-client")
    key.chmod(0o600)


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True, capture_output=True
    )


def _board_up(fleet: Fleet, sim: SimBoard, sshd_pid: int | None, roots: dict[str, Path | SimError]) -> int:
    tarball = roots.get(sim.board.simulated.arch)
    if isinstance(tarball, SimError):
        raise SimError(f"{sim.board.name}: {tarball}")
    _ensure_netns(fleet, sim)
    if sim.root is not None:
        rootfs.ensure_board_root(tarball, sim.root)
    _ensure_sshd_files(sim)
    if not running(sshd_pid, str(sim.sshd_config)):
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        sshd_pid = spawn_detached(_sshd_argv(sim), sim.dir / "sshd.log").pid
    cgroups.apply_quota(sim.cgroup, sim.board.simulated.cpu_quota, sshd_pid)
    return sshd_pid


def _sshd_argv(sim: SimBoard) -> list[str]:
    """The board's sshd, in its network namespace. The bash that runs each command sshd is given
    reads the login user's ~/.bashrc first (Debian builds bash so); the host's (a developer's
    pyenv or conda set-up: about 100 ms and a hundred processes a command on these machines) is
    not the board's, so a board that shares the host's files sees an empty one, bound over it in
    the mount table `ip netns exec` gives the namespace alone."""
    sshd = [str(SSHD), "-D", "-e", "-f", str(sim.sshd_config)]
    rc = _host_bashrc(sim.board.ssh.user) if sim.root is None else None
    if rc is None:
        return ["ip", "netns", "exec", sim.netns, *sshd]
    hide_then_run = 'mount --bind /dev/null "$1" && shift && exec "$@"'
    return ["ip", "netns", "exec", sim.netns, "sh", "-c", hide_then_run, "sh", str(rc), *sshd]


def _host_bashrc(user: str | None) -> Path | None:
    """The ~/.bashrc on this host of the user a board's commands run as (None: the one running
    edgetune, as OpenSSH's default); None where there is none (or no such user: sshd refuses the
    login and says so)."""
    try:
        home = Path((pwd.getpwnam(user) if user else pwd.getpwuid(os.getuid())).pw_dir)
    except KeyError:
        return None
    rc = home / ".bashrc"
    return rc if rc.is_file() else None


def _ensure_netns(fleet: Fleet, sim: SimBoard) -> None:
    board, prefix = sim.board, ipaddress.IPv4Interface(fleet.sim.host_address).network.prefixlen
    if not _netns_exists(sim):
        _ip("netns", "add", sim.netns)
    if _ip("-n", sim.netns, "link", "show", BOARD_IFNAME, check=False).returncode != 0:
        if _link_owner(sim.veth) is not None:
            _ip("link", "del", sim.veth)
        _ip("link", "add", sim.veth, "type", "veth", "peer", "name", BOARD_IFNAME, "netns", sim.netns)
        _ip("link", "set", sim.veth, "alias", owner_tag(fleet))
        _ip("-n", sim.netns, "addr", "add", f"{board.address}/{prefix}", "dev", BOARD_IFNAME)
    _ip("link", "set", sim.veth, "master", fleet.sim.bridge, "up")
    _ip("-n", sim.netns, "link", "set", BOARD_IFNAME, "up")
    _ip("-n", sim.netns, "link", "set", "lo", "up")


def _ensure_sshd_files(sim: SimBoard) -> None:
    board = sim.board
    sim.dir.mkdir(parents=True, exist_ok=True)
    if not sim.host_key.exists():
        _keygen(sim.host_key, f"edgetune-sim-{board.name}")
        _trust_new_host_key(board, paramiko.PKey.from_path(sim.host_key))
    else:
        _trust_existing_host_key(board, paramiko.PKey.from_path(sim.host_key))
    (sim.dir / "authorized_keys").write_text(Path(f"{board.ssh.key}.pub").read_text())
    sim.sshd_config.write_text(
        sshd_config(resolve_route(board).target.port, board.address, sim.host_key, sim.dir, chroot=sim.root)
    )


def sshd_config(port: int, listen_address: str, host_key: Path, directory: Path, chroot: Path | None = None) -> str:
    """The configuration of a simulated machine's own sshd: key logins only, its host key, PID
    file and authorized_keys in `directory`, SFTP served in-process (so it works chrooted too)."""
    return (
        f"Port {port}\n"
        f"ListenAddress {listen_address}\n"
        f"HostKey {host_key}\n"
        f"PidFile {directory / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {directory / 'authorized_keys'}\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "PermitRootLogin prohibit-password\n"
        "StrictModes no\n"
        "Subsystem sftp internal-sftp\n" + (f"ChrootDirectory {chroot}\n" if chroot is not None else "")
    )


def _trust_new_host_key(board: Board, key: paramiko.PKey) -> None:
    """We just made this key: it replaces whatever known_hosts said about the board's address."""
    path = Path(board.ssh.known_hosts)
    known = paramiko.HostKeys(str(path)) if path.exists() else paramiko.HostKeys()
    name = known_hosts_name(board)
    if name in known:
        del known[name]
        known.save(str(path))
    record_host_key(board, key)


def _trust_existing_host_key(board: Board, key: paramiko.PKey) -> None:
    try:
        record_host_key(board, key)
    except HostKeyMismatch as err:
        log.warning("%s (left as is: SSH to this board will be refused until it is resolved)", err)


def _await_sshd(board: Board) -> None:
    port = resolve_route(board).target.port
    if not wait_until(lambda: _ssh_banner(board.address, port), SSHD_READY_TIMEOUT_S):
        raise SimError(
            f"{board.name}: sshd did not answer on {board.address}:{port} "
            f"within {SSHD_READY_TIMEOUT_S:g} s; see its sshd.log"
        )


def _ssh_banner(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1.0) as sock:
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _board_down(fleet: Fleet, sim: SimBoard, sshd_pid: int | None) -> str:
    removed = []
    if stop_group(sshd_pid, str(sim.sshd_config)):
        removed.append(f"sshd (pid {sshd_pid})")
    namespaced = _ip("netns", "pids", sim.netns, check=False).stdout.split() if _netns_exists(sim) else []
    leftovers = {int(pid) for pid in namespaced} | set(cgroups.member_pids(sim.cgroup))
    for pid in leftovers:
        _kill(pid)
    if leftovers:
        removed.append(f"{len(leftovers)} processes")
    if _netns_exists(sim):
        _ip("netns", "del", sim.netns)
        removed.append(f"namespace {sim.netns}")
    if _link_owner(sim.veth) == owner_tag(fleet):
        _ip("link", "del", sim.veth, check=False)  # usually already gone with the namespace
    if cgroups.remove(sim.cgroup):
        removed.append(f"cgroup {sim.cgroup}")
    if sim.root is not None and rootfs.remove_board_root(sim.root):
        removed.append(f"root file system {sim.root}")
    sim.firmware_file.unlink(missing_ok=True)
    return "removed " + ", ".join(removed) if removed else "nothing to remove"


def _netns_exists(sim: SimBoard) -> bool:
    return (Path("/run/netns") / sim.netns).exists()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
