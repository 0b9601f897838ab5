"""SSH sessions to boards with paramiko: through the bastions an ssh config names, with key
auth (the named key, IdentityFile, a running ssh-agent), strict host keys on every hop,
timeouts and distinct errors.

A `BoardSession` connects lazily on its first command, hop by hop along the board's route
(ssh_route.py): it logs in to each bastion, opens a `direct-tcpip` channel from it to the next
hop, and speaks SSH to that hop over the channel. Each hop is offered the keys its route
names, then a running ssh-agent's (SSH_AUTH_SOCK). Every hop's host key is checked against the
inventory's known_hosts file only (never ~/.ssh): an unknown key is refused with the hint to
run `edgetune fleet trust BOARD`; a changed key is always refused, showing both fingerprints
and naming the hop. Every error names the board and the hop (`gw-7: via bastion jump
(root@10.0.0.2:22): connection refused (is sshd running on the bastion?)`) and is a
FleetError, so a fleet operation reports it for that board and goes on with the others.
Closing the session closes every hop's connection, the board's first.
`fetch_host_keys` / `record_host_keys` are the two halves of `fleet trust`, bastions included.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import logging
import os
import secrets
import shlex
import socket
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import paramiko
from paramiko.auth_strategy import AuthStrategy, InMemoryPrivateKey
from paramiko.common import OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED
from paramiko.hostkeys import HostKeyEntry

from edgetune.errors import FleetError
from edgetune.fleet.errors import (
    CommandFailed,
    HostKeyMismatch,
    HostKeyUnknown,
    SshAuthFailed,
    SshConnectRefused,
    SshTimeout,
    SshUnreachable,
)
from edgetune.fleet.ssh_route import Hop, Route, resolve_route
from edgetune.inventory.schema import Board

STDERR_TAIL_LINES = 8

HOP_LOG_CHANNEL = "paramiko.transport.edgetune"

# paramiko announces every connection at INFO; our own progress lines say what matters.
logging.getLogger("paramiko").setLevel(logging.WARNING)
logging.getLogger(HOP_LOG_CHANNEL).addFilter(lambda record: "open FAILED" not in record.getMessage())


@dataclass(frozen=True)
class CommandResult:
    exit_status: int
    stdout: str
    stderr: str


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint, e.g. `SHA256:3q2+7w...`."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def known_hosts_name(board: Board) -> str:
    """How known_hosts names the board: its resolved HostName, `[host]:port` off port 22."""
    return resolve_route(board).target.known_hosts_name


def tail(text: str, lines: int = STDERR_TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


class BoardSession:
    """One lazily opened SSH connection to a board (through its bastions); a context manager."""

    def __init__(self, board: Board):
        self.board = board
        self._clients: list[paramiko.SSHClient] = []  # the bastions', this host's side first, then the board's

    def __enter__(self) -> BoardSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        _close_all(self._clients)
        self._clients = []

    def connect(self) -> paramiko.SSHClient:
        if not self._clients:
            self._clients = _connect(self.board)
        return self._clients[-1]

    def run(self, command: str, check: bool = True, timeout: float | None = None) -> CommandResult:
        """Run `command` in the board's login shell. `timeout` (default: the inventory's
        command timeout) bounds each wait for output. `check` raises CommandFailed on exit != 0."""
        client = self.connect()
        timeout = timeout or self.board.ssh.command_timeout_s
        try:
            channel = client.get_transport().open_session(timeout=timeout)
            channel.settimeout(timeout)
            channel.exec_command(command)
            stdout = channel.makefile("rb").read().decode(errors="replace")
            stderr = channel.makefile_stderr("rb").read().decode(errors="replace")
            result = CommandResult(channel.recv_exit_status(), stdout, stderr)
        except TimeoutError:
            self.close()
            raise SshTimeout(f"{self.board.name}: command timed out after {timeout:g} s: {command}") from None
        except (paramiko.SSHException, OSError) as err:
            self.close()
            raise SshUnreachable(f"{self.board.name}: connection lost running `{command}`: {err}") from None
        if check and result.exit_status != 0:
            raise CommandFailed(
                f"{self.board.name}: `{command}` exited with status {result.exit_status}:\n{tail(result.stderr)}"
            )
        return result

    def put_file(self, remote_path: str, data: bytes, mode: int = 0o644) -> None:
        """Write `data` to `remote_path` on the board atomically, creating its directory: written
        and given `mode` inside a fresh directory only the login user can enter, then renamed
        into place, so no other user of the board can open it before it has its mode."""
        client = self.connect()
        directory, name = remote_path.rsplit("/", 1) if "/" in remote_path else (".", remote_path)
        private = f"{directory or '/'}/.edgetune-put-{os.getpid()}-{secrets.token_hex(4)}"
        self.run(f"mkdir -p {shlex.quote(directory or '/')} && mkdir -m 700 {shlex.quote(private)}")
        try:
            with client.open_sftp() as sftp:
                try:
                    with sftp.open(f"{private}/{name}", "wb") as out:
                        out.chmod(mode)
                        out.write(data)
                    sftp.posix_rename(f"{private}/{name}", remote_path)
                finally:
                    sftp.rmdir(private)
        except (paramiko.SSHException, OSError) as err:
            self.close()
            raise SshUnreachable(f"{self.board.name}: writing {remote_path} failed: {err}") from None


def _connect(board: Board) -> list[paramiko.SSHClient]:
    """Log in to every hop of the board's route in turn: the bastions' clients, then the board's."""
    route = resolve_route(board)
    clients: list[paramiko.SSHClient] = []
    with _agent_keys(board) as agent:
        try:
            sock = _through_bastions(board, route, _RefuseUnknownHost, agent, clients)
            clients.append(_login(board, route.target, sock, _RefuseUnknownHost, agent))
        except BaseException:
            _close_all(clients)
            raise
    return clients


def _through_bastions(
    board: Board,
    route: Route,
    policy: type[_HostKeyPolicy],
    agent: Sequence[paramiko.PKey],
    clients: list[paramiko.SSHClient],
) -> paramiko.Channel | None:
    """Log in to each bastion (its client appended to `clients`) over a channel from the one
    before; return a channel from the last one to the board (None: no bastion, go direct)."""
    sock = None
    for hop, next_hop in zip(route.jumps, route.hops[1:]):
        clients.append(_login(board, hop, sock, policy, agent))
        sock = _tunnel(board, hop, clients[-1], next_hop)
    return sock


def _close_all(clients: Sequence[paramiko.SSHClient]) -> None:
    """The board's connection first, then each bastion's back towards this host."""
    for client in reversed(clients):
        client.close()


def _where(board: Board, hop: Hop) -> str:
    return f"{board.name}: via bastion {hop}" if hop.bastion else f"{board.name}: {hop}"


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """What to do with a hop whose host key known_hosts does not hold (a changed one is
    always refused, by paramiko: BadHostKeyException)."""

    def __init__(self, board: Board, hop: Hop | None = None):
        self._board = board
        self._role = hop.role if hop is not None else "board"


class _RefuseUnknownHost(_HostKeyPolicy):
    def missing_host_key(self, client, hostname, key):
        raise HostKeyUnknown(
            f"{self._board.name}: host key of {self._role} {hostname} ({key.get_name()} {fingerprint(key)}) is not in "
            f"{self._board.ssh.known_hosts}; check it, then run `edgetune fleet trust {self._board.name}`"
        )


class _HopTransport(paramiko.Transport):
    """A Transport that keeps the server's own words when it refuses to open a channel (sshd
    says `Connection refused`, `No route to host`...; paramiko keeps only the reason code).
    Should paramiko rename the hook, messages fall back to the code's text. It logs to its own
    channel, where paramiko's line about that refusal is dropped: our error says it, per board."""

    open_failure = ""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.set_log_channel(HOP_LOG_CHANNEL)

    def _parse_channel_open_failure(self, m):
        m.get_int()  # the channel
        m.get_int()  # the reason code
        self.open_failure = m.get_text()
        m.rewind()
        super()._parse_channel_open_failure(m)


class _OfferKeys(AuthStrategy):
    """Public-key authentication with these keys, in order, until the server takes one."""

    def __init__(self, user: str, keys: Sequence[paramiko.PKey]):
        super().__init__(ssh_config=None)
        self._sources = [InMemoryPrivateKey(user, key) for key in keys]

    def get_sources(self):
        return iter(self._sources)


def _login(
    board: Board,
    hop: Hop,
    sock: paramiko.Channel | None,
    policy: type[_HostKeyPolicy],
    agent: Sequence[paramiko.PKey],
    verified_key: paramiko.PKey | None = None,
) -> paramiko.SSHClient:
    """An authenticated client of `hop`, over `sock` (a channel from the bastion before it) or
    a TCP connection of its own; `verified_key`: the hop's key as the operator just accepted it."""
    keys, offered = _keys_for(board, hop, agent)
    client = paramiko.SSHClient()
    known = _known_hosts(board, {hop.known_hosts_name}, into=client.get_host_keys())
    if verified_key is not None:
        known.add(hop.known_hosts_name, verified_key.get_name(), verified_key)
    client.set_missing_host_key_policy(policy(board, hop))
    timeout = board.ssh.connect_timeout_s
    try:
        client.connect(
            hop.host,
            port=hop.port,
            username=hop.user,
            sock=sock or _tcp(board, hop),
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            auth_strategy=_OfferKeys(hop.user, keys),
            transport_factory=_HopTransport,
        )
    except (paramiko.SSHException, OSError, EOFError, FleetError) as err:
        transport = client.get_transport()
        spoke = transport is not None and bool(transport.remote_version)
        client.close()
        raise _login_failure(board, hop, err, spoke, offered) from None
    return client


def _login_failure(board: Board, hop: Hop, err: Exception, spoke: bool, offered: str) -> FleetError:
    where, timeout = _where(board, hop), board.ssh.connect_timeout_s
    if isinstance(err, FleetError):
        return err
    if isinstance(err, paramiko.BadHostKeyException):
        return _changed_key(board, hop, err.expected_key, err.key)
    if isinstance(err, paramiko.AuthenticationException):
        return SshAuthFailed(f"{where}: authentication failed with {offered}")
    if not spoke:
        return SshTimeout(f"{where}: no SSH banner within {timeout:g} s (not an SSH server, or overloaded)")
    if isinstance(err, TimeoutError) or "No existing session" in str(
        err
    ):  # paramiko's words for a key exchange cut short
        return SshTimeout(f"{where}: no answer within {timeout:g} s during the SSH handshake")
    return SshUnreachable(f"{where}: SSH handshake failed: {err}")


def _changed_key(board: Board, hop: Hop, recorded: paramiko.PKey, offered: paramiko.PKey) -> HostKeyMismatch:
    known_hosts = board.ssh.known_hosts
    return HostKeyMismatch(
        f"{board.name}: HOST KEY CHANGED for {hop.role} {hop.known_hosts_name}: known_hosts ({known_hosts}) has "
        f"{fingerprint(recorded)}, the {hop.role} now offers {fingerprint(offered)}. Refused: this is what a "
        f"man-in-the-middle looks like. If the {hop.role} was really reinstalled, remove the old entry "
        f"(ssh-keygen -R {hop.known_hosts_name} -f {known_hosts}) and run `edgetune fleet trust {board.name}`"
    )


def _tcp(board: Board, hop: Hop) -> socket.socket:
    """A TCP connection from this host to `hop`."""
    where, timeout = _where(board, hop), board.ssh.connect_timeout_s
    try:
        return socket.create_connection((hop.host, hop.port), timeout=timeout)
    except ConnectionRefusedError:
        raise SshConnectRefused(f"{where}: connection refused (is sshd running on the {hop.role}?)") from None
    except TimeoutError:
        raise SshTimeout(f"{where}: no answer within {timeout:g} s ({hop.role} down or link down?)") from None
    except socket.gaierror as err:
        raise SshUnreachable(
            f"{where}: cannot resolve {hop.host} ({err.strerror}); is it a Host alias of the ssh config?"
        ) from None
    except OSError as err:
        if err.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            raise SshUnreachable(f"{where}: unreachable ({os.strerror(err.errno)})") from None
        raise SshUnreachable(f"{where}: {err}") from None


def _tunnel(board: Board, bastion: Hop, client: paramiko.SSHClient, next_hop: Hop) -> paramiko.Channel:
    """A `direct-tcpip` channel from the bastion to the next hop's SSH port."""
    transport = client.get_transport()
    where = f"{_where(board, bastion)}: cannot reach the {next_hop.role} at {next_hop.host}:{next_hop.port}"
    try:
        return transport.open_channel(
            "direct-tcpip", (next_hop.host, next_hop.port), ("127.0.0.1", 0), timeout=board.ssh.connect_timeout_s
        )
    except paramiko.ChannelException as err:
        raise _tunnel_failure(where, next_hop, err, transport.open_failure) from None
    except (paramiko.SSHException, OSError, EOFError) as err:
        if "Timeout" in str(err):
            raise SshTimeout(f"{where}: no answer within {board.ssh.connect_timeout_s:g} s") from None
        raise SshUnreachable(f"{where}: the bastion's connection was lost ({err})") from None


def _tunnel_failure(where: str, next_hop: Hop, err: paramiko.ChannelException, reason: str) -> FleetError:
    """The bastion's refusal to open a channel, by the reason its sshd gave."""
    if err.code == OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED:
        return SshUnreachable(
            f"{where}: the bastion does not forward connections (AllowTcpForwarding no?): {reason or err.text}"
        )
    if "refused" in reason.lower():
        return SshConnectRefused(f"{where}: connection refused (is sshd running on the {next_hop.role}?)")
    if "timed out" in reason.lower():
        return SshTimeout(f"{where}: no answer ({next_hop.role} down or link down?)")
    return SshUnreachable(f"{where}: {reason or err.text}")


@contextmanager
def _agent_keys(board: Board) -> Iterator[tuple[paramiko.PKey, ...]]:
    """The keys of a running ssh-agent (SSH_AUTH_SOCK; none without one), for as long as the
    hops need them to sign."""
    try:
        agent = paramiko.Agent()
    except paramiko.SSHException as err:
        raise SshAuthFailed(
            f"{board.name}: the ssh-agent at SSH_AUTH_SOCK does not answer as an ssh-agent: {err}"
        ) from None
    try:
        yield agent.get_keys()
    finally:
        agent.close()


def _keys_for(board: Board, hop: Hop, agent: Sequence[paramiko.PKey]) -> tuple[list[paramiko.PKey], str]:
    """The keys to offer `hop`, in order, and how an authentication failure names them. A named
    key must be readable; an IdentityFile that is not is skipped, and said so if none is taken."""
    keys, offered, skipped = [], [], []
    if hop.named_key is not None:
        keys.append(_private_key(board, hop.named_key))
        offered.append(f"key {hop.named_key}")
    for path in hop.key_files:
        try:
            keys.append(_private_key(board, path))
            offered.append(f"key {path}")
        except SshAuthFailed as err:
            skipped.append(str(err).removeprefix(f"{board.name}: "))
    if agent:
        keys += agent
        offered.append(f"{len(agent)} key(s) of the ssh-agent")
    notes = f" (skipped: {'; '.join(skipped)})" if skipped else ""
    if not keys:
        raise SshAuthFailed(
            f"{_where(board, hop)}: no key to log in with{notes}: name one in ssh.key, give the host an IdentityFile "
            "in the ssh config, or load one into a running ssh-agent (SSH_AUTH_SOCK)"
        )
    return keys, " and ".join(offered) + notes


def _private_key(board: Board, path: Path) -> paramiko.PKey:
    ssh = board.ssh
    passphrase = os.environ.get(ssh.passphrase_env) if ssh.passphrase_env else None
    try:
        return paramiko.PKey.from_path(path, password=passphrase)
    except FileNotFoundError:
        raise SshAuthFailed(f"{board.name}: private key {path} does not exist") from None
    except (paramiko.PasswordRequiredException, TypeError):  # TypeError: from cryptography, same meaning
        hint = (
            f"set {ssh.passphrase_env}" if ssh.passphrase_env else "name the variable holding it in ssh.passphrase_env"
        )
        raise SshAuthFailed(f"{board.name}: private key {path} is encrypted; {hint}") from None
    except (paramiko.SSHException, ValueError, OSError) as err:
        raise SshAuthFailed(f"{board.name}: cannot read private key {path} (wrong passphrase?): {err}") from None


def fetch_host_keys(board: Board, bastion_fingerprints: Collection[str] = ()) -> list[tuple[Hop, paramiko.PKey]]:
    """Every hop's host key, this host's side first, the board's last, each read before anything
    is offered to that hop. A bastion's must be recorded in known_hosts already or have one of
    `bastion_fingerprints` (else HostKeyUnknown, nothing offered to it) before edgetune logs in to
    it to go further; the board's is read without authenticating."""
    route = resolve_route(board)
    clients: list[paramiko.SSHClient] = []
    keys: list[tuple[Hop, paramiko.PKey]] = []
    with _agent_keys(board) as agent:
        try:
            for index, hop in enumerate(route.hops):
                key = _read_host_key(board, hop, _open_to(board, route, index, clients))
                keys.append((hop, key))
                if hop.bastion:
                    _check_bastion_key(board, hop, key, bastion_fingerprints)
                    sock = _open_to(board, route, index, clients)
                    clients.append(_login(board, hop, sock, _RefuseUnknownHost, agent, verified_key=key))
            return keys
        finally:
            _close_all(clients)


def _open_to(board: Board, route: Route, index: int, clients: Sequence[paramiko.SSHClient]) -> paramiko.Channel | None:
    """A new way to the route's hop `index`: a channel from the bastion before it (whose client
    is the last of `clients`), or None for a TCP connection of its own."""
    return None if index == 0 else _tunnel(board, route.hops[index - 1], clients[-1], route.hops[index])


def _check_bastion_key(board: Board, hop: Hop, key: paramiko.PKey, bastion_fingerprints: Collection[str]) -> None:
    """A bastion's key is recorded, or the operator named its fingerprint; else refused."""
    known = _known_hosts(board, {hop.known_hosts_name})
    recorded = list((known.lookup(hop.known_hosts_name) or {}).values())
    if any(other == key for other in recorded):
        return
    if recorded:
        raise _changed_key(board, hop, recorded[0], key)
    if _bare(fingerprint(key)) in {_bare(given) for given in bastion_fingerprints}:
        return
    raise HostKeyUnknown(
        f"{board.name}: bastion {hop} offers {key.get_name()} {fingerprint(key)}, which {board.ssh.known_hosts} does not "
        "hold; nothing was offered to it. Check that fingerprint against the bastion's own (on it: ssh-keygen -lf "
        f"/etc/ssh/ssh_host_ed25519_key.pub), then run `edgetune fleet trust {board.name} --bastion-fingerprint "
        f"{fingerprint(key)}`"
    )


def _bare(text: str) -> str:
    return text.strip().removeprefix("SHA256:")


def _known_hosts(board: Board, names: Collection[str], into: paramiko.HostKeys | None = None) -> paramiko.HostKeys:
    """The known_hosts entries that can be about `names` (the lines naming one of them, and
    hashed ones), added to `into`. The other lines are not parsed: paramiko's own load checks
    each entry against all before it, seconds for a file of 10,000 boards, at every connect."""
    keys = paramiko.HostKeys() if into is None else into
    path = board.ssh.known_hosts
    try:
        lines = Path(path).read_text().splitlines() if path is not None and Path(path).exists() else []
        for number, line in enumerate(lines, 1):
            hosts = line.split(None, 1)[0].split(",") if line.strip() else []
            if any(host in names or host.startswith(("|1|", "@")) for host in hosts):
                entry = HostKeyEntry.from_line(line, number)
                for hostname in entry.hostnames if entry is not None and entry.key is not None else ():
                    keys.add(hostname, entry.key.get_name(), entry.key)
    except (OSError, UnicodeDecodeError, paramiko.SSHException) as err:
        raise FleetError(f"{board.name}: cannot read known_hosts {path}: {err}") from None
    return keys


def fetch_host_key(board: Board) -> paramiko.PKey:
    """The host key the board itself offers (through its bastions), read without authenticating."""
    return fetch_host_keys(board)[-1][1]


def _read_host_key(board: Board, hop: Hop, sock: paramiko.Channel | None) -> paramiko.PKey:
    transport = paramiko.Transport(sock or _tcp(board, hop))
    try:
        transport.start_client(timeout=board.ssh.connect_timeout_s)
        return transport.get_remote_server_key()
    except (paramiko.SSHException, EOFError) as err:
        raise SshUnreachable(f"{_where(board, hop)}: SSH handshake failed: {err}") from None
    finally:
        transport.close()


def record_host_key(board: Board, key: paramiko.PKey) -> bool:
    """`record_host_keys` of the board's own key."""
    return record_host_keys(board, [(resolve_route(board).target, key)])[0]


def record_host_keys(board: Board, keys: Sequence[tuple[Hop, paramiko.PKey]]) -> list[bool]:
    """Append each hop's key to known_hosts under the hop's name; per hop, False if it was there
    already. A hop with any other key recorded, of any type, is refused (HostKeyMismatch)
    before anything is written: a recorded key is never replaced nor joined."""
    if board.ssh.known_hosts is None:
        raise FleetError(
            f"{board.name}: no known_hosts file is set (ssh.known_hosts in the fleet file): set one to trust boards"
        )
    path = Path(board.ssh.known_hosts)
    known = _known_hosts(board, {hop.known_hosts_name for hop, _ in keys})
    new = [_is_new(board, known, hop, key) for hop, key in keys]
    lines = [
        f"{hop.known_hosts_name} {key.get_name()} {key.get_base64()}\n" for (hop, key), fresh in zip(keys, new) if fresh
    ]
    if lines:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            out.writelines(lines)
    return new


def _is_new(board: Board, known: paramiko.HostKeys, hop: Hop, key: paramiko.PKey) -> bool:
    """Whether `key` is still to be recorded for `hop` (noted in `known`); HostKeyMismatch if
    another key is recorded for it."""
    name = hop.known_hosts_name
    recorded = list((known.lookup(name) or {}).values())
    if any(other == key for other in recorded):
        return False
    if recorded:
        shown = ", ".join(f"{k.get_name()} {fingerprint(k)}" for k in recorded)
        raise HostKeyMismatch(
            f"{board.name}: known_hosts already has {shown} for {name}, the {hop.role} offers {key.get_name()} "
            f"{fingerprint(key)}; refused. If the {hop.role} was really reinstalled, remove the old entry first: "
            f"ssh-keygen -R {name} -f {board.ssh.known_hosts}"
        )
    known.add(name, key.get_name(), key)
    return True
