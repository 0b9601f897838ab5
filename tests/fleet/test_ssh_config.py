"""How a board's SSH route is resolved from fleet.yaml and an ssh config file (no network):
OpenSSH's precedence, Host aliases, ProxyJump chains, Include, and the values refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgetune.fleet.errors import SshAuthFailed, SshConfigInvalid
from edgetune.fleet.ssh import BoardSession
from edgetune.fleet.ssh_route import MAX_HOPS, Hop, parse_jump, resolve_route, rpc_address, uses_ssh_transport
from edgetune.inventory.schema import Board, SshSettings


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """A home of its own: `~` and relative Includes never reach the real ~/.ssh."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    return tmp_path / "home"


def board_with(tmp_path: Path, config_text: str | None, address: str = "gw-7", **ssh) -> Board:
    config = None
    if config_text is not None:
        config = tmp_path / "ssh_config"
        config.write_text(config_text)
    settings = SshSettings(known_hosts=tmp_path / "known_hosts", config=config, **ssh)
    return Board("gw-7", address, "cls", "host", "/usr/bin/python3", "/tmp/w", settings)


ALIASES = """\
Host gw-7
    HostName 10.0.1.7
    User ops
    Port 2207
    IdentityFile keys/gw.key
    IdentityFile ~/.ssh/fallback.key
    ProxyJump jump
Host jump
    HostName 10.0.0.2
    User bastion
    IdentityFile /etc/keys/jump.key
Host far
    HostName 10.0.2.2
    Port 2022
Host *
    User everyone
"""


def test_without_a_config_file_fleet_yaml_and_the_defaults_decide(tmp_path):
    route = resolve_route(board_with(tmp_path, None, address="10.0.0.9", key=tmp_path / "id"))
    assert route.jumps == ()
    assert route.target == Hop("10.0.0.9", "10.0.0.9", 22, "root", (), tmp_path / "id")
    assert route.target.known_hosts_name == "10.0.0.9"


def test_the_config_fills_what_fleet_yaml_leaves_unset(tmp_path, home):
    route = resolve_route(board_with(tmp_path, ALIASES))
    assert route.target == Hop("gw-7", "10.0.1.7", 2207, "ops", (tmp_path / "keys/gw.key", home / ".ssh/fallback.key"))
    assert route.target.known_hosts_name == "[10.0.1.7]:2207"  # the resolved HostName, not the alias
    assert str(route.target) == "gw-7 (ops@10.0.1.7:2207)"
    assert route.jumps == (Hop("jump", "10.0.0.2", 22, "bastion", (Path("/etc/keys/jump.key"),), bastion=True),)


def test_values_set_in_fleet_yaml_win_over_the_config(tmp_path):
    route = resolve_route(board_with(tmp_path, ALIASES, user="admin", port=22, key=tmp_path / "id"))
    assert route.target == Hop("gw-7", "10.0.1.7", 22, "admin", (), tmp_path / "id")
    # a bastion keeps its own User, and is offered the board's key after its own IdentityFile
    assert route.jumps[0].user == "bastion"
    assert route.jumps[0].key_files == (Path("/etc/keys/jump.key"), tmp_path / "id")


def test_proxyjump_hops_are_aliases_with_their_own_settings_unless_the_entry_says(tmp_path):
    text = ALIASES.replace("ProxyJump jump", "ProxyJump jump,admin@far:2200, ssh://10.0.3.3")
    jumps = resolve_route(board_with(tmp_path, text)).jumps
    assert [(hop.alias, hop.host, hop.port, hop.user) for hop in jumps] == [
        ("jump", "10.0.0.2", 22, "bastion"),
        ("far", "10.0.2.2", 2200, "admin"),  # the entry's user and port win over the Host block's
        ("10.0.3.3", "10.0.3.3", 22, "everyone"),
    ]
    assert all(hop.bastion for hop in jumps) and jumps[1].known_hosts_name == "[10.0.2.2]:2200"


def test_the_first_hops_own_proxyjump_is_followed_and_a_loop_is_refused(tmp_path):
    chained = ALIASES.replace("Host jump\n", "Host jump\n    ProxyJump far\n")
    assert [hop.alias for hop in resolve_route(board_with(tmp_path, chained)).jumps] == ["far", "jump"]
    looping = ALIASES.replace("Host jump\n", "Host jump\n    ProxyJump jump\n")
    with pytest.raises(
        SshConfigInvalid, match=rf"gw-7: ssh config .*: ProxyJump goes through more than {MAX_HOPS} bastions"
    ):
        resolve_route(board_with(tmp_path, looping))


def test_proxyjump_none_goes_direct(tmp_path):
    text = "Host gw-7\n    ProxyJump none\nHost *\n    ProxyJump jump\n"
    assert resolve_route(board_with(tmp_path, text)).jumps == ()


@pytest.mark.parametrize(
    ("transport", "through_bastion", "expected"),
    [
        (None, True, True),
        (None, False, True),
        ("auto", True, True),
        ("auto", False, False),
        ("ssh", False, True),
        ("direct", True, False),
    ],
)
def test_the_ssh_transport_is_the_default_everywhere(tmp_path, transport, through_bastion, expected):
    settings = {} if transport is None else {"transport": transport}
    board = board_with(tmp_path, ALIASES if through_bastion else None, **settings)
    assert uses_ssh_transport(board) is expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("Host gw-7\n    Port twenty\n", "Host gw-7: Port 'twenty' is not a TCP port (1-65535)"),
        ("Host gw-7\n    Port 70000\n", "Host gw-7: Port '70000' is not a TCP port (1-65535)"),
        ("Host jump\n    Port 0\nHost gw-7\n    ProxyJump jump\n", "Host jump: Port '0' is not a TCP port"),
        ("Host gw-7\n    ProxyJump jump:99999\n", "ProxyJump hop 'jump:99999' is not [user@]host[:port]"),
        ("Host gw-7\n    ProxyJump jump,,far\n", "ProxyJump hop '' is not [user@]host[:port]"),
        ("Host gw-7\n    ProxyJump a b\n", "ProxyJump hop 'a b' is not [user@]host[:port]"),
        ("Host gw-7\n    ProxyCommand nc %h %p\n", "Host gw-7: ProxyCommand is not supported"),
        ("Host gw-7\n  = no key\n", "Unparsable line"),
    ],
    ids=[
        "port-word",
        "port-too-big",
        "bastion-port-zero",
        "jump-port",
        "jump-empty",
        "jump-space",
        "proxycommand",
        "syntax",
    ],
)
def test_values_edgetune_cannot_use_are_refused_naming_the_board_and_file(tmp_path, text, message):
    with pytest.raises(SshConfigInvalid) as err:
        resolve_route(board_with(tmp_path, text))
    assert str(err.value).startswith(f"gw-7: ssh config {tmp_path / 'ssh_config'}: ") and message in str(err.value)


def test_a_config_file_gone_since_the_inventory_was_loaded(tmp_path):
    board = board_with(tmp_path, ALIASES)
    board.ssh.config.unlink()
    with pytest.raises(
        SshConfigInvalid, match=r"gw-7: ssh config .*ssh_config cannot be read \(No such file or directory\)"
    ):
        resolve_route(board)


def test_includes_are_followed_as_openssh_does(tmp_path, home):
    (home / ".ssh" / "boards.conf").write_text("Host gw-7\n    HostName 10.0.1.77\n")  # relative: in ~/.ssh
    (tmp_path / "users.conf").write_text("User from-include\n")
    text = (
        "Include boards.conf\nHost gw-7\n    Include "
        + str(tmp_path / "users.conf")
        + "\n    Port 2277\nHost other\n    Port 1\n"
    )
    target = resolve_route(board_with(tmp_path, text)).target
    assert (target.host, target.user, target.port) == ("10.0.1.77", "from-include", 2277)  # Port stays in gw-7's block


def test_an_include_of_blocks_inside_a_block_is_refused(tmp_path, home):
    (home / ".ssh" / "boards.conf").write_text("Host gw-7\n    HostName 10.0.1.77\n")
    with pytest.raises(
        SshConfigInvalid, match="an Include inside 'Host gw-\\*' names a file with Host or Match blocks"
    ):
        resolve_route(board_with(tmp_path, "Host gw-*\n    Include boards.conf\n"))


def test_an_include_loop_is_refused(tmp_path, home):
    (home / ".ssh" / "loop.conf").write_text("Include loop.conf\n")
    with pytest.raises(SshConfigInvalid, match="Include nests more than 16 files deep"):
        resolve_route(board_with(tmp_path, "Include loop.conf\n"))


def test_without_any_key_the_error_says_where_keys_come_from(tmp_path, monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    board = board_with(tmp_path, "Host gw-7\n    HostName 127.0.0.1\n    IdentityFile missing.key\n")
    with pytest.raises(SshAuthFailed) as err:
        BoardSession(board).run("true")
    assert str(err.value) == (
        f"gw-7: gw-7 (root@127.0.0.1:22): no key to log in with (skipped: private key {tmp_path / 'missing.key'} does "
        "not exist): name one in ssh.key, give the host an IdentityFile in the ssh config, or load one into a running "
        "ssh-agent (SSH_AUTH_SOCK)"
    )


def test_a_named_key_that_is_missing_is_an_error_even_with_an_identity_file(tmp_path):
    board = board_with(tmp_path, "Host gw-7\n    IdentityFile other.key\n", key=tmp_path / "nope")
    with pytest.raises(SshAuthFailed, match=r"gw-7: private key .*/nope does not exist"):
        BoardSession(board).run("true")


USERS = st.text(st.characters(codec="ascii", categories=("L", "N"), include_characters="._-"), min_size=1, max_size=20)
HOSTS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9.-]{0,30}", fullmatch=True)


@given(user=st.none() | USERS, host=HOSTS, port=st.none() | st.integers(1, 65535), scheme=st.booleans())
def test_proxyjump_entries_parse_back(user, host, port, scheme):
    entry = ("ssh://" if scheme else "") + (f"{user}@" if user else "") + host + (f":{port}" if port else "")
    assert parse_jump(entry) == (user, host, port)


@given(st.text(max_size=40))
def test_any_proxyjump_entry_parses_or_is_refused_as_such(entry):
    try:
        _, host, port = parse_jump(entry)
    except ValueError as err:
        assert "is not [user@]host[:port]" in str(err)
    else:
        assert host and (port is None or 1 <= port <= 65535) and "@" not in host


def test_an_ipv6_hop_in_brackets():
    assert parse_jump("ops@[fd00::2]:2222") == ("ops", "fd00::2", 2222)
    assert Hop("x", "fd00::2", 2222, "ops").known_hosts_name == "[fd00::2]:2222"


def test_the_address_the_tracker_lists_a_board_under(tmp_path):
    direct = board_with(tmp_path, None, address="10.40.2.9", transport="direct")
    assert rpc_address(direct) == "10.40.2.9"
    assert rpc_address(board_with(tmp_path, None, address="10.40.2.9", transport="ssh")) == "127.40.2.9"
    assert rpc_address(board_with(tmp_path, ALIASES, transport="direct")) == "10.0.1.7"  # an alias: its HostName
    for address in ("gw-7.plant3.example.net", "10.0.1.7"):  # a name, or an address whose second number is 0
        derived = rpc_address(board_with(tmp_path, None, address=address, transport="ssh"))
        parts = [int(p) for p in derived.split(".")]
        assert parts[0] == 127 and 1 <= parts[1] <= 254 and 1 <= parts[3] <= 254, derived
        assert derived == rpc_address(
            board_with(tmp_path, None, address=address, transport="ssh")
        )  # the same every time, with no state


def test_fleet_up_refuses_boards_the_tracker_would_confuse(spare_fleet_yaml):
    from dataclasses import replace

    from edgetune.fleet.lifecycle import _address_clashes
    from edgetune.inventory import load_fleet

    fleet = load_fleet(spare_fleet_yaml)
    first, second, *rest = (replace(b, ssh=replace(b.ssh, transport="ssh")) for b in fleet.boards)
    fleet = fleet.replace(boards=(first, second, *rest))
    clashing = fleet.replace(boards=(first, replace(second, address="11." + first.address.split(".", 1)[1]), *rest))
    clashes = _address_clashes(list(clashing.boards))
    assert set(clashes) == {first.name, second.name}
    assert (
        f"{second.name}: the tracker would list it under 127." in clashes[second.name]
        and first.name in clashes[second.name]
    )
    assert _address_clashes(list(fleet.boards)) == {}


def test_known_hosts_entries_about_a_host_are_found_among_thousands_and_hashed_ones_too(tmp_path):
    import paramiko

    from edgetune.fleet.ssh import _known_hosts

    plain, hashed = (paramiko.RSAKey.generate(1024) for _ in range(2))
    other = paramiko.RSAKey.generate(1024).get_base64()
    lines = [f"10.9.{i // 250}.{i % 250} ssh-rsa {other}" for i in range(5000)]
    lines += [
        f"10.0.1.7 ssh-rsa {plain.get_base64()}",
        f"{paramiko.HostKeys.hash_host('10.0.1.8')} ssh-rsa {hashed.get_base64()}",
        "# a comment",
        "",
    ]
    (tmp_path / "known_hosts").write_text("\n".join(lines) + "\n")
    board = board_with(tmp_path, None)
    assert _known_hosts(board, {"10.0.1.7"}).lookup("10.0.1.7")["ssh-rsa"] == plain
    assert _known_hosts(board, {"10.0.1.8"}).lookup("10.0.1.8")["ssh-rsa"] == hashed
    assert _known_hosts(board, {"10.0.1.9"}).lookup("10.0.1.9") is None
