"""Arguments and steps shared by several verbs."""

from __future__ import annotations

import argparse

from edgetune.inventory import Fleet, load_fleet


def add_fleet_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f", "--fleet", default="fleet.yaml", help="the fleet inventory (default: fleet.yaml)"
    )


def load_checked_fleet(args: argparse.Namespace) -> Fleet:
    """Load and fully validate the inventory (including TVM targets) before anything starts."""
    from edgetune.tune import check_targets

    fleet = load_fleet(args.fleet)
    check_targets(fleet)
    return fleet
