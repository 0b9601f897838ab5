"""Boards reached as operators reach them: through bastions, with an ssh config and ssh-agent.

Real OpenSSH servers in network namespaces made here (tests/support/netns_hosts.py): a bastion
`jump1` on a bridge of this machine, and behind it, on a bridge inside jump1's namespace,
boards gw-1 and gw-2 and a second bastion `jump2`, behind which board gw-3 sits on a bridge
inside jump2's namespace. This machine has no route to the inner networks (a route marks them
unreachable, so that nothing is sent elsewhere). fleet.yaml names boards by Host aliases of an
ssh config file that gives their HostName, User, Port, IdentityFile and ProxyJump.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

import paramiko
import pytest
import yaml
from support.netns_hosts import (
    add_bridge,
    add_inner_bridge,
    keygen,
    remove_bridge,
    restart_sshd,
    start_host,
    stop_host,
    stop_sshd,
)

from edgetune.cli import main
from edgetune.fleet import fleet_status, trust_board
from edgetune.fleet.errors import HostKeyMismatch, HostKeyUnknown, SshAuthFailed, SshUnreachable
from edgetune.fleet.parallel import for_each_board
from edgetune.fleet.ssh import BoardSession, fingerprint
from edgetune.inventory import load_fleet

REPO = Path(__file__).resolve().parents[2]
BOARDS = ("gw-1", "gw-2", "gw-3")

SSH_CONFIG = """\
Host jump1
    HostName {net}.2
Host jump2
    HostName {net}.130
Host gw-1
    HostName {net}.140
    ProxyJump jump1
Host gw-2
    HostName {net}.141
    ProxyJump jump1
Host gw-3
    HostName {net}.200
    ProxyJump jump1,jump2
Host gw-lost
    HostName {net}.140
    ProxyJump lost-jump
Host lost-jump
    HostName {net}.100
Host gw-closed
    HostName {net}.140
    ProxyJump root@{net}.2:2222
Host gw-noport
    HostName {net}.141
    Port 2200
    ProxyJump jump1
Host gw-stranger
    HostName {net}.141
    ProxyJump stranger@jump1
Host *
    User root
    Port 22
    IdentityFile {key}
"""

AGENT_SSH_CONFIG = """\
Host agent-gw
    HostName {net}.141
    ProxyJump agent-jump
Host agent-jump
    HostName {net}.2
"""


@dataclasses.dataclass
class Site:
    dir: Path
    net: str  # the first three numbers of every address, e.g. 10.231.12
    key: Path  # the IdentityFile of the ssh config
    agent_key: Path  # authorized everywhere, named nowhere: only an ssh-agent serves it
    config: Path
    known_hosts: Path  # every good board and its bastions trusted
    hosts: dict  # name -> NetnsHost


@pytest.fixture(scope="module")
def site(sim_slot, tmp_path_factory):
    """The bastions and boards, up for the module; all removed after it."""
    if os.geteuid() != 0 or not Path("/usr/sbin/sshd").exists():
        pytest.skip("needs root and OpenSSH's sshd (apt-get install -y openssh-server iproute2)")
    root, net, bridge = tmp_path_factory.mktemp("ssh-operators"), f"10.231.{9 + sim_slot}", f"etune-t{sim_slot}"
    keygen(root / "id_ed25519", "edgetune-test-client")
    keygen(root / "agent_key", "edgetune-test-agent")
    authorized = (root / "id_ed25519.pub").read_text() + (root / "agent_key.pub").read_text()
    (root / "ssh_config").write_text(SSH_CONFIG.format(net=net, key=root / "id_ed25519"))
    hosts, prefix = {}, f"etune-t{sim_slot}-"
    inner = f"{net}.128/25"  # both inner networks: this machine has no route there
    add_bridge(bridge, f"{net}.1", 25)
    subprocess.run(["ip", "route", "add", "unreachable", inner], check=True)
    try:
        hosts["jump1"] = start_host(
            "jump1", prefix + "jump1", f"{net}.2", 25, root / "jump1", authorized, bridge=bridge
        )
        add_inner_bridge(prefix + "jump1", "inner", f"{net}.129", 26)
        hosts["jump2"] = start_host(
            "jump2",
            prefix + "jump2",
            f"{net}.130",
            26,
            root / "jump2",
            authorized,
            netns_bridge=(prefix + "jump1", "inner"),
        )
        add_inner_bridge(prefix + "jump2", "deep", f"{net}.193", 26)
        for name, address, behind in (
            ("gw-1", 140, ("jump1", "inner")),
            ("gw-2", 141, ("jump1", "inner")),
            ("gw-3", 200, ("jump2", "deep")),
        ):
            hosts[name] = start_host(
                name,
                prefix + name,
                f"{net}.{address}",
                26,
                root / name,
                authorized,
                netns_bridge=(prefix + behind[0], behind[1]),
            )
        built = Site(
            root, net, root / "id_ed25519", root / "agent_key", root / "ssh_config", root / "known_hosts", hosts
        )
        fleet = load_fleet(write_fleet(root, built, BOARDS))
        bastions = [fingerprint(host_key(hosts[name])) for name in ("jump1", "jump2")]
        for board in BOARDS:
            trust_board(fleet, board, bastion_fingerprints=bastions)
        yield built
    finally:
        for name in ("gw-3", "gw-2", "gw-1", "jump2", "jump1"):  # the boards before the bastions whose bridges they use
            if name in hosts:
                stop_host(hosts[name])
        subprocess.run(["ip", "route", "del", "unreachable", inner], check=False)
        remove_bridge(bridge)


def write_fleet(
    directory: Path, site: Site, boards, known_hosts: Path | None = None, config: Path | None = None
) -> Path:
    """A fleet.yaml of `boards`, each named by its Host alias; no key named: the ssh config's
    IdentityFile (or an ssh-agent) provides it."""
    directory.mkdir(parents=True, exist_ok=True)
    data = {
        "version": 1,
        "name": "ssh-operators",
        "workdir": str(directory / "work"),
        "trackers": [{"name": "host", "bind_host": "127.0.0.1", "public_address": "127.0.0.1", "port": 9190}],
        "ssh": {
            "known_hosts": str(known_hosts or site.known_hosts),
            "config": str(config or site.config),
            "connect_timeout_s": 5,
        },
        "device_classes": [{"name": "gw", "profile": str(REPO / "device_profiles/x86-avx512.yaml")}],
        "boards": [
            {
                "name": name,
                "address": name,
                "device_class": "gw",
                "python": "/usr/bin/python3",
                "workdir": str(directory / "boards" / name),
            }
            for name in boards
        ],
        "models": [{"name": "mlp", "builtin": "mlp", "inputs": [{"name": "x", "shape": [1, 256]}]}],
        "tuning": {"trials_per_class": 16, "trials_per_iter": 8},
        "artifacts": {
            "dir": str(directory / "artifacts"),
            "signing_key": str(directory / "keys/signing.key"),
            "public_key": str(directory / "keys/signing.pub"),
        },
    }
    path = directory / "fleet.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def eth0_address(board) -> str:
    with BoardSession(board) as session:
        return session.run("ip -4 -o addr show dev eth0").stdout.split()[3]


def host_key(host) -> paramiko.PKey:
    return paramiko.PKey.from_path(host.host_key)


def recorded(known_hosts: Path, name: str) -> list[paramiko.PKey]:
    return list((paramiko.HostKeys(str(known_hosts)).lookup(name) or {}).values())


def test_this_machine_has_no_route_to_the_boards(site, tmp_path):
    board = load_fleet(write_fleet(tmp_path, site, ["gw-1"])).board("gw-1")
    direct = dataclasses.replace(
        board, address=f"{site.net}.140", ssh=dataclasses.replace(board.ssh, config=None, key=site.key)
    )
    with pytest.raises(SshUnreachable, match=rf"gw-1: root@{site.net}.140:22: unreachable \(No route to host\)"):
        BoardSession(direct).run("true")


def test_trust_through_bastions_records_every_hop(site, tmp_path, caplog, capsys):
    caplog.set_level(logging.INFO)
    known_hosts = tmp_path / "known_hosts"
    fleet_yaml = write_fleet(tmp_path, site, BOARDS, known_hosts=known_hosts)
    fleet = load_fleet(fleet_yaml)
    with pytest.raises(
        HostKeyUnknown, match=rf"gw-1: host key of bastion {site.net}.2 .* run `edgetune fleet trust gw-1`"
    ):
        BoardSession(fleet.board("gw-1")).run("true")

    jump1, jump2 = (fingerprint(host_key(site.hosts[name])) for name in ("jump1", "jump2"))
    assert main(["fleet", "trust", "gw-1", "-f", str(fleet_yaml)]) == 3  # a bastion never seen: not logged in to
    refused = capsys.readouterr().err
    assert f"gw-1: bastion jump1 (root@{site.net}.2:22) offers ssh-ed25519 {jump1}" in refused
    assert "nothing was offered to it" in refused and f"--bastion-fingerprint {jump1}" in refused
    assert not known_hosts.exists()
    assert main(["fleet", "trust", "gw-1", "--bastion-fingerprint", "SHA256:AAAA", "-f", str(fleet_yaml)]) == 3
    assert not known_hosts.exists()
    assert main(["fleet", "trust", "gw-1", "--bastion-fingerprint", jump1, "-f", str(fleet_yaml)]) == 0
    assert recorded(known_hosts, f"{site.net}.2") == [host_key(site.hosts["jump1"])]
    assert recorded(known_hosts, f"{site.net}.140") == [host_key(site.hosts["gw-1"])]
    shown = f"gw-1: bastion {site.net}.2: trusted ssh-ed25519 {fingerprint(host_key(site.hosts['jump1']))}; recorded in {known_hosts}"
    assert shown in caplog.text
    assert (
        main(["fleet", "trust", "gw-3", "--bastion-fingerprint", jump2.removeprefix("SHA256:"), "-f", str(fleet_yaml)])
        == 0
    )  # jump1 known already
    assert recorded(known_hosts, f"{site.net}.130") == [host_key(site.hosts["jump2"])]
    assert recorded(known_hosts, f"{site.net}.200") == [host_key(site.hosts["gw-3"])]
    assert len(known_hosts.read_text().splitlines()) == 4
    assert eth0_address(fleet.board("gw-3")) == f"{site.net}.200/26"


def test_a_command_runs_on_every_board_through_one_or_two_bastions(site, tmp_path):
    fleet = load_fleet(write_fleet(tmp_path, site, BOARDS))
    result = for_each_board(fleet.boards, eth0_address)
    assert result.ok, result.failed
    assert result.succeeded == {
        "gw-1": f"{site.net}.140/26",
        "gw-2": f"{site.net}.141/26",
        "gw-3": f"{site.net}.200/26",
    }


def test_closing_a_session_closes_every_hop(site, tmp_path):
    board = load_fleet(write_fleet(tmp_path, site, ["gw-3"])).board("gw-3")
    hops = [site.hosts[name] for name in ("jump1", "jump2", "gw-3")]
    with BoardSession(board) as session:
        session.run("true")
        assert [ssh_connections(host) for host in hops] == [1, 1, 1]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(ssh_connections(host) for host in hops):
        time.sleep(0.05)
    assert [ssh_connections(host) for host in hops] == [0, 0, 0]


def ssh_connections(host) -> int:
    """Established TCP connections to the host's sshd."""
    command = ["ip", "netns", "exec", host.netns, "ss", "-Htn", "state", "established", "( sport = :22 )"]
    return len(subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines())


@pytest.fixture
def ssh_agent(site, tmp_path, monkeypatch):
    """A real ssh-agent holding the key nothing names, as SSH_AUTH_SOCK; stopped by its PID."""
    socket_path = tmp_path / "agent.sock"
    agent = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(socket_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 5
        while not socket_path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        env = {**os.environ, "SSH_AUTH_SOCK": str(socket_path)}
        subprocess.run(["ssh-add", "-q", str(site.agent_key)], env=env, check=True, capture_output=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(socket_path))
        yield socket_path
    finally:
        agent.terminate()
        agent.wait(5)


def test_a_key_served_only_by_ssh_agent_logs_in_through_the_bastion(site, tmp_path, monkeypatch, ssh_agent):
    config = tmp_path / "agent_ssh_config"
    config.write_text(AGENT_SSH_CONFIG.format(net=site.net))
    fleet = load_fleet(write_fleet(tmp_path, site, ["agent-gw"], config=config))
    board = fleet.board("agent-gw")
    assert board.ssh.key is None
    assert eth0_address(board) == f"{site.net}.141/26"
    monkeypatch.delenv("SSH_AUTH_SOCK")
    with pytest.raises(
        SshAuthFailed, match=rf"agent-gw: via bastion agent-jump \(root@{site.net}.2:22\): no key to log in with"
    ):
        BoardSession(board).run("true")


def test_hops_that_cannot_be_passed_fail_their_boards_only(site, tmp_path, monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    fleet = load_fleet(write_fleet(tmp_path, site, ["gw-1", "gw-lost", "gw-closed", "gw-noport", "gw-stranger"]))
    status = {board.name: board for board in fleet_status(fleet)}
    assert status["gw-1"].reachable
    assert not any(status[name].reachable for name in ("gw-lost", "gw-closed", "gw-noport", "gw-stranger"))
    assert status["gw-lost"].error in (
        f"gw-lost: via bastion lost-jump (root@{site.net}.100:22): unreachable (No route to host)",
        f"gw-lost: via bastion lost-jump (root@{site.net}.100:22): no answer within 5 s (bastion down or link down?)",
    )
    assert status["gw-closed"].error == (
        f"gw-closed: via bastion root@{site.net}.2:2222: connection refused (is sshd running on the bastion?)"
    )
    assert status["gw-noport"].error == (
        f"gw-noport: via bastion jump1 (root@{site.net}.2:22): cannot reach the board at {site.net}.141:2200: "
        "connection refused (is sshd running on the board?)"
    )
    assert (
        status["gw-stranger"].error
        == f"gw-stranger: via bastion jump1 (stranger@{site.net}.2:22): authentication failed with key {site.key}"
    )


def test_a_stopped_then_reinstalled_second_bastion_fails_its_board_only(site, tmp_path):
    fleet = load_fleet(write_fleet(tmp_path, site, ["gw-1", "gw-3"]))
    jump2 = site.hosts["jump2"]
    saved = tmp_path / "jump2_host_key"
    shutil.copy(jump2.host_key, saved)
    shutil.copy(f"{jump2.host_key}.pub", f"{saved}.pub")
    try:
        stop_sshd(jump2)
        result = for_each_board(fleet.boards, eth0_address)
        assert result.succeeded == {"gw-1": f"{site.net}.140/26"}
        assert result.failed == {
            "gw-3": f"gw-3: via bastion jump1 (root@{site.net}.2:22): cannot reach the bastion at {site.net}.130:22: "
            "connection refused (is sshd running on the bastion?)"
        }
        jump2 = site.hosts["jump2"] = restart_sshd(jump2, new_host_key=True)
        result = for_each_board(fleet.boards, eth0_address)
        assert set(result.succeeded) == {"gw-1"}
        assert f"gw-3: HOST KEY CHANGED for bastion {site.net}.130: known_hosts" in result.failed["gw-3"]
        assert result.failed["gw-3"].count("SHA256:") == 2
        before = site.known_hosts.read_bytes()
        with pytest.raises(HostKeyMismatch, match=f"HOST KEY CHANGED for bastion {site.net}.130"):
            trust_board(fleet, "gw-3")
        assert site.known_hosts.read_bytes() == before  # refused, never overwritten
    finally:
        stop_sshd(jump2)
        shutil.copy(saved, jump2.host_key)
        shutil.copy(f"{saved}.pub", f"{jump2.host_key}.pub")
        site.hosts["jump2"] = restart_sshd(jump2)
    assert eth0_address(fleet.board("gw-3")) == f"{site.net}.200/26"
