"""`edgetune fleet up|status|down|trust BOARD|reset-serial [BOARD...]`: bring the fleet's
trackers and the tuning pools' rpc_servers online, show them (each board's role: `pool` or
`target`), take them down, accept a board's host key, restart the signed decisions' serials.
Exit status 3 if any board failed."""

from __future__ import annotations

import argparse
import dataclasses
import json

from tabulate import tabulate

from edgetune.cli.common import add_fleet_argument, add_select_argument, load_checked_fleet, selected_boards
from edgetune.errors import FleetError
from edgetune.fleet.parallel import GroupResult
from edgetune.inventory.schema import POOL


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("fleet", help="start, show and stop the fleet's tracker and rpc_servers")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser("up", help="start what is missing, wait until every board is registered")
    status = actions.add_parser("status", help="per tracker and class, and per board: what is running")
    status.add_argument("--json", action="store_true", help="one JSON object per board")
    add_select_argument(status)
    down = actions.add_parser("down", help="stop the rpc_servers and trackers that `up` started")
    trust = actions.add_parser("trust", help="show a board's host key and record it in known_hosts")
    trust.add_argument("board", metavar="BOARD")
    trust.add_argument("--fingerprint", metavar="SHA256:...", help="refuse unless the board's key has this fingerprint")
    trust.add_argument(
        "--bastion-fingerprint",
        metavar="SHA256:...",
        action="append",
        default=[],
        help="a bastion's key fingerprint, for each bastion on the way not yet in known_hosts (repeatable)",
    )
    reset = actions.add_parser(
        "reset-serial", help="restart signed decisions' serials from the clock, here and on the boards"
    )
    reset.add_argument("boards", metavar="BOARD", nargs="*", help="the boards to reset (default: every board)")
    for action, func in (
        (up, drive_up),
        (status, drive_status),
        (down, drive_down),
        (trust, drive_trust),
        (reset, drive_reset_serial),
    ):
        add_fleet_argument(action)
        action.set_defaults(func=func)


def drive_up(args: argparse.Namespace) -> int:
    from edgetune.fleet import fleet_up

    return _exit_code(fleet_up(load_checked_fleet(args)), "came online")


def drive_down(args: argparse.Namespace) -> int:
    from edgetune.fleet import fleet_down

    return _exit_code(fleet_down(load_checked_fleet(args)), "stopped")


def drive_trust(args: argparse.Namespace) -> int:
    from edgetune.fleet import trust_board

    trust_board(
        load_checked_fleet(args),
        args.board,
        expected_fingerprint=args.fingerprint,
        bastion_fingerprints=args.bastion_fingerprint,
    )
    return 0


def drive_reset_serial(args: argparse.Namespace) -> int:
    from edgetune.deploy.serials import reset_serials

    fleet = load_checked_fleet(args)
    unknown = sorted(set(args.boards) - {board.name for board in fleet.boards})
    if unknown:
        raise FleetError(f"no board named {', '.join(unknown)} in {fleet.path}")
    serial, result = reset_serials(fleet, [b for b in fleet.boards if not args.boards or b.name in args.boards])
    print(f"decision serials restart from {serial} (this host's clock)")
    for name, previous in sorted(result.succeeded.items()):
        print(f"  {name}: last accepted serial {previous} -> {serial}")
    return _exit_code(result, "reset")


def drive_status(args: argparse.Namespace) -> int:
    from edgetune.deploy.rollout import read_back_interrupted
    from edgetune.fleet import fleet_status, tracker_status

    fleet = load_checked_fleet(args)
    shown = fleet.replace(boards=selected_boards(fleet, args))
    read_back_interrupted(fleet)  # an interrupted rollout's boards, read back before they are shown
    boards = fleet_status(shown)
    if args.json:
        print(json.dumps([dataclasses.asdict(board) for board in boards], indent=2))
    else:
        classes = [dataclasses.astuple(row) for row in tracker_status(shown)]
        print(tabulate(classes, headers=["tracker", "address", "class", "registered", "free", "busy", "pending"]))
        print()
        print(
            tabulate(
                [_board_row(board) for board in boards],
                headers=[
                    "board",
                    "class",
                    "role",
                    "address",
                    "reachable",
                    "registered",
                    "python",
                    "tvm",
                    "runs",
                    "reported",
                    "firmware",
                    "error",
                ],
            )
        )
    return 0 if all(board.healthy for board in boards) else FleetError.exit_code


def _board_row(board) -> list:
    firmware = (board.firmware or "").splitlines()[0] if board.firmware else ""
    if board.firmware_changed:
        firmware += " (CHANGED)"
    error = (board.error or "").splitlines()[0] if board.error else ""
    if board.pull_errors:
        error = "; ".join(
            [
                *filter(None, [error]),
                *(f"pull of {m}: {e.splitlines()[0]}" for m, e in sorted(board.pull_errors.items())),
            ]
        )
    deployed = ", ".join(
        f"{model} {'v' if isinstance(version, int) else ''}{version}"
        for model, version in sorted(board.deployed.items())
    )
    registered = _yes(board.registered) if board.role == POOL or board.registered else "-"  # a target needs none
    return [
        board.name,
        board.device_class,
        board.role,
        board.address,
        _yes(board.reachable),
        registered,
        board.python_version or "",
        board.tvm_version or "",
        deployed,
        board.reported or "",
        firmware,
        error,
    ]


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def _exit_code(result: GroupResult, done: str) -> int:
    print(f"{len(result.succeeded)} board(s) {done}, {len(result.failed)} failed")
    for _, reason in sorted(result.failed.items()):
        print(f"  {reason}")
    return 0 if result.ok else FleetError.exit_code
