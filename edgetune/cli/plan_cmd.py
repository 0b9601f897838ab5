"""`edgetune plan`: print what `tune-fleet` would do, touching no machine."""

from __future__ import annotations

import argparse
import json

from tabulate import tabulate

from edgetune.cli.common import add_fleet_argument, load_checked_fleet
from edgetune.inventory.fleet_plan import FleetPlan, plan_fleet


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plan", help="print what tune-fleet would do (boards, classes, models, budgets)")
    add_fleet_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(func=drive_plan)


def drive_plan(args: argparse.Namespace) -> int:
    plan = plan_fleet(load_checked_fleet(args))
    print(json.dumps(plan.to_json(), indent=2, sort_keys=True) if args.json else format_plan(plan))
    return 0


def format_plan(plan: FleetPlan) -> str:
    rows = [
        [c.device_class, c.tracker, ", ".join(c.boards), b.model, b.weight, b.trials, c.borrows_from or ""]
        for c in plan.classes
        for b in c.budgets
    ]
    return tabulate(rows, headers=["class", "tracker", "boards", "model", "weight", "trials", "borrows from"])
