"""Faults on a loopback fleet of the test's own (the shared sim_fleet must not be harmed):
SIGKILL of `edgetune tune` mid-run then a resumed run, Ctrl-C mid-run, a board dying mid-run,
and a client vanishing mid-session."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from support.fleets import V3, make_fleet, mlp
from support.tests_samples import FAKE_PRIVATE_KEY
from tvm import rpc
from tvm.rpc import base

from edgetune.fleet.board_rpc_server import CHECK_PERIOD_S, MISSING_CHECKS
from edgetune.tune.database import ClassDatabasePaths, open_database, read_trials
from edgetune.tune.tuner import TuneOptions, tune_fleet

REPO = Path(__file__).resolve().parents[2]
BUDGET = 16  # two rounds of 8: a kill or a dead board after the first leaves a round to do
CTRL_C_BUDGET = 32  # four rounds: a round's 8 records may appear only as the third round starts (they are
# recorded when their task is next chosen), and the rounds then in flight still leave one undone

FLEET_YAML = """\
version: 1
name: faults
workdir: work
trackers:
  - {{name: host, bind_host: 127.0.0.1, public_address: 127.0.0.1, port: {port}, port_end: {port_end}}}
ssh: {{user: root, key: {dir}/id, known_hosts: {dir}/known_hosts}}
device_classes:
  - {{name: classa, profile: {repo}/device_profiles/x86-64-v3.yaml}}
boards:
  - {{name: a1, address: 127.0.0.1, device_class: classa, tracker: host, python: {python}, workdir: /tmp/a1}}
models:
  - {{name: mlp, builtin: mlp, inputs: [{{name: x, shape: [1, 256], dtype: float32}}]}}
tuning: {{trials_per_class: {budget}, trials_per_iter: 8, max_trials_per_task: 16}}
artifacts: {{dir: artifacts, signing_key: work/k, public_key: work/k.pub}}
"""


def _records(paths: ClassDatabasePaths) -> int:
    return len(read_trials(paths))


def _wait_for_records(paths: ClassDatabasePaths, count: int, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _records(paths) < count:
        assert time.monotonic() < deadline, f"fewer than {count} records after {timeout_s} s"
        time.sleep(0.5)


def _one_board_fleet(loopback, tmp_path: Path, budget: int) -> tuple[Path, ClassDatabasePaths]:
    """fleet.yaml of one loopback board (class classa, mlp, `budget` trials) and its database."""
    loopback.start_board("a1", "classa")  # the loader refuses two boards at one address
    loopback.wait_registered(1)
    (tmp_path / "id").write_text(FAKE_PRIVATE_KEY)
    (tmp_path / "id").chmod(0o600)
    (tmp_path / "known_hosts").write_text("")
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text(
        FLEET_YAML.format(
            port=loopback.port,
            port_end=loopback.port + 1,
            dir=tmp_path,
            repo=REPO,
            python=sys.executable,
            budget=budget,
        )
    )
    return fleet_yaml, ClassDatabasePaths(tmp_path / "work" / "databases" / "classa")


def test_sigkill_mid_run_then_rerun_completes(loopback, tmp_path):
    fleet_yaml, paths = _one_board_fleet(loopback, tmp_path, BUDGET)
    command = [sys.executable, "-m", "edgetune", "tune", "-f", str(fleet_yaml), "--json"]
    run = subprocess.Popen(
        command, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_for_records(paths, 8)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    before_kill = read_trials(paths)
    killed_at = len(before_kill)
    assert killed_at < BUDGET
    with paths.tuning_record.open("a") as file:  # what a kill during a write leaves
        file.write('[0, [[["GetSBlock", [], ["matmul"')
    done = subprocess.run(command, check=False, cwd=REPO, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    total = _records(paths)
    assert read_trials(paths)[:killed_at] == before_kill  # no record lost
    assert total >= BUDGET  # the budget was finished
    assert total - killed_at <= BUDGET  # the trials before the kill counted
    assert len(open_database(paths)) == total
    again = subprocess.run(command, check=False, cwd=REPO, capture_output=True, text=True, timeout=200)
    assert '"trials_run": 0' in again.stdout


def test_ctrl_c_stops_after_the_round_in_flight_keeping_its_trials_and_report(loopback, tmp_path):
    """Ctrl-C reaches the terminal's whole process group: `edgetune tune` and its class process."""
    fleet_yaml, paths = _one_board_fleet(loopback, tmp_path, CTRL_C_BUDGET)
    command = [sys.executable, "-m", "edgetune", "tune", "-f", str(fleet_yaml)]
    run = subprocess.Popen(
        command, cwd=REPO, start_new_session=True, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        _wait_for_records(paths, 8)
        os.killpg(run.pid, signal.SIGINT)
        sent = time.monotonic()
        stdout, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    print(f"stopped {time.monotonic() - sent:.1f} s after SIGINT")
    assert run.returncode == 130, stderr[-2000:]
    assert "SIGINT: tuning stops after the rounds in flight" in stderr
    assert "stopped on request" in stdout and "every measured trial is kept; re-run to resume" in stderr
    kept = _records(paths)
    assert 8 <= kept < CTRL_C_BUDGET
    summary = json.loads((tmp_path / "work" / "reports" / "classa" / "mlp" / "summary.json").read_text())
    assert summary["trials"] == kept
    plan = subprocess.run(
        [*command, "--dry-run", "--json"], check=False, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    (planned,) = json.loads(plan.stdout)["classes"]
    assert planned["done"] == kept and planned["remaining"] == CTRL_C_BUDGET - kept


def test_board_dying_mid_run_does_not_stop_its_class(loopback, tmp_path):
    for name in ("a1", "a2"):
        loopback.start_board(name, "classa")
    loopback.wait_registered(2)
    fleet = make_fleet(tmp_path, loopback.port, {"classa": V3}, {"classa": 2}, (mlp(),), BUDGET, 8, 16)
    paths = ClassDatabasePaths.of(tmp_path, "classa")
    killer = threading.Thread(target=lambda: (_wait_for_records(paths, 8), loopback.kill_board("a1")))
    killer.start()
    result = tune_fleet(fleet, TuneOptions())
    killer.join()
    assert "a1" not in loopback.servers
    assert result.ok, result.classes[0].error
    assert result.classes[0].trials_run >= BUDGET
    assert sum(t.latency_s is not None for t in read_trials(paths)[8:]) > 0  # a2 kept measuring ...
    assert "timeout in RPC session" not in (loopback.directory / "a2.log").read_text(), (
        loopback.logs()
    )  # ... without a stall


def _vanish_mid_session(loopback, key: str) -> None:
    """Take a board from the tracker, open its session and drop the connection with a reset, as
    a host killed mid-measurement or a network drop does (TVM's own client cannot be made to)."""
    with loopback.connect_tracker() as tracker:
        base.sendjson(tracker, [base.TrackerCode.REQUEST, key, "", 1])
        _, (host, port, matchkey) = base.recvjson(tracker)
    board = socket.create_connection((host, port))
    header = f"client:{matchkey} -timeout=60".encode()
    board.sendall(struct.pack("<ii", base.RPC_MAGIC, len(header)) + header)
    assert struct.unpack("<i", base.recvall(board, 4))[0] == base.RPC_CODE_SUCCESS
    base.recvall(board, struct.unpack("<i", base.recvall(board, 4))[0])  # the session has started
    board.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    board.close()


def test_a_board_whose_client_vanished_mid_session_serves_again(loopback):
    """TVM 0.27's rpc_server stops listening when a session's client resets the connection (its
    process lives on, unregistered); the board's watchdog starts a new one."""
    loopback.start_board("a1", "classa")
    loopback.wait_registered(1)
    _vanish_mid_session(loopback, "classa")
    _wait_for_log(loopback, "a1", "exited unsuccessfully")  # TVM's listening thread has ended
    loopback.wait_registered(1, timeout_s=(MISSING_CHECKS + 2) * CHECK_PERIOD_S + 10)
    session = rpc.connect_tracker("127.0.0.1", loopback.port).request("classa", session_timeout=30)
    assert session.cpu(0).exist  # the new server measures again
    assert loopback.servers["a1"].poll() is None


def _wait_for_log(loopback, board: str, text: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in (log := (loopback.directory / f"{board}.log").read_text(errors="replace")):
        assert time.monotonic() < deadline, f"{board}'s log never said {text!r}:\n{log[-2000:]}"
        time.sleep(0.2)
