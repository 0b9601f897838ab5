"""`edgetune tune-fleet`: the whole job on one inventory (what `make tune-fleet` runs)."""

from __future__ import annotations

import argparse

from edgetune.cli.common import add_fleet_argument, load_checked_fleet


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tune-fleet", help="fleet up, tune every model per class, build and sign artifacts, fleet down"
    )
    add_fleet_argument(parser)
    parser.add_argument("--ray", metavar="ADDRESS",
                        help="tune on the Ray cluster at ADDRESS (HOST:PORT of its head) instead of fleet.yaml's "
                             "`compute` (docs/compute.md)")
    parser.set_defaults(func=drive_tune_fleet)


def drive_tune_fleet(args: argparse.Namespace) -> int:
    from edgetune.inventory.loader import with_ray_compute
    from edgetune.pipeline import run_pipeline
    from edgetune.tune import stop_on_signals

    fleet = load_checked_fleet(args)
    if args.ray:
        fleet = with_ray_compute(fleet, args.ray)
    with stop_on_signals():
        result = run_pipeline(fleet)
    if result.build is not None:
        print()
        print(result.build.table())
        for line in result.build.warnings():
            print(f"warning: {line}")
    for line in result.problems():
        print(f"error: {line}")
    return 0 if result.ok else 1
