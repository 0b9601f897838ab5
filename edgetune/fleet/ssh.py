"""SSH to one board with paramiko: key auth, strict host keys, timeouts, distinct errors.

A `BoardSession` connects lazily on its first command. Host keys are checked against the
inventory's known_hosts file only (never ~/.ssh): an unknown key is refused with the hint to
run `edgetune fleet trust BOARD`; a changed key is always refused, showing both fingerprints.
`fetch_host_key` / `record_host_key` are the two halves of `fleet trust`.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import logging
import os
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

import paramiko

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
from edgetune.inventory.schema import Board

STDERR_TAIL_LINES = 8

# paramiko announces every connection at INFO; our own progress lines say what matters.
logging.getLogger("paramiko").setLevel(logging.WARNING)


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
    """How known_hosts names the board (OpenSSH's `[host]:port` form off port 22)."""
    return board.address if board.ssh.port == 22 else f"[{board.address}]:{board.ssh.port}"


def tail(text: str, lines: int = STDERR_TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


class _RefuseUnknownHost(paramiko.MissingHostKeyPolicy):
    def __init__(self, board: Board):
        self._board = board

    def missing_host_key(self, client, hostname, key):
        raise HostKeyUnknown(
            f"{self._board.name}: host key of {hostname} ({key.get_name()} {fingerprint(key)}) is not in "
            f"{self._board.ssh.known_hosts}; check it, then run `edgetune fleet trust {self._board.name}`"
        )


class BoardSession:
    """One lazily opened SSH connection to a board; use as a context manager."""

    def __init__(self, board: Board):
        self.board = board
        self._client: paramiko.SSHClient | None = None

    def __enter__(self) -> "BoardSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def connect(self) -> paramiko.SSHClient:
        if self._client is None:
            self._client = _connect(self.board)
        return self._client

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
        except (socket.timeout, TimeoutError):
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
        """Write `data` to `remote_path` on the board atomically (temp name, chmod, rename),
        creating its directory."""
        client = self.connect()
        directory = remote_path.rsplit("/", 1)[0] or "/"
        self.run(f"mkdir -p {shlex.quote(directory)}")
        tmp = f"{remote_path}.tmp-{os.getpid()}"
        try:
            with client.open_sftp() as sftp:
                with sftp.open(tmp, "wb") as out:
                    out.chmod(mode)
                    out.write(data)
                sftp.posix_rename(tmp, remote_path)
        except (paramiko.SSHException, OSError) as err:
            self.close()
            raise SshUnreachable(f"{self.board.name}: writing {remote_path} failed: {err}") from None


def _connect(board: Board) -> paramiko.SSHClient:
    ssh = board.ssh
    client = paramiko.SSHClient()
    if ssh.known_hosts is not None and ssh.known_hosts.exists():
        client.load_host_keys(str(ssh.known_hosts))
    client.set_missing_host_key_policy(_RefuseUnknownHost(board))
    where = f"{board.name}: {ssh.user}@{board.address}:{ssh.port}"
    try:
        client.connect(
            board.address,
            port=ssh.port,
            username=ssh.user,
            pkey=_private_key(board),
            timeout=ssh.connect_timeout_s,
            banner_timeout=ssh.connect_timeout_s,
            auth_timeout=ssh.connect_timeout_s,
            allow_agent=False,
            look_for_keys=False,
        )
    except paramiko.BadHostKeyException as err:
        client.close()
        raise HostKeyMismatch(
            f"{board.name}: HOST KEY CHANGED for {board.address}: known_hosts ({ssh.known_hosts}) has "
            f"{fingerprint(err.expected_key)}, the board now offers {fingerprint(err.key)}. Refused: this is "
            "what a man-in-the-middle looks like. If the board was really reinstalled, remove the old entry "
            f"(ssh-keygen -R {known_hosts_name(board)} -f {ssh.known_hosts}) and run `edgetune fleet trust {board.name}`"
        ) from None
    except paramiko.AuthenticationException as err:
        client.close()
        raise SshAuthFailed(f"{where}: authentication failed with key {ssh.key}: {err}") from None
    except paramiko.ssh_exception.NoValidConnectionsError:
        client.close()
        raise SshConnectRefused(f"{where}: connection refused (is sshd running on the board?)") from None
    except (socket.timeout, TimeoutError):
        client.close()
        raise SshTimeout(f"{where}: no answer within {ssh.connect_timeout_s:g} s (board down or link down?)") from None
    except HostKeyUnknown:
        client.close()
        raise
    except OSError as err:
        client.close()
        if err.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            raise SshUnreachable(f"{where}: unreachable ({os.strerror(err.errno)})") from None
        raise SshUnreachable(f"{where}: {err}") from None
    except paramiko.SSHException as err:
        transport = client.get_transport()
        spoke = transport is not None and bool(transport.remote_version)
        client.close()
        if not spoke:
            raise SshTimeout(f"{where}: no SSH banner within {ssh.connect_timeout_s:g} s (not an SSH server, or overloaded)") from None
        raise SshUnreachable(f"{where}: SSH handshake failed: {err}") from None
    return client


def _private_key(board: Board) -> paramiko.PKey:
    ssh = board.ssh
    passphrase = os.environ.get(ssh.passphrase_env) if ssh.passphrase_env else None
    try:
        return paramiko.PKey.from_path(ssh.key, password=passphrase)
    except FileNotFoundError:
        raise SshAuthFailed(f"{board.name}: private key {ssh.key} does not exist") from None
    except (paramiko.PasswordRequiredException, TypeError):  # TypeError: from cryptography, same meaning
        hint = f"set {ssh.passphrase_env}" if ssh.passphrase_env else "name the variable holding it in ssh.passphrase_env"
        raise SshAuthFailed(f"{board.name}: private key {ssh.key} is encrypted; {hint}") from None
    except (paramiko.SSHException, ValueError) as err:
        raise SshAuthFailed(f"{board.name}: cannot read private key {ssh.key} (wrong passphrase?): {err}") from None


def fetch_host_key(board: Board) -> paramiko.PKey:
    """The host key the board offers, read without authenticating."""
    where = f"{board.name}: {board.address}:{board.ssh.port}"
    try:
        sock = socket.create_connection((board.address, board.ssh.port), timeout=board.ssh.connect_timeout_s)
    except ConnectionRefusedError:
        raise SshConnectRefused(f"{where}: connection refused (is sshd running on the board?)") from None
    except (socket.timeout, TimeoutError):
        raise SshTimeout(f"{where}: no answer within {board.ssh.connect_timeout_s:g} s") from None
    except OSError as err:
        raise SshUnreachable(f"{where}: {err}") from None
    transport = paramiko.Transport(sock)
    try:
        transport.start_client(timeout=board.ssh.connect_timeout_s)
        return transport.get_remote_server_key()
    except paramiko.SSHException as err:
        raise SshUnreachable(f"{where}: SSH handshake failed: {err}") from None
    finally:
        transport.close()


def record_host_key(board: Board, key: paramiko.PKey) -> bool:
    """Append the board's key to known_hosts; False if it was there already. Any other key
    recorded for the board, of any type, is never replaced nor joined (HostKeyMismatch)."""
    if board.ssh.known_hosts is None:
        raise FleetError(f"{board.name}: no known_hosts file is set (ssh.known_hosts in the fleet file): set one to trust boards")
    path = Path(board.ssh.known_hosts)
    name = known_hosts_name(board)
    try:
        known = paramiko.HostKeys(str(path)) if path.exists() else paramiko.HostKeys()
    except (OSError, paramiko.SSHException) as err:
        raise FleetError(f"{board.name}: cannot read known_hosts {path}: {err}") from None
    recorded = list((known.lookup(name) or {}).values())
    if any(other == key for other in recorded):
        return False
    if recorded:
        shown = ", ".join(f"{k.get_name()} {fingerprint(k)}" for k in recorded)
        raise HostKeyMismatch(
            f"{board.name}: known_hosts already has {shown} for {name}, the board offers {key.get_name()} "
            f"{fingerprint(key)}; refused. If the board was really reinstalled, remove the old entry first: "
            f"ssh-keygen -R {name} -f {path}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(f"{name} {key.get_name()} {key.get_base64()}\n")
    return True
