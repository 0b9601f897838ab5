"""`edgetune tune-fleet`: the whole job on one inventory (what `make tune-fleet` runs). Its exit
code is that of the first stage that failed: boards (3), tuning (4), the build (5)."""

from __future__ import annotations

import argparse

from edgetune.cli.common import add_fleet_argument, load_checked_fleet
from edgetune.errors import ArtifactError, FleetError, TuneError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tune-fleet", help="fleet up, tune every model per class, build and sign artifacts, fleet down"
    )
    add_fleet_argument(parser)
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="tune on the Ray cluster at ADDRESS (HOST:PORT of its head) instead of fleet.yaml's "
        "`compute` (docs/compute.md)",
    )
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
    if result.nothing_to_do is not None:
        print(
            "nothing to do: every class's trial budget is spent and every artifact's inputs are its latest "
            "version's; no board, simulated board or tracker was started"
        )
    if result.build is not None:
        print()
        print(result.build.table())
        for line in result.build.warnings():
            print(f"warning: {line}")
    for line in result.problems():
        print(f"error: {line}")
    return pipeline_exit_code(result)


def pipeline_exit_code(result) -> int:
    """0 when the whole job succeeded or there was nothing to do, else the code of the first stage
    that failed: a board that did not come up (3; the others went on), a class that could not
    tune (4), a build (5)."""
    if result.failed_boards:
        return FleetError.exit_code
    if result.nothing_to_do is None and (result.tuning is None or not result.tuning.ok):
        return TuneError.exit_code
    if result.build is None or not result.build.ok:
        return ArtifactError.exit_code
    return 0
