"""`edgetune timer install|remove [--select ...]`: the boards' pull timers (deploy/pull_timer.py)."""

from __future__ import annotations

import argparse

from edgetune.cli.common import add_fleet_argument, add_select_argument, selected_boards
from edgetune.errors import DeployError
from edgetune.inventory import load_fleet


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "timer", help="install or remove the boards' pull timers (a board catches up by itself)"
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    install = actions.add_parser(
        "install", help="a timer on each board that installs its assigned versions and reports"
    )
    install.add_argument("--every", type=float, default=300.0, metavar="S", help="the period in seconds (default 300)")
    remove = actions.add_parser("remove", help="stop and remove the boards' timers")
    for action in (install, remove):
        add_select_argument(action)
        add_fleet_argument(action)
        action.set_defaults(func=drive_timer)


def drive_timer(args: argparse.Namespace) -> int:
    from edgetune.deploy.pull_timer import install_timers, remove_timers

    fleet = load_fleet(args.fleet)
    boards = selected_boards(fleet, args)
    if args.action == "install":
        result = install_timers(fleet, boards, args.every)
        for name, method in result.succeeded.items():
            print(f"{name}: {method} timer, every {args.every:g} s")
    else:
        result = remove_timers(fleet, boards)
        for name in result.succeeded:
            print(f"{name}: no timer")
    for reason in result.failed.values():
        print(f"failed: {reason}")
    return 0 if result.ok else DeployError.exit_code
