"""`edgetune pull BOARD [--model M] [-o DIR]`: download what a board would get, verified."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgetune.cli.common import add_fleet_argument
from edgetune.inventory import load_fleet


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("pull", help="download and verify exactly what one board would install")
    parser.add_argument("board", metavar="BOARD")
    parser.add_argument("--model", dest="models", action="append", default=[], metavar="MODEL",
                        help="only this model (repeatable; default: every model)")  # fmt: skip
    parser.add_argument("-o", "--output", type=Path, default=Path("pulled"), help="where to write (default: ./pulled)")
    add_fleet_argument(parser)
    parser.set_defaults(func=drive_pull)


def drive_pull(args: argparse.Namespace) -> int:
    from edgetune.deploy.pull import pull

    for item in pull(load_fleet(args.fleet), args.board, args.models, args.output):
        print(f"{item.board}: {item.model} v{item.version} verified -> {item.tarball} (unpacked in {item.directory})")
    return 0
