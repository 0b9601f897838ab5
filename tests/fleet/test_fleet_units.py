"""Unit tests of fleet orchestration: planning, parsing, state, and every error message.
Real sockets and files where possible; paramiko is mocked only for the auth-failure path."""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import os
import socket
import subprocess
import threading
from pathlib import Path

import paramiko
import pytest

from edgetune import durable
from edgetune.errors import FleetError
from edgetune.fleet import on_board
from edgetune.fleet.errors import (
    BoardNotReady,
    HostKeyMismatch,
    HostKeyUnknown,
    SshAuthFailed,
    SshConnectRefused,
    SshTimeout,
)
from edgetune.fleet.parallel import for_each_board
from edgetune.fleet.sim import plan_sim
from edgetune.fleet.ssh import BoardSession, _RefuseUnknownHost, fingerprint, record_host_key
from edgetune.fleet.state import BoardRecord, FleetState, TrackerRecord, load_fleet_state, save_fleet_state
from edgetune.fleet.tracker import ClassLoad, TrackerSummary
from edgetune.inventory import load_fleet
from edgetune.inventory.schema import Board, SshSettings


def make_board(tmp_path: Path, name: str = "b1", address: str = "127.0.0.1", port: int = 22, **ssh) -> Board:
    settings = SshSettings(
        port=port, key=tmp_path / "id", known_hosts=tmp_path / "known_hosts", connect_timeout_s=1.0, **ssh
    )
    return Board(name, address, "cls", "host", "/usr/bin/python3", "/tmp/w", settings)


def keygen(path: Path, passphrase: str = "") -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(path)], check=True)


def rsa_key() -> paramiko.PKey:
    return paramiko.RSAKey.generate(1024)


@pytest.fixture
def fleet(spare_fleet_yaml):
    return load_fleet(spare_fleet_yaml)


def test_sim_plan_names_are_per_fleet_unique_and_fit_interface_limits(fleet):
    plan = plan_sim(fleet)
    assert [s.board.name for s in plan] == [b.name for b in fleet.boards]
    assert len({s.veth for s in plan}) == len(plan) and all(len(s.veth) <= 15 for s in plan)
    assert all(fleet.name in s.netns and fleet.name in s.cgroup for s in plan)
    assert all(s.dir == fleet.workdir / "sim" / s.board.name for s in plan)


def test_unknown_host_key_message_names_the_trust_command(tmp_path):
    board = make_board(tmp_path, name="gw-7")
    key = rsa_key()
    with pytest.raises(HostKeyUnknown) as err:
        _RefuseUnknownHost(board).missing_host_key(None, board.address, key)
    assert "edgetune fleet trust gw-7" in str(err.value) and fingerprint(key) in str(err.value)


def test_record_host_key_appends_once_and_never_replaces(tmp_path):
    board = make_board(tmp_path, port=2222)
    first, second = rsa_key(), rsa_key()
    assert record_host_key(board, first) is True
    assert record_host_key(board, first) is False
    assert (tmp_path / "known_hosts").read_text().startswith("[127.0.0.1]:2222 ssh-rsa ")
    with pytest.raises(HostKeyMismatch) as err:
        record_host_key(board, second)
    assert fingerprint(first) in str(err.value) and fingerprint(second) in str(err.value)
    assert "ssh-keygen -R" in str(err.value)


def test_a_key_of_another_type_is_refused_when_one_is_recorded(tmp_path):
    board = make_board(tmp_path)
    assert record_host_key(board, rsa_key()) is True
    with pytest.raises(HostKeyMismatch):
        record_host_key(board, paramiko.Ed25519Key.from_private_key(io.StringIO(_ed25519_pem())))
    assert len((tmp_path / "known_hosts").read_text().splitlines()) == 1


def test_trust_needs_a_known_hosts_file(tmp_path):
    board = dataclasses.replace(
        make_board(tmp_path), ssh=dataclasses.replace(make_board(tmp_path).ssh, known_hosts=None)
    )
    with pytest.raises(FleetError, match="no known_hosts file is set"):
        record_host_key(board, rsa_key())


def _ed25519_pem() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()


def test_fingerprint_matches_openssh(tmp_path):
    keygen(tmp_path / "k")
    openssh = subprocess.run(["ssh-keygen", "-l", "-f", str(tmp_path / "k.pub")], capture_output=True, text=True).stdout
    assert fingerprint(paramiko.PKey.from_path(tmp_path / "k")) == openssh.split()[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_connection_refused(tmp_path):
    keygen(tmp_path / "id")
    with pytest.raises(SshConnectRefused, match="connection refused"):
        BoardSession(make_board(tmp_path, port=free_port())).run("true")


def test_connect_timeout_when_the_server_never_speaks(tmp_path):
    keygen(tmp_path / "id")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        board = make_board(tmp_path, port=server.getsockname()[1])
        with pytest.raises(SshTimeout, match="no SSH banner within 1 s"):
            BoardSession(board).run("true")


def test_missing_and_encrypted_keys_are_auth_errors(tmp_path, monkeypatch):
    with pytest.raises(SshAuthFailed, match="does not exist"):
        BoardSession(make_board(tmp_path)).run("true")
    keygen(tmp_path / "id", passphrase="s3cret")
    board = make_board(tmp_path, passphrase_env="ETUNE_TEST_PASSPHRASE")
    monkeypatch.delenv("ETUNE_TEST_PASSPHRASE", raising=False)
    with pytest.raises(SshAuthFailed, match="encrypted; set ETUNE_TEST_PASSPHRASE"):
        BoardSession(board).run("true")


def test_auth_failure_message(tmp_path, monkeypatch):
    keygen(tmp_path / "id")

    def refuse(*args, **kwargs):
        raise paramiko.AuthenticationException("Authentication failed.")

    monkeypatch.setattr(paramiko.SSHClient, "connect", refuse)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with pytest.raises(SshAuthFailed, match=rf"b1: root@127.0.0.1:{port}: authentication failed with key .*/id"):
            BoardSession(make_board(tmp_path, port=port)).run("true")


FACTS = on_board.BoardFacts("3.11.7", "0.27.0", None, 10_000, "fw")
V3 = {"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 1}
AVX512 = {"kind": "llvm", "mcpu": "icelake-server", "num-cores": 1}
ZEN3_FLAGS = tuple(
    "fpu sse sse2 pni ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand avx2 bmi1 bmi2".split()
)


def test_preflight_accepts_a_matching_board_down_to_the_least_free_space(tmp_path):
    board = make_board(tmp_path)
    just_enough = dataclasses.replace(FACTS, free_mb=on_board.MIN_FREE_MB)
    assert on_board.check_ready(board, just_enough, "0.27.0", V3) is None
    with pytest.raises(BoardNotReady, match=f"only {on_board.MIN_FREE_MB - 1} MB free in {board.workdir}"):
        on_board.check_ready(board, dataclasses.replace(just_enough, free_mb=on_board.MIN_FREE_MB - 1), "0.27.0", V3)


@pytest.mark.parametrize(
    "facts, message",
    [
        (
            on_board.BoardFacts("3.11.7", "0.26.0", None, 10_000, ""),
            "board runs TVM 0.26.0, this host runs TVM 0.27.0; the Relax VM refuses",
        ),
        (
            on_board.BoardFacts("3.11.7", None, "ModuleNotFoundError: No module named 'tvm'", 10_000, ""),
            "cannot import the TVM runtime",
        ),
        (on_board.BoardFacts("3.11.7", "0.27.0", None, 10, ""), "only 10 MB free in /tmp/w"),
    ],
)
def test_preflight_refusals(tmp_path, facts, message):
    with pytest.raises(BoardNotReady, match=message):
        on_board.check_ready(make_board(tmp_path), facts, "0.27.0", V3)


def test_preflight_refuses_a_board_whose_cpu_lacks_what_its_class_targets(tmp_path):
    board = make_board(tmp_path)
    zen3 = dataclasses.replace(FACTS, cpu_flags=ZEN3_FLAGS)
    assert on_board.check_ready(board, zen3, "0.27.0", V3) is None
    with pytest.raises(
        BoardNotReady,
        match=r"targets icelake-server .* uses avx512bitalg, avx512bw, .*avx512f, .* which this board's CPU lacks",
    ):
        on_board.check_ready(board, zen3, "0.27.0", AVX512)
    assert on_board.missing_instruction_sets({**V3, "mattr": ["+avx512vnni"]}, ZEN3_FLAGS) == ["avx512f", "avx512vnni"]
    assert on_board.missing_instruction_sets(AVX512, ()) == []  # no x86 flags shown (an Arm board): not judged here


ZEN4_FLAGS = ZEN3_FLAGS + ("avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16")
ZEN4 = {"kind": "llvm", "mcpu": "znver4", "num-cores": 1}


@pytest.mark.parametrize(
    "vendor, family, flags, target, advised",
    [
        ("AuthenticAMD", "25", ZEN4_FLAGS, AVX512, True),  # a Zen 4 built for full-width AVX-512
        ("AuthenticAMD", "25", ZEN4_FLAGS, ZEN4, False),  # its own profile
        ("AuthenticAMD", "25", ZEN4_FLAGS, V3, False),  # AVX2 code: no 512-bit vectors to split
        ("AuthenticAMD", "25", ZEN3_FLAGS, V3, False),  # a Zen 3: same family, no AVX-512
        ("AuthenticAMD", "26", ZEN4_FLAGS, AVX512, False),  # a Zen 5 (full-width units on desktop and server parts)
        ("GenuineIntel", "6", ZEN4_FLAGS, AVX512, False),
        ("", "", (), AVX512, False),  # an Arm board, or facts without a preflight probe
    ],
)
def test_preflight_names_the_profile_for_a_cpu_whose_avx512_units_are_half_width(
    tmp_path, vendor, family, flags, target, advised
):
    facts = dataclasses.replace(FACTS, cpu_vendor=vendor, cpu_family=family, cpu_flags=flags)
    advice = on_board.datapath_advice(make_board(tmp_path), target, facts)
    assert (advice is not None) == advised, advice
    if advised:
        assert (
            advice.startswith("b1: its CPU is an AMD Zen 4 (AuthenticAMD family 25)")
            and "targets icelake-server" in advice
        )
        assert "mcpu znver4 (device_profiles/x86-zen4.yaml)" in advice
    assert (
        on_board.check_ready(make_board(tmp_path), facts if flags else FACTS, "0.27.0", V3) is None
    )  # advice, never a refusal


def test_preflight_names_the_missing_board_packages_and_the_command_that_installs_them(tmp_path):
    board = make_board(tmp_path)
    facts = dataclasses.replace(FACTS, missing=("numpy", "cloudpickle"))
    with pytest.raises(BoardNotReady) as refused:
        on_board.check_ready(board, facts, "0.27.0", V3)
    install = on_board.install_command(board.python, ["numpy", "cloudpickle"])
    assert f"lacks numpy, cloudpickle, which a board needs; install with: {install}" in str(refused.value)
    assert "numpy==2.2.6; python_version < " in install and "numpy==2.4.6; python_version >= " in install  # per Python
    old = dataclasses.replace(FACTS, python_version="3.9.18")
    with pytest.raises(BoardNotReady, match="is Python 3.9.18; a board needs Python 3.10 or newer"):
        on_board.check_ready(board, old, "0.27.0", V3)


def test_the_readme_prepares_a_board_with_exactly_what_preflight_asks_for():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert f"\n{on_board.install_command('python3', [])}\n" in readme


def test_tracker_summary_parsing():
    summary = TrackerSummary.from_tvm(
        {
            "queue_info": {"fast": {"free": 1, "pending": 0}},
            "server_info": [
                {"key": "server:fast", "addr": ["10.0.0.2", 9090]},
                {"key": "server:fast", "addr": ["10.0.0.3", 9090]},
            ],
        }
    )
    assert summary.servers == {"fast": ("10.0.0.2", "10.0.0.3")}
    assert summary.registered("fast", "10.0.0.3") and not summary.registered("slow", "10.0.0.3")
    assert summary.queues["fast"].free == 1
    assert summary.load("fast") == ClassLoad(registered=2, free=1, busy=1, pending=0)
    assert summary.load("slow") == ClassLoad(registered=0, free=0, busy=0, pending=0)


def test_one_failing_board_does_not_stop_the_others(tmp_path):
    boards = [make_board(tmp_path, name=f"b{i}") for i in range(4)]
    seen = []
    lock = threading.Lock()

    def step(board):
        with lock:
            seen.append(board.name)
        if board.name == "b1":
            raise FleetError("link down")
        if board.name == "b2":
            raise KeyError("bug")
        return board.name.upper()

    result = for_each_board(boards, step)
    assert sorted(seen) == ["b0", "b1", "b2", "b3"]
    assert result.succeeded == {"b0": "B0", "b3": "B3"}
    assert result.failed == {"b1": "b1: link down", "b2": "b2: unexpected KeyError: 'bug'"}
    assert not result.ok


def test_state_round_trip(fleet):
    state = FleetState(
        {"host": TrackerRecord("host", "10.0.0.1", 9190, 42)},
        {"b": BoardRecord(7, "10.0.0.1:9190", "c", "3.11", "0.27", "fw")},
    )
    save_fleet_state(fleet, state)
    assert load_fleet_state(fleet) == state
    files = list((fleet.workdir / "state").iterdir())
    assert [f.name for f in files] == ["fleet.json"]
    assert json.loads(files[0].read_text())["trackers"]["host"]["port"] == 9190


@pytest.mark.parametrize("crash", ["mid-write", "at-rename"])
def test_state_write_that_crashes_keeps_the_old_state_and_no_temp_file(fleet, monkeypatch, crash):
    """A write that dies half-way through the data, or when renaming it into place, leaves the
    previous state readable as it was and no temporary file in the state folder."""
    old = FleetState({"host": TrackerRecord("host", "10.0.0.1", 9190, 42)})
    save_fleet_state(fleet, old)
    state_dir = fleet.workdir / "state"
    real_write, real_replace = os.write, os.replace

    def write_half_then_die(fd, data):
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    def die_at_rename(src, dst):
        if Path(dst).parent == state_dir:
            raise OSError(errno.EIO, "Input/output error")
        return real_replace(src, dst)

    if crash == "mid-write":
        monkeypatch.setattr(durable.os, "write", write_half_then_die)
    else:
        monkeypatch.setattr(durable.os, "replace", die_at_rename)
    new = FleetState(
        {"host": TrackerRecord("host", "10.0.0.1", 9191, 43)},
        {"b": BoardRecord(7, "10.0.0.1:9191", "c", "3.11", "0.27", "fw")},
    )
    with pytest.raises(OSError):
        save_fleet_state(fleet, new)
    monkeypatch.undo()

    assert load_fleet_state(fleet) == old
    assert [f.name for f in state_dir.iterdir()] == ["fleet.json"]
    save_fleet_state(fleet, new)
    assert load_fleet_state(fleet) == new
