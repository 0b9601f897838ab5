"""`edgetune pull BOARD|--select ... [--model M] [-o DIR]`: download what boards would get, verified."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgetune.cli.common import add_fleet_argument, add_select_argument, selected_boards
from edgetune.errors import InventoryError
from edgetune.inventory import load_fleet


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "pull", help="download and verify exactly what a board (or the boards selected) would install"
    )
    parser.add_argument("board", metavar="BOARD", nargs="?", help="this board (or --select)")
    add_select_argument(parser)
    parser.add_argument(
        "--model",
        dest="models",
        action="append",
        default=[],
        metavar="MODEL",
        help="only this model (repeatable; default: every model)",
    )
    parser.add_argument("-o", "--output", type=Path, default=Path("pulled"), help="where to write (default: ./pulled)")
    add_fleet_argument(parser)
    parser.set_defaults(func=drive_pull)


def drive_pull(args: argparse.Namespace) -> int:
    from edgetune.deploy.pull import pull

    fleet = load_fleet(args.fleet)
    if (args.board is None) == (args.select is None):
        raise InventoryError(
            "pull: name one BOARD or give --select KEY=VALUE[,...], not both, e.g. `edgetune pull gw-1`"
        )
    names = [args.board] if args.board is not None else [b.name for b in selected_boards(fleet, args)]
    for name in names:
        for item in pull(fleet, name, args.models, args.output):
            print(
                f"{item.board}: {item.model} v{item.version} verified -> {item.tarball} (unpacked in {item.directory})"
            )
    return 0
