"""`edgetune report [-o DIR]`: write the fleet dashboard, one static HTML page drawn from the files on disk."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgetune.cli.common import add_fleet_argument, add_select_argument, selected_boards
from edgetune.inventory import load_fleet


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report", help="write the fleet dashboard (boards, artifacts, tuning, history) as one HTML page"
    )
    add_fleet_argument(parser)
    add_select_argument(parser)
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="DIR",
        help="write DIR/dashboard.html (default: the fleet's workdir, under reports/)",
    )
    parser.set_defaults(func=drive_report)


def drive_report(args: argparse.Namespace) -> int:
    from edgetune.inventory.workdir import Workdir
    from edgetune.report import report

    fleet = load_fleet(args.fleet)
    out_dir = args.output or Path(Workdir(fleet.workdir).root) / "reports"
    print(report(fleet.replace(boards=selected_boards(fleet, args)), out_dir))
    return 0
