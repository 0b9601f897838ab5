"""`edgetune check`: validate the inventory and print what it describes."""

from __future__ import annotations

import argparse

from tabulate import tabulate

from edgetune.cli.common import add_fleet_argument, load_checked_fleet
from edgetune.inventory import Fleet
from edgetune.inventory.fleet_plan import plan_fleet
from edgetune.inventory.schema import FixedValue, ModelInput, ValueRange


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("check", help="validate fleet.yaml and the device profiles")
    add_fleet_argument(parser)
    parser.set_defaults(func=drive_check)


def drive_check(args: argparse.Namespace) -> int:
    print(check(load_checked_fleet(args)))
    return 0


def check(fleet: Fleet) -> str:
    """A summary of a valid inventory: classes, boards per class, models and budgets."""
    plan = plan_fleet(fleet)
    classes = [
        [
            c.device_class,
            c.profile,
            c.target.get("mcpu", ""),
            len(c.boards),
            c.boards_text(),
            c.trials if c.trials is not None else f"{c.trials_per_task} per task",
            c.borrows_from or "",
        ]
        for c in plan.classes
    ]
    models = [
        [m.name, m.builtin or str(m.onnx), " ".join(_input_text(i) for i in m.inputs), m.weight] for m in fleet.models
    ]
    return "\n".join(
        [
            f"{fleet.path.name}: valid ({len(fleet.device_classes)} device classes, {len(fleet.boards)} boards, "
            f"{len(fleet.models)} models)",
            "",
            tabulate(classes, headers=["class", "profile", "mcpu", "boards", "names", "trials", "borrows from"]),
            "",
            tabulate(models, headers=["model", "source", "inputs", "weight"]),
        ]
    )


def _input_text(inp: ModelInput) -> str:
    """`ids[1, 8]:int64 in [0, 1]`, `sr[]:int64=16000`."""
    text = f"{inp.name}{list(inp.shape)}:{inp.dtype}"
    if isinstance(inp.values, FixedValue):
        return f"{text}={inp.values.value}"
    if isinstance(inp.values, ValueRange):
        return f"{text} in [{inp.values.low}, {inp.values.high}]"
    return text
