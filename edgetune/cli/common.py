"""Arguments and steps shared by several verbs."""

from __future__ import annotations

import argparse

from edgetune.inventory import Fleet, load_fleet


def add_fleet_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f", "--fleet", default="fleet.yaml", help="the fleet inventory (default: fleet.yaml)"
    )


def load_checked_fleet(args: argparse.Namespace) -> Fleet:
    """Load and fully validate the inventory (including TVM targets and the declared inputs
    of ONNX models against their graphs) before anything starts."""
    from edgetune.compiler import check_targets
    from edgetune.compiler.models.onnx_inputs import check_declared_inputs

    fleet = load_fleet(args.fleet)
    check_targets(fleet)
    check_declared_inputs(fleet)
    return fleet
