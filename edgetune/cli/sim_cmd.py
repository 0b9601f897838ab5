"""`edgetune sim up|down|firmware`: create or remove the inventory's simulated boards on this
machine (network namespaces with their own sshd, CPU quotas through cgroups), or give one a
simulated firmware update. Needs root and `ip`."""

from __future__ import annotations

import argparse

from edgetune.cli.common import add_fleet_argument, load_checked_fleet
from edgetune.errors import FleetError
from edgetune.fleet import sim_down, sim_up
from edgetune.fleet.sim import sim_firmware


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
    firmware = actions.add_parser("firmware", help="a simulated firmware update of one board (fingerprint, CPU quota)")
    firmware.add_argument("board", metavar="BOARD")
    firmware.add_argument("--version", required=True, help="the new firmware version (shows in its fingerprint)")
    firmware.add_argument("--cpu-quota", type=float, help="its new CPU quota, a fraction of one core (e.g. 0.5)")
    add_fleet_argument(firmware)
    firmware.set_defaults(func=drive_firmware)


def drive_up(args: argparse.Namespace) -> int:
    return 0 if sim_up(load_checked_fleet(args)).ok else FleetError.exit_code


def drive_down(args: argparse.Namespace) -> int:
    return 0 if sim_down(load_checked_fleet(args)).ok else FleetError.exit_code


def drive_firmware(args: argparse.Namespace) -> int:
    sim_firmware(load_checked_fleet(args), args.board, args.version, args.cpu_quota)
    print(f"{args.board}: firmware {args.version}" + (f", CPU quota {args.cpu_quota:g}" if args.cpu_quota else ""))
    return 0
