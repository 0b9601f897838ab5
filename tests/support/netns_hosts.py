"""Machines with real OpenSSH servers in network namespaces the tests make: bastions, and the
boards behind them, for tests that reach boards the way operators do.

A host's namespace is joined to a bridge of this machine's own namespace (`bridge`), or to a
bridge living inside another host's namespace (`netns_bridge`: a bastion's inner network, to
which this machine has no route). Each host runs its own sshd (own ed25519 host key, config
and authorized_keys under its `dir`), started here as a child and stopped by its PID.

Names come from the caller and must be unique per test session (build them from the sim slot
number, tests/conftest.py `sim_slot`); interface names are at most 15 characters. Interfaces
made in this machine's namespace carry the alias `edgetune-test:<netns>`; `stop_host` stops
the host's sshd, kills what else runs in its namespace (by PID, from `ip netns pids`) and
deletes the namespace, its veth going with it. Root is needed; traffic stays on bridges and
in namespaces the tests made.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from edgetune.fleet.sim import sshd_config

SSHD = Path("/usr/sbin/sshd")
SSH_PORT = 22
HOST_IFNAME = "eth0"  # the host's end of its veth, inside its namespace
READY_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
OWNER_PREFIX = "edgetune-test:"

_sshds: dict[int, subprocess.Popen] = {}  # the sshd children started here, by PID

# Run inside the host's namespace: wait until its sshd answers with an SSH banner.
_BANNER_PROBE = """\
import socket, sys, time
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    try:
        with socket.create_connection((sys.argv[1], 22), timeout=1.0) as sock:
            if sock.recv(4) == b"SSH-":
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.02)
sys.exit(1)
"""


@dataclass(frozen=True)
class NetnsHost:
    name: str
    netns: str
    address: str
    dir: Path
    sshd_pid: int
    host_key: Path  # the private host key file; its .pub beside it


def start_host(
    name: str,
    netns: str,
    address: str,
    prefix: int,
    dir: Path,
    authorized_keys: str,
    bridge: str | None = None,
    netns_bridge: tuple[str, str] | None = None,
    gateway: str | None = None,
) -> NetnsHost:
    """The namespace (made if missing) on `bridge` or `netns_bridge` at `address/prefix`, with
    its sshd answering on port 22. A namespace that has its link already keeps it."""
    if (bridge is None) == (netns_bridge is None):
        raise ValueError("give exactly one of bridge (in this machine's namespace) or netns_bridge (inside another)")
    dir.mkdir(parents=True, exist_ok=True)
    if not _netns_exists(netns):
        _ip("netns", "add", netns)
    if _ip("-n", netns, "link", "show", HOST_IFNAME, check=False).returncode != 0:
        _add_link(netns, bridge, netns_bridge)
        _ip("-n", netns, "addr", "add", f"{address}/{prefix}", "dev", HOST_IFNAME)
    _ip("-n", netns, "link", "set", HOST_IFNAME, "up")
    _ip("-n", netns, "link", "set", "lo", "up")
    if gateway is not None:
        _ip("-n", netns, "route", "replace", "default", "via", gateway)
    host_key = dir / "host_ed25519"
    if not host_key.exists():
        keygen(host_key, f"{name}-host")
    (dir / "authorized_keys").write_text(authorized_keys)
    _write_sshd_config(dir, host_key)
    host = NetnsHost(name, netns, address, dir, sshd_pid=0, host_key=host_key)
    return _start_sshd(host)


def add_inner_bridge(netns: str, bridge: str, address: str, prefix: int) -> None:
    """A bridge inside `netns` (made if missing) holding `address/prefix`: a bastion's inner
    network, which other hosts join with `netns_bridge=(netns, bridge)`."""
    if not _netns_exists(netns):
        _ip("netns", "add", netns)
    if _ip("-n", netns, "link", "show", bridge, check=False).returncode != 0:
        _ip("-n", netns, "link", "add", bridge, "type", "bridge")
        _ip("-n", netns, "addr", "add", f"{address}/{prefix}", "dev", bridge)
    _ip("-n", netns, "link", "set", bridge, "up")


def stop_host(host: NetnsHost) -> None:
    """Stop the host's sshd and everything else in its namespace, then delete the namespace
    (its veth goes with it). Safe to call twice."""
    stop_sshd(host)
    if _netns_exists(host.netns):
        for pid in _ip("netns", "pids", host.netns).stdout.split():
            _kill(int(pid))
        _ip("netns", "del", host.netns)
    veth = veth_name(host.netns)
    if _link_alias(veth) == OWNER_PREFIX + host.netns:
        _ip("link", "del", veth, check=False)


def stop_sshd(host: NetnsHost) -> None:
    """Stop the host's sshd (its PID only): new connections are refused, the namespace stays."""
    process = _sshds.pop(host.sshd_pid, None)
    if process is None:
        return
    process.terminate()
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def restart_sshd(host: NetnsHost, new_host_key: bool = False) -> NetnsHost:
    """The host with a new sshd (and, with `new_host_key`, a newly made host key): its PID changes."""
    stop_sshd(host)
    if new_host_key:
        host.host_key.unlink()
        Path(f"{host.host_key}.pub").unlink()
        keygen(host.host_key, f"{host.name}-host")
    return _start_sshd(host)


def add_bridge(bridge: str, address: str, prefix: int) -> None:
    """A bridge in this machine's namespace holding `address/prefix`, marked as the tests'."""
    if _link_alias(bridge) is not None:
        raise RuntimeError(f"interface {bridge} exists already; it is not this test session's to use")
    _ip("link", "add", bridge, "type", "bridge")
    _ip("link", "set", bridge, "alias", OWNER_PREFIX + bridge)
    _ip("addr", "add", f"{address}/{prefix}", "dev", bridge)
    _ip("link", "set", bridge, "up")


def remove_bridge(bridge: str) -> None:
    """Delete a bridge `add_bridge` made (and nothing else). Safe to call twice."""
    if _link_alias(bridge) == OWNER_PREFIX + bridge:
        _ip("link", "del", bridge)


def keygen(path: Path, comment: str) -> None:
    """A new ed25519 key pair without passphrase: `path` and `path.pub`."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True, capture_output=True
    )


def veth_name(netns: str) -> str:
    """The outer end of a host's veth pair: unique per namespace, within 15 characters."""
    return "nh" + hashlib.sha1(netns.encode()).hexdigest()[:11]


def _add_link(netns: str, bridge: str | None, netns_bridge: tuple[str, str] | None) -> None:
    veth = veth_name(netns)
    if bridge is not None:
        _ip("link", "add", veth, "type", "veth", "peer", "name", HOST_IFNAME, "netns", netns)
        _ip("link", "set", veth, "alias", OWNER_PREFIX + netns)
        _ip("link", "set", veth, "master", bridge, "up")
        return
    other, inner_bridge = netns_bridge
    _ip("link", "add", veth, "netns", other, "type", "veth", "peer", "name", HOST_IFNAME, "netns", netns)
    _ip("-n", other, "link", "set", veth, "master", inner_bridge, "up")


def _write_sshd_config(dir: Path, host_key: Path) -> None:
    (dir / "sshd_config").write_text(sshd_config(SSH_PORT, "0.0.0.0", host_key, dir))


def _start_sshd(host: NetnsHost) -> NetnsHost:
    """Start the host's sshd as a child and wait until it answers with an SSH banner."""
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation directory
    with (host.dir / "sshd.log").open("ab") as log:
        process = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, str(SSHD), "-D", "-e", "-f", str(host.dir / "sshd_config")],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _sshds[process.pid] = process  # `ip netns exec` execs sshd: the PID is sshd's
    started = NetnsHost(host.name, host.netns, host.address, host.dir, process.pid, host.host_key)
    probe = [sys.executable, "-c", _BANNER_PROBE, host.address, str(READY_TIMEOUT_S)]
    if subprocess.run(["ip", "netns", "exec", host.netns, *probe], check=False, capture_output=True).returncode != 0:
        stop_sshd(started)
        log_tail = "\n".join((host.dir / "sshd.log").read_text(errors="replace").splitlines()[-8:])
        raise RuntimeError(
            f"{host.name}: sshd did not answer on {host.address}:{SSH_PORT} in {host.netns}:\n{log_tail}"
        )
    return started


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], check=False, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc


def _netns_exists(netns: str) -> bool:
    return (Path("/run/netns") / netns).exists()


def _link_alias(ifname: str) -> str | None:
    """The alias of an interface of this machine's namespace ('' if none), None if it does not exist."""
    path = Path("/sys/class/net") / ifname
    try:
        return (path / "ifalias").read_text().strip() if path.exists() else None
    except OSError:  # the kernel is removing it
        return None


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
