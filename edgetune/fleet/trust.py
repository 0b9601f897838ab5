"""`edgetune fleet trust BOARD`: the operator's explicit decision to accept a board's host key,
and those of the bastions on the way to it.

Every hop's key is shown (type and SHA256 fingerprint) and appended to the inventory's
known_hosts. edgetune logs in to a bastion (offering keys) only once its key is recorded or
matches a fingerprint the operator gave (`--bastion-fingerprint`); a hop whose recorded key differs (in any key type) is refused, never
overwritten, and nothing is recorded then. With `expected_fingerprint` (read off the board's
console, say), a board key with another fingerprint is refused before anything is recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from edgetune.errors import FleetError
from edgetune.fleet.errors import HostKeyMismatch
from edgetune.fleet.ssh import fetch_host_keys, fingerprint, record_host_keys
from edgetune.inventory.schema import Fleet

log = logging.getLogger(__name__)


def trust_board(
    fleet: Fleet, board_name: str, expected_fingerprint: str | None = None, bastion_fingerprints: Collection[str] = ()
) -> str:
    """Record the host keys `board_name` and its bastions offer in known_hosts; return the
    board's fingerprint. A bastion not recorded yet must offer one of `bastion_fingerprints`
    before edgetune logs in to it."""
    names = [board.name for board in fleet.boards]
    if board_name not in names:
        raise FleetError(f"no board named '{board_name}' in {fleet.path} (boards: {', '.join(names)})")
    board = fleet.board(board_name)
    keys = fetch_host_keys(board, bastion_fingerprints)
    target, key = keys[-1]
    if expected_fingerprint is not None and expected_fingerprint.removeprefix("SHA256:") != fingerprint(
        key
    ).removeprefix("SHA256:"):
        raise HostKeyMismatch(
            f"{board.name} ({target.known_hosts_name}) offers {key.get_name()} {fingerprint(key)}, not the expected "
            f"{expected_fingerprint}: refused, nothing recorded"
        )
    for (hop, hop_key), new in zip(keys, record_host_keys(board, keys)):
        who = (
            f"{board.name}: bastion {hop.known_hosts_name}" if hop.bastion else f"{board.name} ({hop.known_hosts_name})"
        )
        shown = f"{hop_key.get_name()} {fingerprint(hop_key)}"
        log.info(
            f"{who}: trusted {shown}; recorded in {board.ssh.known_hosts}"
            if new
            else f"{who}: {shown} was already trusted"
        )
    return fingerprint(key)
