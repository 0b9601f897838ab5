"""`edgetune sim up|down`: create or remove the inventory's simulated boards on this machine
(network namespaces with their own sshd, CPU quotas through cgroups). Needs root and `ip`."""

from __future__ import annotations

import argparse

from edgetune.cli.common import add_fleet_argument, load_checked_fleet
from edgetune.errors import FleetError
from edgetune.fleet import sim_down, sim_up


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("sim", help="create or remove the simulated boards on this machine")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, func, text in (
        ("up", drive_up, "create what is missing of the simulated boards (idempotent)"),
        ("down", drive_down, "remove the simulated boards' processes, namespaces, bridge and cgroups"),
    ):
        action = actions.add_parser(name, help=text)
        add_fleet_argument(action)
        action.set_defaults(func=func)


def drive_up(args: argparse.Namespace) -> int:
    return 0 if sim_up(load_checked_fleet(args)).ok else FleetError.exit_code


def drive_down(args: argparse.Namespace) -> int:
    return 0 if sim_down(load_checked_fleet(args)).ok else FleetError.exit_code
