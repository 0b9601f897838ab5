"""`ssh.config` in fleet.yaml: the OpenSSH client config file boards are reached with, checked
like every other file the inventory names, and the keys, users and ports it may then supply."""

from __future__ import annotations

import pytest
from support.inventory_dump import fleet_to_dict
from support.inventory_files import base_fleet, write

from edgetune.errors import InventoryError
from edgetune.inventory import load_fleet


@pytest.fixture
def fleet_dir(tmp_path, monkeypatch):
    """A working folder, and a home without ~/.ssh/config unless a test writes one."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    return tmp_path


def refused(fleet_dir, data, message: str) -> None:
    with pytest.raises(InventoryError) as err:
        load_fleet(write(fleet_dir, data))
    assert message in str(err.value) and err.value.exit_code == 2, str(err.value)


@pytest.mark.parametrize(
    "where, value, message",
    [
        (
            "fleet",
            "missing_config",
            (
                "fleet.yaml: ssh.config: ssh config file 'missing_config' does not exist "
                "(looked for {dir}/missing_config); name an OpenSSH client config file, or 'none' for none"
            ),
        ),
        ("fleet", ".", "fleet.yaml: ssh.config: ssh config file '.' is not a file"),
        ("fleet", ["a"], "fleet.yaml: ssh.config: must be a string, got a list"),
        ("fleet", 22, "fleet.yaml: ssh.config: must be a string, got int 22"),
        ("fleet", "", "fleet.yaml: ssh.config: must not be empty"),
        (
            "board",
            "/nonexistent/ssh_config",
            "fleet.yaml: boards[1].ssh.config: ssh config file '/nonexistent/ssh_config' does not exist",
        ),
    ],
    ids=["missing", "folder", "list", "integer", "empty", "board-missing"],
)
def test_a_bad_ssh_config_is_refused_with_its_yaml_path(fleet_dir, where, value, message):
    data = base_fleet(fleet_dir)
    target = data["ssh"] if where == "fleet" else data["boards"][1].setdefault("ssh", {})
    target["config"] = value
    refused(fleet_dir, data, message.format(dir=fleet_dir))


def test_a_named_config_file_is_used_by_every_board_and_round_trips(fleet_dir):
    (fleet_dir / "ssh_config").write_text("Host pi-1.local\n    ProxyJump jump\n")
    data = base_fleet(fleet_dir)
    data["ssh"]["config"] = "ssh_config"
    fleet = load_fleet(write(fleet_dir, data))
    assert {board.ssh.config for board in fleet.boards} == {fleet_dir / "ssh_config"}
    again = load_fleet(write(fleet_dir, fleet_to_dict(fleet), "again.yaml"))
    assert again.replace(path=fleet.path) == fleet


def test_home_config_applies_to_real_boards_only_unless_none_is_named(fleet_dir):
    home_config = fleet_dir / "home" / ".ssh" / "config"
    home_config.write_text("Host *\n    User ops\n")
    data = base_fleet(fleet_dir)
    fleet = load_fleet(write(fleet_dir, data))
    assert fleet.board("pi-1").ssh.config == home_config
    assert fleet.board("b1").ssh.config is None  # simulated: reached directly on its own bridge
    data["boards"][1]["ssh"] = {"config": "none"}
    fleet = load_fleet(write(fleet_dir, data))
    assert fleet.board("pi-1").ssh.config is None
    again = load_fleet(write(fleet_dir, fleet_to_dict(fleet), "again.yaml"))
    assert again.replace(path=fleet.path) == fleet


def test_user_and_port_left_unset_stay_unset_for_the_config_to_fill(fleet_dir):
    data = base_fleet(fleet_dir)
    del data["ssh"]["user"]
    data["boards"][1]["ssh"] = {"port": 2222}
    fleet = load_fleet(write(fleet_dir, data))
    assert (fleet.board("pi-1").ssh.user, fleet.board("pi-1").ssh.port) == (None, 2222)
    assert (fleet.board("b1").ssh.user, fleet.board("b1").ssh.port) == (None, None)


def test_without_a_named_key_a_config_file_or_an_agent_must_provide_one(fleet_dir, monkeypatch):
    data = base_fleet(fleet_dir)
    data["boards"] = data["boards"][1:]  # pi-1 only: a simulated board always needs its key named
    data["device_classes"] = data["device_classes"][1:]
    data["tuning"]["borrow"] = {}
    del data["ssh"]["key"]
    refused(
        fleet_dir,
        data,
        "fleet.yaml: ssh.key: required field is missing: the private key used to log in to the board "
        "(or an ssh config file, ssh.config, whose IdentityFile names it, or a running ssh-agent, SSH_AUTH_SOCK)",
    )
    monkeypatch.setenv("SSH_AUTH_SOCK", str(fleet_dir / "agent.sock"))
    assert load_fleet(write(fleet_dir, data)).board("pi-1").ssh.key is None
    monkeypatch.delenv("SSH_AUTH_SOCK")
    (fleet_dir / "ssh_config").write_text("Host pi-1.local\n    IdentityFile ~/.ssh/id_ed25519\n")
    data["ssh"]["config"] = "ssh_config"
    assert load_fleet(write(fleet_dir, data)).board("pi-1").ssh.key is None


def test_a_simulated_board_needs_its_key_named(fleet_dir, monkeypatch):
    monkeypatch.setenv("SSH_AUTH_SOCK", str(fleet_dir / "agent.sock"))
    data = base_fleet(fleet_dir)
    del data["ssh"]["key"]
    refused(
        fleet_dir,
        data,
        "fleet.yaml: ssh.key: required field is missing: a simulated board needs the private key "
        "`edgetune sim up` makes and authorizes on it",
    )
