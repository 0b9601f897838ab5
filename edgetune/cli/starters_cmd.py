"""`edgetune starters build`: a device profile's starter records (the best schedules of every
kernel of some tuned class databases), which seed the tasks of that profile's class runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgetune.cli.common import add_fleet_argument, positive_int

DEFAULT_TOP_K = 8


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("starters", help="build a device profile's starter records")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    build = actions.add_parser(
        "build",
        help="keep the best records of every kernel of tuned class databases as a profile's starter records",
        description=(
            "Write the best --top-k measured records of every kernel of the class databases named by --from "
            "(JSON lines, the class database format) as the starter records of a profile of the inventory, "
            "by default to starters/<profile name>/ beside the profile file, replacing what was there. A class "
            "run of the profile seeds its tasks that have no trial yet from them (`tune --no-starters`: not)."
        ),
    )
    build.add_argument("--profile", required=True, metavar="NAME", help="a device profile of the inventory, by name")
    build.add_argument(
        "--from",
        dest="sources",
        required=True,
        nargs="+",
        type=Path,
        metavar="CLASS_DB_DIR",
        help="tuned class databases (<workdir>/databases/<class>)",
    )
    build.add_argument(
        "--top-k",
        type=positive_int,
        default=DEFAULT_TOP_K,
        metavar="K",
        help=f"records kept per kernel, the best (default {DEFAULT_TOP_K})",
    )
    build.add_argument("--out", type=Path, metavar="DIR", help="where to write (default: beside the profile file)")
    add_fleet_argument(build)
    build.set_defaults(func=drive_build)


def drive_build(args: argparse.Namespace) -> int:
    from edgetune.inventory import load_fleet
    from edgetune.tune.starters import build_starters

    built = build_starters(load_fleet(args.fleet), args.profile, args.sources, args.top_k, args.out)
    print(f"{built.directory}: {built.records} records of {built.kernels} kernels")
    return 0
