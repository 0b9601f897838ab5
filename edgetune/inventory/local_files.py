"""Checks of the files and folders an inventory names on this machine: a folder edgetune
writes into exists or can be made, a file it reads is a regular file, the signing key is not
published, and every board has a known_hosts file and a way to log in (a private key that is
one, readable by its owner only). Errors name the YAML place the path came from.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from edgetune.inventory.reader import Node
from edgetune.inventory.schema import NO_SSH_CONFIG, ArtifactSettings, Board, Fleet

_PRIVATE_KEY_PEM = re.compile(rb"-----BEGIN (OPENSSH |RSA |EC |DSA |ENCRYPTED )?PRIVATE KEY-----")
MAX_KEY_FILE_BYTES = 64 << 10


def check_ssh_entry(node: Node, base: Path) -> None:
    """The files the ssh section at `node` names on this machine: known_hosts a file (or one
    that can be made), config an OpenSSH client config file that exists (or `none`)."""
    if node.child("known_hosts").value is not None:
        check_file(node.child("known_hosts"), resolve_path(node.child("known_hosts"), base))
    spelled = node.child("config").decode(str) if node.child("config").value is not None else None
    if spelled is not None and spelled != NO_SSH_CONFIG:
        config = resolve_path(node.child("config"), base)
        found = stat_of(node.child("config"), config)
        if found is None or not stat.S_ISREG(found.st_mode):
            what = "does not exist" if found is None else "is not a file"
            raise node.child("config").error(
                f"ssh config file '{spelled}' {what} (looked for {config}); name an "
                f"OpenSSH client config file, or '{NO_SSH_CONFIG}' for none"
            )


def resolve_path(node: Node, base: Path) -> Path:
    return node.decode(Path, base)


def stat_of(node: Node, path: Path) -> os.stat_result | None:
    """`path`'s status, or None if it does not exist."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        raise node.error(f"'{path}' cannot be checked ({err.strerror})") from None


def check_directory(node: Node, path: Path) -> None:
    """A folder on this machine edgetune writes into: a folder, or one it can make."""
    found = stat_of(node, path)
    if found is None:
        _check_makeable(node, path)
    elif not stat.S_ISDIR(found.st_mode):
        kind = "a file" if stat.S_ISREG(found.st_mode) else "a device or other special file"
        raise node.error(f"'{path}' is {kind}, not a folder; name a folder (it is made if missing)")


def check_file(node: Node, path: Path) -> None:
    """A file on this machine edgetune reads and writes: a regular file, or one it can make."""
    found = stat_of(node, path)
    if found is None:
        _check_makeable(node, path)
    elif not stat.S_ISREG(found.st_mode):
        kind = "a folder" if stat.S_ISDIR(found.st_mode) else "a device or other special file"
        raise node.error(f"'{path}' is {kind}, not a file")


def check_existing_file(node: Node, path: Path, kind: str) -> None:
    found = stat_of(node, path)
    if found is None or not stat.S_ISREG(found.st_mode):
        what = "does not exist" if found is None else "is not a file"
        raise node.error(f"{kind} '{node.value}' {what} (looked for {path})")


def check_artifact_keys(node: Node, artifacts: ArtifactSettings) -> None:
    """The signing key pair: two files, the private one outside the (published) artifacts
    directory. `dir` itself is checked by `build`, which says it is not writable (exit 5)."""
    check_file(node.child("signing_key"), artifacts.signing_key)
    check_file(node.child("public_key"), artifacts.public_key)
    if artifacts.signing_key.is_relative_to(artifacts.dir):
        raise node.child("signing_key").error(
            f"the private signing key must live outside the artifacts directory ({artifacts.dir}), which is published"
        )
    if os.path.realpath(artifacts.signing_key) == os.path.realpath(artifacts.public_key):
        raise node.child("public_key").error(
            f"is the same file as signing_key ({artifacts.signing_key}); the public key needs its own file, "
            f"e.g. {artifacts.signing_key.with_suffix('.pub')}"
        )


def _check_makeable(node: Node, path: Path) -> None:
    """The nearest existing ancestor of a missing `path` must be a folder."""
    for parent in path.parents:
        found = stat_of(node, parent)
        if found is not None:
            if not stat.S_ISDIR(found.st_mode):
                raise node.error(f"'{path}' cannot be made: '{parent}' is not a folder")
            return


def check_ssh_files(root: Node, fleet: Fleet) -> None:
    """Every board needs a known_hosts file (host keys are always checked) and a way to log
    in: a named private key that exists, is a private key, and is readable by its owner only;
    without one, an ssh config file (its IdentityFile) or a running ssh-agent. Keys of
    simulated boards are made by `edgetune sim up`, so they must be named but may not exist yet."""
    for index, board in enumerate(fleet.boards):
        if board.ssh.known_hosts is None:
            raise _ssh_location(root, index, "known_hosts").error(
                "required field is missing: the file that records the boards' SSH host keys, e.g. .edgetune/known_hosts"
            )
        where = _ssh_location(root, index, "key")
        key = board.ssh.key
        if key is None:
            _check_other_key_source(where, board)
            continue
        found = stat_of(where, key)
        if found is None:
            if board.simulated is not None:
                continue
            raise where.error(f"private key file '{key}' does not exist")
        _check_private_key(where, key, found)


def _check_other_key_source(where: Node, board: Board) -> None:
    """A board without ssh.key logs in with its ssh config's IdentityFile or the agent's keys."""
    if board.simulated is not None:
        raise where.error(
            "required field is missing: a simulated board needs the private key `edgetune sim up` "
            "makes and authorizes on it, e.g. .edgetune/sim/id_ed25519"
        )
    if board.ssh.config is None and not os.environ.get("SSH_AUTH_SOCK"):
        raise where.error(
            "required field is missing: the private key used to log in to the board (or an ssh config "
            "file, ssh.config, whose IdentityFile names it, or a running ssh-agent, SSH_AUTH_SOCK)"
        )


def _check_private_key(where: Node, key: Path, found: os.stat_result) -> None:
    if not stat.S_ISREG(found.st_mode):
        raise where.error(f"private key file '{key}' is not a file")
    if found.st_size > MAX_KEY_FILE_BYTES:
        raise where.error(f"'{key}' is {found.st_size} bytes, too large for a private key")
    mode = stat.S_IMODE(found.st_mode)
    if mode & 0o077:
        raise where.error(
            f"private key file '{key}' is readable by group or others (mode {mode:04o}); run: chmod 600 {key}"
        )
    try:
        head = key.read_bytes()[:MAX_KEY_FILE_BYTES]
    except OSError as err:
        raise where.error(f"private key file '{key}' cannot be read ({err.strerror})") from None
    if head.lstrip().startswith((b"ssh-", b"ecdsa-", b"sk-")) or b"PUBLIC KEY-----" in head:
        raise where.error(f"'{key}' is a public key; name the private key (usually the same name without .pub)")
    if not _PRIVATE_KEY_PEM.match(head.lstrip()):
        raise where.error(
            f"'{key}' is not a PEM private key (no '-----BEGIN ... PRIVATE KEY-----' line); make one with ssh-keygen -t ed25519"
        )


def _ssh_location(root: Node, index: int, field: str) -> Node:
    """The YAML place a board's ssh `field` comes from: its own ssh override, else the fleet's."""
    own = root.child("boards").child(index).child("ssh").child(field)
    return own if own.value is not None else root.child("ssh").child(field)
