"""`edgetune fleet reset-serial`: restart the signed decisions' serials from the clock, on this
host and on the boards, after a serial far ahead of it (a host clock that once ran ahead, or a
key holder's decision) left the host refusing to sign or boards refusing every decision.

The host's counter is set to the clock; then each board's agent takes that value as the highest
serial it accepted, so it refuses every decision signed before the reset and takes the next.
"""

from __future__ import annotations

from collections.abc import Sequence

from edgetune.deploy.decisions import serial_counter
from edgetune.deploy.remote import RemoteAgent
from edgetune.errors import DeployError
from edgetune.fleet.parallel import GroupResult, for_each_board
from edgetune.fleet.ssh import BoardSession
from edgetune.inventory.schema import Board, Fleet


def reset_serials(fleet: Fleet, boards: Sequence[Board]) -> tuple[int, GroupResult[int]]:
    """The serial every later decision is above, and per board the serial it had accepted before."""
    serial = serial_counter(fleet).reset()
    return serial, for_each_board(boards, lambda board: _reset_board(fleet, board, serial))


def _reset_board(fleet: Fleet, board: Board, serial: int) -> int:
    with BoardSession(board) as session:
        record = RemoteAgent(session, fleet).reset_serial(serial)
    if record.last_serial != serial:
        raise DeployError(f"{board.name}: the agent took serial {record.last_serial}, not {serial}")
    return record.previous
