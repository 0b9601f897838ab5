"""A site behind a bastion, end to end over the SSH transport: fleet up, tune, build, serve,
rollout, regress and rollback, with nothing of edgetune listening on a board's network.

Real OpenSSH servers in network namespaces made here (tests/support/netns_hosts.py): a bastion `jump`
on a bridge of this machine that does not forward IP, and behind it, on a bridge inside its
namespace, boards b1 and b2 whose Python is a board image (tests/support/board_image.py) and which have
no route but their own network. This machine has no route to them (a route marks their network
unreachable). fleet.yaml names the boards by Host aliases of an ssh config with ProxyJump; the
tracker and the artifact server listen on this machine's bridge address, which no board can
reach but through its SSH connection.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import paramiko
import pytest
import yaml
from support.artifact_server import RunningServer
from support.board_image import board_image
from support.deploy_support import republish
from support.netns_hosts import add_bridge, add_inner_bridge, keygen, remove_bridge, start_host, stop_host
from support.quick_profiles import quick_profiles
from support.regress_verdicts import assert_timed

from edgetune.fleet.process import running
from edgetune.fleet.ssh import BoardSession, fingerprint
from edgetune.fleet.state import load_fleet_state
from edgetune.fleet.tunnel import KEEPER_MODULE

MODEL = "mlp"
CLASS = "site-x86"
BOARDS = {"b1": 140, "b2": 141}

SSH_CONFIG = """\
Host jump
    HostName {net}.2
Host b1
    HostName {net}.140
    ProxyJump jump
Host b2
    HostName {net}.141
    ProxyJump jump
Host *
    User root
    IdentityFile {key}
"""


@dataclasses.dataclass
class Site:
    root: Path
    net: str  # the first three numbers of every address
    slot: int
    hosts: dict  # name -> NetnsHost
    fleet_yaml: Path

    def fleet(self):
        from edgetune.inventory import load_fleet

        return load_fleet(self.fleet_yaml)


def write_fleet(
    root: Path,
    net: str,
    slot: int,
    image: Path,
    boards=tuple(BOARDS),
    transport: str | None = None,
    name: str = "fleet",
) -> Path:
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    ssh = {"known_hosts": str(root / "known_hosts"), "config": str(root / "ssh_config"), "connect_timeout_s": 5}
    if transport:
        ssh["transport"] = transport
    port = 9395 + 20 * slot + (10 if transport == "direct" else 0)
    data = {
        "version": 1,
        "name": f"site-t{slot}-{name}",
        "workdir": str(directory / "work"),
        "trackers": [
            {"name": "host", "bind_host": f"{net}.1", "public_address": f"{net}.1", "port": port, "port_end": port + 4}
        ],
        "ssh": ssh,
        "device_classes": [
            {"name": CLASS, "profile": str(quick_profiles(root / "device_profiles", ("x86-64-v3",)) / "x86-64-v3.yaml")}
        ],
        "boards": [
            {
                "name": b,
                "address": b,
                "device_class": CLASS,
                "python": str(image / "bin" / "python"),
                "workdir": str(directory / "boards" / b / "var/lib/edgetune"),
            }
            for b in boards
        ],
        "models": [{"name": MODEL, "builtin": "mlp", "inputs": [{"name": "x", "shape": [1, 256], "dtype": "float32"}]}],
        "tuning": {"trials_per_class": 16, "trials_per_iter": 8, "max_trials_per_task": 8},
        "artifacts": {
            "dir": str(directory / "artifacts"),
            "signing_key": str(directory / "keys/signing.key"),
            "public_key": str(directory / "keys/signing.pub"),
        },
        "deploy": {"bind": f"{net}.1:{8590 + slot}", "url": f"https://{net}.1:{8590 + slot}"},
    }
    path = directory / "fleet.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def in_netns(netns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", netns, *argv], capture_output=True, text=True, check=check)


def connect_from(netns: str, address: str, port: int) -> str:
    """What a TCP connect from inside `netns` to address:port meets: 'open', or the error's name."""
    probe = (
        "import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()\n"
        "    print('open')\nexcept OSError as err:\n    print(type(err).__name__)\n"
    )
    return in_netns(netns, "python3", "-c", probe, address, str(port)).stdout.strip()


def listeners(netns: str) -> set[str]:
    """Every listening TCP socket in `netns`, as 'address:port'."""
    lines = in_netns(netns, "ss", "-Htln").stdout.splitlines()
    return {line.split()[3] for line in lines}


def other_processes(host) -> list[int]:
    """The processes in the host's namespace besides its sshd listener."""
    pids = subprocess.run(
        ["ip", "netns", "pids", host.netns], capture_output=True, text=True, check=True
    ).stdout.split()
    return [int(pid) for pid in pids if int(pid) != host.sshd_pid]


def keepers(fleet_yaml: Path) -> list[int]:
    """Keeper processes on this machine started for `fleet_yaml`."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if KEEPER_MODULE in cmdline and str(fleet_yaml) in cmdline:
                found.append(int(proc.name))
    return found


@pytest.fixture(scope="module")
def site(sim_slot, tmp_path_factory):
    """The bastion and two boards, trusted with `fleet trust`; nothing started."""
    from edgetune.cli import main

    image = board_image()
    root = tmp_path_factory.mktemp("bastion-site")
    net, bridge, prefix = f"10.233.{9 + sim_slot}", f"etune-s{sim_slot}", f"etune-s{sim_slot}-"
    keygen(root / "id_ed25519", "bastion-site-operator")
    (root / "ssh_config").write_text(SSH_CONFIG.format(net=net, key=root / "id_ed25519"))
    authorized = (root / "id_ed25519.pub").read_text()
    inner, hosts = f"{net}.128/25", {}
    add_bridge(bridge, f"{net}.1", 25)
    subprocess.run(["ip", "route", "add", "unreachable", inner], check=True)
    try:
        hosts["jump"] = start_host("jump", prefix + "jump", f"{net}.2", 25, root / "jump", authorized, bridge=bridge)
        in_netns(prefix + "jump", "sysctl", "-qw", "net.ipv4.ip_forward=0")
        add_inner_bridge(prefix + "jump", "inner", f"{net}.129", 26)
        for name, last in BOARDS.items():
            hosts[name] = start_host(
                name,
                prefix + name,
                f"{net}.{last}",
                26,
                root / name,
                authorized,
                netns_bridge=(prefix + "jump", "inner"),
            )
        fleet_yaml = write_fleet(root, net, sim_slot, image)
        bastion = fingerprint(paramiko.PKey.from_path(hosts["jump"].host_key))  # as read off the bastion's console
        for name in BOARDS:
            assert main(["fleet", "trust", name, "--bastion-fingerprint", bastion, "-f", str(fleet_yaml)]) == 0
        yield Site(root, net, sim_slot, hosts, fleet_yaml)
    finally:
        from edgetune.fleet import fleet_down
        from edgetune.inventory import load_fleet

        if (root / "fleet/fleet.yaml").exists() and hosts:
            fleet_down(load_fleet(root / "fleet/fleet.yaml"))
        for name in (*BOARDS, "jump"):
            if name in hosts:
                stop_host(hosts[name])
        subprocess.run(["ip", "route", "del", "unreachable", inner], check=False)
        remove_bridge(bridge)


def test_no_route_either_way(site):
    tracker_port = site.fleet().trackers[0].port
    for name in BOARDS:
        assert connect_from(site.hosts[name].netns, f"{site.net}.1", tracker_port) == "OSError"  # ENETUNREACH
    assert in_netns(site.hosts["jump"].netns, "sysctl", "-n", "net.ipv4.ip_forward").stdout.strip() == "0"


@pytest.fixture(scope="module")
def up(site):
    from edgetune.fleet import fleet_up

    return fleet_up(site.fleet())


def test_fleet_up_registers_every_board_over_its_ssh_connection(site, up):
    assert up.ok, up.failed
    records = load_fleet_state(site.fleet()).boards
    for name in BOARDS:
        record = records[name]
        assert record.tunnel is not None and running(record.tunnel.pid, KEEPER_MODULE)
        assert record.rpc_address == record.tunnel.address and record.rpc_address.startswith("127.")


def test_only_sshd_listens_on_a_boards_network(site, up):
    records = load_fleet_state(site.fleet()).boards
    for name, last in BOARDS.items():
        board_ns, port = site.hosts[name].netns, records[name].tunnel.rpc_port
        assert {listen for listen in listeners(board_ns) if not listen.startswith("127.0.0.1:")} <= {
            "0.0.0.0:22",
            "[::]:22",
            "*:22",
        }
        assert f"127.0.0.1:{port}" in listeners(board_ns)  # the rpc_server, on the loopback only
        assert connect_from(site.hosts["jump"].netns, f"{site.net}.{last}", port) == "ConnectionRefusedError"
        assert connect_from(site.hosts["jump"].netns, f"{site.net}.{last}", 9090) == "ConnectionRefusedError"


@pytest.fixture(scope="module")
def built(site, up):
    """mlp tuned (16 trials over both boards) while the bastion drops every SSH connection once,
    then built: (tuning result, build report)."""
    from edgetune.artifact.release import build_artifacts
    from edgetune.artifact_format.signing import init_keys
    from edgetune.tune.tuner import SearchSettings, TuneOptions, tune_class

    assert up.ok, up.failed
    fleet = site.fleet()
    init_keys(fleet.artifacts.signing_key, fleet.artifacts.public_key, fleet.artifacts.dir)
    dropped, done = threading.Event(), threading.Event()
    dropper = threading.Thread(
        target=drop_mid_measurement, args=(fleet, site.hosts["jump"], dropped, done), daemon=True
    )
    dropper.start()
    try:
        tuned = tune_class(fleet, CLASS, TuneOptions(search=SearchSettings(population_size=64)))
    finally:
        done.set()
        dropper.join()
    return tuned, dropped.is_set(), build_artifacts(fleet)


def drop_mid_measurement(fleet, jump, dropped: threading.Event, done: threading.Event) -> None:
    """Once a board is busy measuring, kill every SSH session process on the bastion: each
    tunnel through it breaks at once."""
    from edgetune.fleet.tracker import class_load, rpc_endpoint

    endpoint = rpc_endpoint(fleet, CLASS)
    while not done.wait(0.05):
        if class_load(endpoint).busy:
            break
    else:
        return
    for pid in other_processes(jump):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    dropped.set()


def test_tuning_survives_dropped_tunnels_and_builds_measure_on_both_boards(site, built):
    from edgetune.artifact.store import ArtifactStore
    from edgetune.fleet.tracker import query_tracker

    tuned, dropped, report = built
    assert dropped
    assert tuned.ok, tuned.error
    assert tuned.trials_run == 16
    assert report.ok, report.failures()
    manifest = ArtifactStore(site.fleet().artifacts.dir).latest(MODEL, CLASS).manifest
    assert sorted(b.board for b in manifest.boards) == sorted(BOARDS)
    state = load_fleet_state(site.fleet())
    summary = query_tracker(state.trackers["host"])
    assert all(summary.registered(CLASS, state.boards[name].rpc_address) for name in BOARDS)


def test_profile_times_the_kernels_on_each_board_behind_the_bastion(site, built):
    from edgetune.artifact.board_profile import profile_artifact

    for name in BOARDS:
        profile = profile_artifact(site.fleet(), MODEL, CLASS, board_name=name, repeat=1)
        assert profile.board == name and profile.tvm.kernels and profile.tvm.model_ms > 0


@pytest.fixture(scope="module")
def served(site, built):
    from edgetune.deploy.rollout import plan_rollout, rollout

    fleet = site.fleet()
    server = RunningServer(fleet)
    try:
        yield fleet, rollout(fleet, plan_rollout(fleet, MODEL))
    finally:
        server.stop()


def agent(fleet, board: str, verb: str, *args: str) -> dict:
    from edgetune.deploy.remote import RemoteAgent

    with BoardSession(fleet.board(board)) as session:
        return RemoteAgent(session, fleet).call(verb, *args)


def test_rollout_downloads_through_the_ssh_connection(served):
    fleet, result = served
    assert result.ok, result.records()
    assert sorted((r["board"], r["result"], r["to_version"]) for r in result.records()) == [
        ("b1", "installed", 1),
        ("b2", "installed", 1),
    ]


def test_regress_measures_each_board_behind_the_bastion(served):
    """Each board is timed against its baseline through the bastion; which way the ratio goes
    beside the other test workers is tests/regress/test_regress_fleet.py's timed tests' business."""
    from edgetune.regress.check import regress

    report = regress(served[0], models=[MODEL])
    assert sorted(v.board for v in report.verdicts) == sorted(BOARDS)
    for verdict in report.verdicts:
        assert_timed(verdict)


def test_a_second_version_then_rollback_behind_the_bastion(served):
    from edgetune.deploy.rollout import plan_rollout, rollout

    fleet, _ = served
    second = republish(fleet, MODEL, CLASS, "site")
    result = rollout(fleet, plan_rollout(fleet, MODEL))
    assert sorted((r["result"], r["to_version"]) for r in result.records()) == [("installed", second.version)] * 2
    back = agent(fleet, "b1", "rollback", "--model", MODEL)
    assert (back["result"], back["to_version"]) == ("rolled_back", 1), back
    assert agent(fleet, "b1", "status")["models"][MODEL]["version"] == 1


def test_fleet_reset_serial_lets_a_locked_out_board_take_decisions_again(site, served):
    from edgetune.agent.file_tree import FileTree
    from edgetune.agent.state import last_decision_serial, record_decision_serial
    from edgetune.cli import main
    from edgetune.fleet.agent_bundle import agent_root

    fleet, _ = served
    tree = FileTree(Path(agent_root(fleet.board("b1"))))
    record_decision_serial(tree, 4102444800001)  # a serial of 2100 it took once: it refuses every decision since
    refused = agent(fleet, "b1", "fetch", "--model", MODEL)
    assert "is not above the last seen 4102444800001" in refused["error"], refused
    assert main(["fleet", "reset-serial", "b1", "-f", str(site.fleet_yaml)]) == 0
    reset_to = last_decision_serial(tree)
    assert reset_to < 4102444800001 and abs(reset_to / 1000 - time.time()) < 60
    fetched = agent(fleet, "b1", "fetch", "--model", MODEL)
    assert "error" not in fetched and last_decision_serial(tree) > reset_to, fetched


HOSTILE_PYTHON = """\
#!/bin/sh
# root on this board: its agent's `status` answers with a version that is no version
case "$*" in
  *" status --json") echo '{{"schema": "edgetune.agent-answer", "schema_version": 1, "verb": "status", "record": {{"board": "b2", "device_class": "{cls}", "firmware": "x", "models": {{"{model}": {{"version": {{"owned": true}}, "since": null, "firmware": null, "previous": null, "highest_installed": 1, "kept": [1]}}}}}}}}'; exit 0;;
esac
exec {python} "$@"
"""


def test_a_board_answering_a_malformed_status_fails_alone_and_the_record_stays_readable(site, served, tmp_path):
    from edgetune.cli import main
    from edgetune.deploy.rollout import plan_rollout, rollout
    from edgetune.fleet import fleet_status
    from edgetune.fleet.state import load_deployed

    fleet, _ = served
    hostile = Path(fleet.board("b2").workdir) / "hostile-python"
    hostile.write_text(HOSTILE_PYTHON.format(cls=CLASS, model=MODEL, python=fleet.board("b2").python))
    hostile.chmod(0o755)
    boards = tuple(dataclasses.replace(b, python=str(hostile)) if b.name == "b2" else b for b in fleet.boards)
    lying = fleet.replace(boards=boards)
    republish(fleet, MODEL, CLASS, "hostile")
    result = rollout(lying, plan_rollout(lying, MODEL, max_failed_pct=50))
    outcomes = {r["board"]: r for r in result.records()}
    assert outcomes["b1"]["result"] == "installed", outcomes
    assert (
        outcomes["b2"]["result"] == "failed"
        and "b2: the agent's answer to `status`: record." in outcomes["b2"]["error"]
    )
    assert "models.mlp.version: must be an integer" in outcomes["b2"]["error"]
    deployed = load_deployed(fleet)  # readable, every value a version or "unknown"
    assert deployed["b1"][MODEL] == outcomes["b1"]["to_version"] and deployed["b2"][MODEL] == "unknown"
    assert [status.name for status in fleet_status(fleet)] == ["b1", "b2"]
    assert main(["fleet", "status", "--json", "-f", str(site.fleet_yaml)]) in (0, 3)


def test_a_direct_board_without_a_route_to_the_tracker_fails_fast_naming_the_cause(site, served):
    from edgetune.fleet import fleet_down, fleet_up
    from edgetune.fleet.lifecycle import REGISTER_TIMEOUT_S
    from edgetune.inventory import load_fleet

    fleet = load_fleet(
        write_fleet(site.root, site.net, site.slot, board_image(), ("b1",), transport="direct", name="direct")
    )
    started = time.monotonic()
    try:
        result = fleet_up(fleet)
    finally:
        fleet_down(fleet)
    assert time.monotonic() - started < REGISTER_TIMEOUT_S  # refused before any wait for registration
    tracker = load_fleet_state(fleet).trackers  # taken down
    assert not tracker
    expected = f"b1: cannot reach the tracker at {site.net}.1:{fleet.trackers[0].port}: no route to it; use `ssh: {{transport: ssh}}`"
    assert result.failed["b1"].startswith(expected), result.failed


def rpc_listeners(netns: str) -> list[str]:
    return sorted(listen for listen in listeners(netns) if 9090 <= int(listen.rsplit(":", 1)[1]) < 9200)


def test_what_a_killed_fleet_up_left_unrecorded_is_stopped_by_the_next(site, served):
    """A `fleet up` killed after it started keepers and rpc_servers, before it recorded them: the
    next one finds them (the keeper's state file, the board's rpc_server.pid) and stops them."""
    from edgetune.fleet import fleet_down, fleet_up
    from edgetune.fleet.state import FleetState, save_fleet_state

    fleet = site.fleet()
    assert fleet_up(fleet).ok
    unrecorded = load_fleet_state(fleet)
    save_fleet_state(fleet, FleetState(unrecorded.trackers, {}))  # what a kill before the record leaves
    assert fleet_up(fleet).ok
    recorded = load_fleet_state(fleet).boards
    assert sorted(keepers(site.fleet_yaml)) == sorted(r.tunnel.pid for r in recorded.values())
    assert not {r.tunnel.pid for r in unrecorded.boards.values()} & set(keepers(site.fleet_yaml))
    for name in BOARDS:
        assert len(rpc_listeners(site.hosts[name].netns)) == 1, rpc_listeners(site.hosts[name].netns)

    assert fleet_down(fleet).ok
    killed = subprocess.Popen(
        [sys.executable, "-m", "edgetune", "fleet", "up", "-f", str(site.fleet_yaml)],
        cwd="/",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not keepers(site.fleet_yaml):
            time.sleep(0.02)
    finally:
        killed.kill()
        killed.wait()
    assert keepers(site.fleet_yaml)  # it had started one, and is gone
    assert fleet_up(fleet).ok
    assert sorted(keepers(site.fleet_yaml)) == sorted(r.tunnel.pid for r in load_fleet_state(fleet).boards.values())


def test_fleet_down_leaves_nothing_behind(site, served):
    from edgetune.fleet import fleet_down

    fleet = site.fleet()
    keepers_before = keepers(site.fleet_yaml)
    assert len(keepers_before) == len(BOARDS)
    assert fleet_down(fleet).ok
    assert keepers(site.fleet_yaml) == []
    deadline = time.monotonic() + 10
    hosts = [site.hosts[name] for name in (*BOARDS, "jump")]
    while time.monotonic() < deadline and any(other_processes(host) for host in hosts):
        time.sleep(0.2)
    assert {host.name: other_processes(host) for host in hosts} == {host.name: [] for host in hosts}
    for name in BOARDS:
        assert {listen.rsplit(":", 1)[1] for listen in listeners(site.hosts[name].netns)} == {"22"}
