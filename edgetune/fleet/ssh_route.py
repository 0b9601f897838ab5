"""Where a board is reached: the SSH hops from this host to it, resolved from fleet.yaml and
an OpenSSH client config file. Resolution only: nothing here opens a connection (ssh.py does).

The config file is the board's `ssh.config` (the loader makes it ~/.ssh/config when that
exists and nothing else is named; `none`: no file). Precedence is OpenSSH's: a value set in
fleet.yaml (`ssh.user`, `ssh.port`, `ssh.key`) wins, the config file fills what fleet.yaml
leaves unset, and `root` and port 22 come last. A board's `address` may be a Host alias.

Keywords honoured: HostName, User, Port, IdentityFile, ProxyJump, and Include (followed
here, since paramiko does not: a relative name is taken in ~/.ssh, as OpenSSH does).
ProxyJump is `none` or comma-separated hops `[user@]host[:port]` (or `ssh://...`), the host's
side first; each hop is looked up as a Host alias in turn (HostName, User, Port,
IdentityFile), and the first hop's own ProxyJump is followed, as `ssh -J` does. ProxyCommand
is refused (it would reach the board by a way this module cannot check); other keywords are
ignored.

Keys: the board is offered `ssh.key` if named, else its IdentityFile(s); a bastion its own
IdentityFile(s), then `ssh.key`; a relative IdentityFile is taken in the config file's folder.
ssh.py offers a running ssh-agent's keys to every hop after those.

Known_hosts names every hop as OpenSSH does by default: by its resolved HostName (not the
alias), written `[host]:port` off port 22. HostKeyAlias is not honoured.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

from edgetune.fleet.errors import SshConfigInvalid
from edgetune.inventory.schema import Board

DEFAULT_USER = "root"
DEFAULT_PORT = 22
MAX_HOPS = 8  # bastions on the way to one board
MAX_INCLUDE_DEPTH = 16  # OpenSSH's own limit

_INCLUDE = re.compile(r"\s*include(?:\s*=\s*|\s+)(.+)", re.IGNORECASE)
_BLOCK = re.compile(r"^\s*(?:host|match)(?:\s*=\s*|\s+)", re.IGNORECASE | re.MULTILINE)
_HOP = re.compile(
    r"(?:ssh://)?(?:(?P<user>[^@\s/]+)@)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(?P<port>[0-9]{1,5}))?"
)


@dataclass(frozen=True)
class Hop:
    """One SSH server on the way: a bastion, or the board itself."""

    alias: str  # as written: the board's address, or a ProxyJump entry's host
    host: str  # where it is: the config's HostName, else the alias
    port: int
    user: str
    key_files: tuple[Path, ...] = ()  # tried in order; a missing or unreadable one is skipped
    named_key: Path | None = None  # the board's ssh.key: it must be readable
    bastion: bool = False

    @property
    def role(self) -> str:
        return "bastion" if self.bastion else "board"

    @property
    def known_hosts_name(self) -> str:
        return self.host if self.port == DEFAULT_PORT else f"[{self.host}]:{self.port}"

    def __str__(self) -> str:
        address = f"{self.user}@{self.host}:{self.port}"
        return address if self.alias == self.host else f"{self.alias} ({address})"


@dataclass(frozen=True)
class Route:
    jumps: tuple[Hop, ...]  # the bastions, this host's side first
    target: Hop

    @property
    def hops(self) -> tuple[Hop, ...]:
        return (*self.jumps, self.target)


def resolve_route(board: Board) -> Route:
    """The hops to `board`; SshConfigInvalid names the board, the file and the value at fault."""
    config = _Config(board)
    ssh = board.ssh
    options = config.lookup(board.address)
    target = Hop(
        alias=board.address,
        host=options.get("hostname", board.address),
        port=ssh.port or config.port(board.address, options.get("port")) or DEFAULT_PORT,
        user=ssh.user or options.get("user") or DEFAULT_USER,
        key_files=() if ssh.key else config.identity_files(options),
        named_key=ssh.key,
    )
    return Route(config.jumps(options.get("proxyjump")), target)


def network_address(board: Board) -> str:
    """Where other machines reach the board (its rpc_server registers under it): the config's
    HostName when the board's address is a Host alias, else the address itself."""
    return resolve_route(board).target.host


def uses_ssh_transport(board: Board) -> bool:
    """Whether the tracker and RPC reach the board over its SSH connection (fleet/tunnel.py):
    `ssh.transport: ssh` (the default), or `auto` for a board reached through a bastion."""
    transport = board.ssh.transport
    return transport == "ssh" or (transport == "auto" and bool(resolve_route(board).jumps))


def rpc_address(board: Board) -> str:
    """The address the tracker lists the board's rpc_server under, derived from the inventory
    alone: its network address for the direct transport; for the SSH transport an address of this
    host's 127/8 that stands for the board (its keeper's forward listens there): 127.B.C.D for a
    board at A.B.C.D (B not 0), else three bytes of a hash of its name and address."""
    address = network_address(board)
    if not uses_ssh_transport(board):
        return address
    parts = address.split(".")
    if len(parts) == 4 and all(p.isdigit() and int(p) <= 255 for p in parts) and int(parts[1]) != 0:
        return "127." + ".".join(parts[1:])
    digest = hashlib.sha256(f"{board.name} {address}".encode()).digest()
    return f"127.{digest[0] % 254 + 1}.{digest[1]}.{digest[2] % 254 + 1}"


def parse_jump(entry: str) -> tuple[str | None, str, int | None]:
    """A ProxyJump hop `[user@]host[:port]` (or `ssh://...`, or `[v6 address]:port`) as
    (user, host, port); ValueError if it is none of these."""
    match = _HOP.fullmatch(entry.strip())
    port = int(match["port"]) if match and match["port"] else None
    if match is None or (port is not None and not 1 <= port <= 65535):
        raise ValueError(f"ProxyJump hop '{entry.strip()}' is not [user@]host[:port] (port 1-65535)")
    return match["user"], match["host"].strip("[]"), port


class _Config:
    """The board's ssh config file, looked up host by host (nothing at all without a file)."""

    def __init__(self, board: Board):
        self.board = board
        self.path = board.ssh.config
        self._parsed = self._parse() if self.path is not None else None

    def error(self, message: str) -> SshConfigInvalid:
        return SshConfigInvalid(f"{self.board.name}: ssh config {self.path}: {message}")

    def lookup(self, alias: str) -> dict[str, Any]:
        if self._parsed is None:
            return {}
        try:
            options = self._parsed.lookup(alias)
        except (paramiko.SSHException, OSError, ValueError) as err:
            raise self.error(f"Host {alias}: {err}") from None
        if options.get("proxycommand"):
            raise self.error(
                f"Host {alias}: ProxyCommand is not supported (edgetune checks every hop's host key "
                "itself); reach the board with ProxyJump instead"
            )
        return options

    def port(self, alias: str, value: str | None) -> int | None:
        if value is None:
            return None
        if not value.isdigit() or not 1 <= int(value) <= 65535:
            raise self.error(f"Host {alias}: Port '{value}' is not a TCP port (1-65535)")
        return int(value)

    def identity_files(self, options: dict[str, Any]) -> tuple[Path, ...]:
        return tuple(self.path.parent / Path(name).expanduser() for name in options.get("identityfile", ()))

    def jumps(self, spec: str | None, hops_so_far: int = 0) -> tuple[Hop, ...]:
        """The bastions a ProxyJump value names, behind those the first one's own ProxyJump names."""
        if spec is None or spec.strip().lower() == "none":
            return ()
        hops = tuple(self.jump(entry) for entry in spec.split(","))
        if hops_so_far + len(hops) > MAX_HOPS:
            raise self.error(f"ProxyJump goes through more than {MAX_HOPS} bastions (does it loop?): {spec}")
        first = self.lookup(hops[0].alias).get("proxyjump")
        return (*self.jumps(first, hops_so_far + len(hops)), *hops)

    def jump(self, entry: str) -> Hop:
        try:
            user, alias, port = parse_jump(entry)
        except ValueError as err:
            raise self.error(str(err)) from None
        options = self.lookup(alias)
        key_files = self.identity_files(options)
        named = self.board.ssh.key
        return Hop(
            alias=alias,
            host=options.get("hostname", alias),
            port=port or self.port(alias, options.get("port")) or DEFAULT_PORT,
            user=user or options.get("user") or DEFAULT_USER,
            key_files=key_files + ((named,) if named is not None and named not in key_files else ()),
            bastion=True,
        )

    def _parse(self) -> paramiko.SSHConfig:
        try:
            return paramiko.SSHConfig.from_text(self._text(self.path, 0))
        except paramiko.ssh_exception.ConfigParseError as err:
            raise self.error(str(err)) from None

    def _text(self, path: Path, depth: int) -> str:
        """The file's text with each Include line replaced by the text of the files it names
        (globs, in sorted order) and the enclosing Host or Match line repeated after them, so
        that what follows stays in its block, as in OpenSSH."""
        if depth > MAX_INCLUDE_DEPTH:
            raise self.error(f"Include nests more than {MAX_INCLUDE_DEPTH} files deep (does it loop?) at {path}")
        try:
            lines = path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise self.error(f"{path} cannot be read ({getattr(err, 'strerror', None) or err})") from None
        block, text = "Host *", []
        for line in lines:
            include = _INCLUDE.fullmatch(line)
            if include is None:
                block = line.strip() if _BLOCK.match(line) else block
                text.append(line)
                continue
            included = "\n".join(self._text(found, depth + 1) for found in _included_files(include[1]))
            if block != "Host *" and _BLOCK.search(included):
                raise self.error(
                    f"{path}: an Include inside '{block}' names a file with Host or Match blocks of its "
                    "own; edgetune follows those only from outside any block: move the Include up"
                )
            text += [included, block]
        return "\n".join(text)


def _included_files(patterns: str) -> list[Path]:
    found = []
    for pattern in shlex.split(patterns):
        pattern = os.path.expanduser(pattern)
        full = pattern if os.path.isabs(pattern) else str(Path.home() / ".ssh" / pattern)
        found += [Path(name) for name in sorted(glob.glob(full))]
    return found
