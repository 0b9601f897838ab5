"""The simulated fleet, for real: namespaces, OpenSSH, TVM's tracker and rpc_servers, cgroups.

Runs on the session's `sim_fleet` (2 classes x 2 boards). Faults are injected for real (a
killed rpc_server, a link set down, a regenerated host key) and each test restores the
fleet before it ends, so the fixture stays usable by later test files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import paramiko
import pytest
import tvm
from support.sim_checks import leftovers, link_down
from tvm import rpc, te

from edgetune.artifact.measure import interleave
from edgetune.cli import main
from edgetune.fleet import fleet_down, fleet_status, fleet_up, rpc_endpoint, sim_down, sim_up, trust_board
from edgetune.fleet.errors import HostKeyMismatch, HostKeyUnknown
from edgetune.fleet.on_board import RPC_SERVER_PORT
from edgetune.fleet.process import port_answers, wait_until
from edgetune.fleet.sim import plan_sim
from edgetune.fleet.ssh import BoardSession, fetch_host_key, fingerprint, known_hosts_name
from edgetune.fleet.ssh_route import rpc_address
from edgetune.fleet.state import load_fleet_state, load_sim_pids, state_path
from edgetune.fleet.tracker import query_tracker
from edgetune.inventory import load_fleet

VECTOR = 1 << 16  # 768 kB for the three vectors: in cache, so the CPU quota, not memory, sets the time


def statuses(fleet):
    return {status.name: status for status in fleet_status(fleet)}


def test_every_board_is_registered_under_its_class(sim_fleet):
    state = load_fleet_state(sim_fleet)
    summary = query_tracker(state.trackers["host"])
    for board in sim_fleet.boards:
        assert summary.registered(board.device_class, state.boards[board.name].rpc_address), board.name
    assert {k: len(v) for k, v in summary.servers.items()} == {"gw-fast": 2, "gw-slow": 2}
    for status in statuses(sim_fleet).values():
        assert status.reachable and status.registered and status.server_running, status
        assert status.tvm_version == tvm.__version__ and status.firmware.startswith("Linux")


def test_the_tracker_loads_tvms_runtime_library_alone(sim_fleet):
    """It brokers sockets: TVM's compiler library (most of TVM's start-up) is not loaded, in the
    tracker or in its pool worker."""
    tracker = load_fleet_state(sim_fleet).trackers["host"].pid
    processes = [tracker, *(int(p) for p in Path(f"/proc/{tracker}/task/{tracker}/children").read_text().split())]
    for pid in processes:
        mapped = Path(f"/proc/{pid}/maps").read_text()
        assert "libtvm_runtime.so" in mapped and "libtvm_compiler.so" not in mapped, pid


def test_a_directly_routed_board_listens_on_nothing_but_sshd(sim_fleet):
    """`ssh.transport: ssh`, the default, also for a board this host has a route to: its
    rpc_server is listed under its forward's address on this host, and a connect to the board's
    own RPC port is refused."""
    state = load_fleet_state(sim_fleet)
    for board in sim_fleet.boards:
        record = state.boards[board.name]
        assert record.tunnel is not None and record.rpc_address == rpc_address(board) != board.address, board.name
        assert port_answers(record.rpc_address, RPC_SERVER_PORT) and not port_answers(board.address, RPC_SERVER_PORT)


def test_a_board_runs_its_commands_without_the_hosts_shell_start_up_file(sim_fleet):
    """bash, as sshd's shell, reads ~/.bashrc before each command. A simulated board shares the
    host's files, but not the host user's .bashrc (a developer's pyenv or conda set-up): it reads
    empty there, and the host's is untouched."""
    host_rc = Path.home() / ".bashrc"
    before = host_rc.read_bytes() if host_rc.is_file() else None
    for board in sim_fleet.boards:
        seen = BoardSession(board).run("[ -e ~/.bashrc ] && wc -c < ~/.bashrc || echo none").stdout.strip()
        assert seen == ("none" if before is None else "0"), board.name
    assert (host_rc.read_bytes() if host_rc.is_file() else None) == before


def vector_add(fleet, device_class: str, tmp: Path) -> Path:
    a, b = te.placeholder((VECTOR,), name="A"), te.placeholder((VECTOR,), name="B")
    c = te.compute((VECTOR,), lambda i: a[i] + b[i], name="C")
    func = te.create_prim_func([a, b, c]).with_attr("global_symbol", "vadd")
    target = tvm.target.Target(fleet.device_class(device_class).profile.target_json())
    path = tmp / f"vadd-{device_class}.so"
    tvm.compile(tvm.IRModule({"vadd": func}), target=target).export_library(str(path))
    return path


def on_class(fleet, device_class: str, library: Path):
    """Upload, run and check the kernel on a board of the class; return a timer of it (a sample's
    mean seconds per call)."""
    endpoint = rpc_endpoint(fleet, device_class)
    remote = rpc.connect_tracker(endpoint.host, endpoint.port).request(endpoint.key, priority=1, session_timeout=60)
    remote.upload(str(library))
    kernel = remote.load_module(library.name)
    dev = remote.cpu()
    rng = np.random.default_rng(0)
    a, b = rng.random(VECTOR, dtype="float32"), rng.random(VECTOR, dtype="float32")
    ta, tb, tc = (tvm.runtime.tensor(x, dev) for x in (a, b, np.zeros(VECTOR, "float32")))
    kernel["vadd"](ta, tb, tc)
    np.testing.assert_allclose(tc.numpy(), a + b)
    timer = kernel.time_evaluator("vadd", dev, number=5, repeat=2, min_repeat_ms=100)
    return lambda: timer(ta, tb, tc).results


def test_kernel_runs_on_each_class_and_the_quota_slows_the_slow_class(sim_fleet, tmp_path):
    timers = {name: on_class(sim_fleet, name, vector_add(sim_fleet, name, tmp_path)) for name in ("gw-fast", "gw-slow")}
    samples = interleave(timers, rounds=4)  # another test's load falls on both alike
    fast, slow = (float(np.median(samples[name])) for name in timers)
    print(
        f"vector add of {VECTOR} floats: gw-fast {fast * 1e6:.1f} us, gw-slow {slow * 1e6:.1f} us, {slow / fast:.1f}x"
    )
    assert slow > 1.5 * fast  # half a core: about twice as slow


def test_cli_status_json(sim_fleet, capsys):
    # a session that ended abruptly (as the previous test's may) has its board's watchdog restart
    # the rpc_server, which takes seconds: the test is about the output, so it waits that out
    assert wait_until(lambda: all(s.registered for s in fleet_status(sim_fleet)), 30, interval_s=1.0)
    assert main(["fleet", "status", "--json", "-f", str(sim_fleet.path)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in rows] == [b.name for b in sim_fleet.boards]
    for row in rows:
        assert row["reachable"] is True and row["registered"] is True
        assert row["device_class"] in ("gw-fast", "gw-slow") and row["tvm_version"] and row["firmware"]


def test_killed_rpc_server_is_reported_and_only_it_is_restarted(sim_fleet):
    before = load_fleet_state(sim_fleet).boards
    os.killpg(before["fast-2"].pid, signal.SIGKILL)
    summary = lambda: query_tracker(load_fleet_state(sim_fleet).trackers["host"])  # noqa: E731
    assert wait_until(lambda: not summary().registered("gw-fast", before["fast-2"].rpc_address), 10)
    status = statuses(sim_fleet)["fast-2"]
    assert status.reachable and not status.registered and status.server_running is False
    assert main(["fleet", "status", "-f", str(sim_fleet.path)]) != 0

    result = fleet_up(sim_fleet)
    assert result.ok, result.failed
    after = load_fleet_state(sim_fleet).boards
    assert after["fast-2"].pid != before["fast-2"].pid
    assert {n: r.pid for n, r in after.items() if n != "fast-2"} == {
        n: r.pid for n, r in before.items() if n != "fast-2"
    }
    assert statuses(sim_fleet)["fast-2"].registered


def test_a_board_whose_tvm_does_not_import_fails_at_once_naming_its_log(sim_fleet):
    """TVM installed (its version read from the package) but broken: `fleet up` does not wait for a
    registration that cannot come; it names what the rpc_server's log ends with."""
    board = sim_fleet.board("fast-2")
    broken = Path(board.workdir) / "broken-site"
    (broken / "tvm").mkdir(parents=True, exist_ok=True)
    (broken / "tvm" / "__init__.py").write_text("raise ImportError('libtvm_runtime.so: cannot open shared object')\n")
    python = Path(board.workdir) / "python-with-a-broken-tvm"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={broken} exec {board.python} "$@"\n')
    python.chmod(0o755)
    broken_fleet = sim_fleet.replace(
        boards=tuple(dataclasses.replace(b, python=str(python)) if b.name == "fast-2" else b for b in sim_fleet.boards)
    )
    os.killpg(load_fleet_state(sim_fleet).boards["fast-2"].pid, signal.SIGKILL)
    try:
        started = time.monotonic()
        result = fleet_up(broken_fleet)
        assert time.monotonic() - started < 30
        assert set(result.failed) == {"fast-2"}, result.failed
        assert "its rpc_server exited as it started" in result.failed["fast-2"]
        assert "libtvm_runtime.so: cannot open shared object" in result.failed["fast-2"]
    finally:
        assert fleet_up(sim_fleet).ok
    assert statuses(sim_fleet)["fast-2"].registered


def test_link_down_is_detected_and_does_not_stop_the_others(sim_fleet):
    with link_down(sim_fleet, "slow-2"):
        status = statuses(sim_fleet)["slow-2"]
        assert not status.reachable and "no answer within 3 s" in status.error
        result = fleet_up(sim_fleet)
        assert set(result.failed) == {"slow-2"} and set(result.succeeded) == {"fast-1", "fast-2", "slow-1"}
    assert fleet_up(sim_fleet).ok


def restart_sshd(fleet, board_name: str) -> None:
    os.killpg(load_sim_pids(fleet)[board_name], signal.SIGKILL)
    assert sim_up(fleet).ok


def test_changed_host_key_is_refused(sim_fleet):
    board = sim_fleet.board("slow-1")
    host_key = next(sim.host_key for sim in plan_sim(sim_fleet) if sim.board.name == "slow-1")
    saved = host_key.with_suffix(".orig")
    shutil.move(host_key, saved)
    shutil.move(f"{host_key}.pub", f"{saved}.pub")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    try:
        restart_sshd(sim_fleet, "slow-1")  # existing key: sim up must not re-trust it
        with pytest.raises(HostKeyMismatch, match="HOST KEY CHANGED") as err:
            BoardSession(board).run("true")
        assert str(err.value).count("SHA256:") == 2
        with pytest.raises(HostKeyMismatch):
            trust_board(sim_fleet, "slow-1")
        assert not statuses(sim_fleet)["slow-1"].reachable
    finally:
        shutil.move(saved, host_key)
        shutil.move(f"{saved}.pub", f"{host_key}.pub")
        restart_sshd(sim_fleet, "slow-1")
    assert BoardSession(board).run("echo ok").stdout == "ok\n"


def test_unknown_host_key_is_refused_until_trusted(sim_fleet):
    board = sim_fleet.board("fast-1")
    known = paramiko.HostKeys(str(board.ssh.known_hosts))
    del known[known_hosts_name(board)]
    known.save(str(board.ssh.known_hosts))
    with pytest.raises(HostKeyUnknown, match="run `edgetune fleet trust fast-1`"):
        BoardSession(board).run("true")
    with pytest.raises(HostKeyMismatch, match="not the expected SHA256:AAAA"):
        trust_board(sim_fleet, "fast-1", expected_fingerprint="SHA256:AAAA")
    assert known_hosts_name(board) not in paramiko.HostKeys(str(board.ssh.known_hosts))  # nothing recorded
    offered = fetch_host_key(board)
    assert trust_board(sim_fleet, "fast-1", expected_fingerprint=fingerprint(offered)) == fingerprint(offered)
    assert BoardSession(board).run("echo ok").stdout == "ok\n"


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]


def test_sim_down_leaves_nothing_behind(spare_fleet_yaml):
    fleet = load_fleet(spare_fleet_yaml)
    fleet = fleet.replace(boards=fleet.boards[:1] + fleet.boards[2:3])  # one board per class
    try:
        assert sim_up(fleet).ok and sim_up(fleet).ok  # idempotent
        assert fleet_up(fleet).ok
        state = load_fleet_state(fleet)
        pids = [state.trackers["host"].pid, *(r.pid for r in state.boards.values())]
        pids += load_sim_pids(fleet).values()
        assert leftovers(fleet) and all(alive(pid) for pid in pids)
    finally:
        assert fleet_down(fleet).ok and fleet_down(fleet).ok  # safe twice
        assert sim_down(fleet).ok and sim_down(fleet).ok
    assert leftovers(fleet) == []
    assert [pid for pid in pids if alive(pid)] == []
    assert not state_path(fleet, "sim").exists()


def test_sim_firmware_update_changes_one_fingerprint_and_its_quota(sim_fleet):
    from edgetune.fleet import cgroups
    from edgetune.fleet.errors import SimError
    from edgetune.fleet.sim import plan_sim, sim_firmware, sim_firmware_file

    slow2 = next(s for s in plan_sim(sim_fleet) if s.board.name == "slow-2")
    directory = cgroups.cgroup_dir(slow2.cgroup)

    def cores() -> float:  # the CPU time the board may use per period, in cores
        if cgroups.is_v2():
            quota, period = (directory / "cpu.max").read_text().split()
        else:
            quota, period = (directory / "cpu.cfs_quota_us").read_text(), (directory / "cpu.cfs_period_us").read_text()
        return int(quota) / int(period)

    try:
        sim_firmware(sim_fleet, "slow-2", "2.0-test", cpu_quota=0.25)
        status = {b.name: b for b in fleet_status(sim_fleet)}
        assert status["slow-2"].firmware_changed and "sim-firmware 2.0-test" in status["slow-2"].firmware
        assert not any(status[n].firmware_changed for n in ("fast-1", "fast-2", "slow-1"))
        assert cores() == 0.25
        with pytest.raises(SimError, match="not a simulated board"):
            sim_firmware(sim_fleet, "ghost", "1")
    finally:
        sim_firmware_file(sim_fleet, slow2.board).unlink(missing_ok=True)
        cgroups.limit_quota(slow2.cgroup, slow2.board.simulated.cpu_quota)
    assert not {b.name: b for b in fleet_status(sim_fleet)}["slow-2"].firmware_changed
