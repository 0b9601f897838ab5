"""Arguments and steps shared by several verbs."""

from __future__ import annotations

import argparse

from edgetune.inventory import Fleet, load_fleet
from edgetune.inventory.schema import Board


def add_fleet_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--fleet", default="fleet.yaml", help="the fleet inventory (default: fleet.yaml)")


def positive_int(text: str) -> int:
    """argparse's `type` for a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def add_select_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--select",
        metavar="KEY=VALUE[,...]",
        help="only the boards whose labels (or `class`, `board`) match every pair, e.g. site=berlin,tier=field",
    )


def selected_boards(fleet: Fleet, args: argparse.Namespace) -> tuple[Board, ...]:
    """The boards `--select` matches (all without it); a selector that names an unknown label or
    matches no board is refused before anything is contacted."""
    from edgetune.inventory.selectors import parse_selector, select_boards

    return fleet.boards if args.select is None else select_boards(fleet.boards, parse_selector(args.select))


def load_checked_fleet(args: argparse.Namespace) -> Fleet:
    """Load and fully validate the inventory (including TVM targets and the declared inputs
    of ONNX models against their graphs) before anything starts."""
    from edgetune.compiler import check_targets
    from edgetune.compiler.models.onnx_inputs import check_declared_inputs

    fleet = load_fleet(args.fleet)
    check_targets(fleet)
    check_declared_inputs(fleet)
    return fleet
