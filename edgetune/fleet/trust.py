"""`edgetune fleet trust BOARD`: the operator's explicit decision to accept a board's host key.

The key the board offers is shown (type and SHA256 fingerprint) and appended to the
inventory's known_hosts; a board whose recorded key differs (in any key type) is refused,
never overwritten. With `expected_fingerprint` (read off the board's console, say), a key
with another fingerprint is refused before anything is recorded.
"""

from __future__ import annotations

import logging
from typing import Callable

from edgetune.errors import FleetError
from edgetune.fleet.errors import HostKeyMismatch
from edgetune.fleet.ssh import fetch_host_key, fingerprint, record_host_key
from edgetune.inventory.schema import Fleet

log = logging.getLogger(__name__)


def trust_board(
    fleet: Fleet, board_name: str, progress: Callable[[str], None] = log.info, expected_fingerprint: str | None = None
) -> str:
    """Record the host key `board_name` offers in known_hosts; return its fingerprint."""
    names = [board.name for board in fleet.boards]
    if board_name not in names:
        raise FleetError(f"no board named '{board_name}' in {fleet.path} (boards: {', '.join(names)})")
    board = fleet.board(board_name)
    key = fetch_host_key(board)
    shown = f"{key.get_name()} {fingerprint(key)}"
    if expected_fingerprint is not None and expected_fingerprint.removeprefix("SHA256:") != fingerprint(key).removeprefix("SHA256:"):
        raise HostKeyMismatch(
            f"{board.name} ({board.address}) offers {shown}, not the expected {expected_fingerprint}: refused, nothing recorded"
        )
    if record_host_key(board, key):
        progress(f"{board.name} ({board.address}): trusted {shown}; recorded in {board.ssh.known_hosts}")
    else:
        progress(f"{board.name} ({board.address}): {shown} was already trusted")
    return fingerprint(key)
