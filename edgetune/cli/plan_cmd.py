"""`edgetune plan`: print what `tune-fleet` would do and how long its tuning takes at the trial
rate earlier runs measured, touching no machine (`edgetune tune --dry-run` imports the models
and counts their tasks and the trials already done)."""

from __future__ import annotations

import argparse
import json

from tabulate import tabulate

from edgetune.cli.common import add_fleet_argument, load_checked_fleet
from edgetune.inventory.fleet_plan import FleetClassPlan, FleetPlan, plan_fleet
from edgetune.inventory.schema import Fleet
from edgetune.tune.budget import estimate
from edgetune.tune.database import ClassDatabasePaths, throughput


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plan", help="print what tune-fleet would do (boards, classes, models, budgets)")
    add_fleet_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(func=drive_plan)


def drive_plan(args: argparse.Namespace) -> int:
    fleet = load_checked_fleet(args)
    plan = plan_fleet(fleet)
    times = {c.device_class: tuning_time(fleet, c) for c in plan.classes}
    if args.json:
        print(json.dumps({**plan.to_json(), "tuning_time": times}, indent=2, sort_keys=True))
    else:
        print(format_plan(plan, times))
    return 0


def tuning_time(fleet: Fleet, plan: FleetClassPlan) -> str:
    """How long the class's budget takes at its measured trial rate (per task where the budget
    is per task: the task count is known once the models are imported)."""
    measured = throughput(ClassDatabasePaths.of(fleet.workdir, plan.device_class))
    if plan.trials_per_task:
        return f"{estimate(plan.trials_per_task, measured)} per task"
    return estimate(plan.trials, measured)


def format_plan(plan: FleetPlan, times: dict[str, str]) -> str:
    rows = [
        [c.device_class, c.tracker, ", ".join(c.boards), b.model, b.weight,
         f"{c.trials_per_task} per task" if c.trials_per_task else b.trials, c.borrows_from or ""]
        for c in plan.classes
        for b in c.budgets
    ]
    table = tabulate(rows, headers=["class", "tracker", "boards", "model", "weight", "trials", "borrows from"])
    return "\n".join([table, "", *(f"{name}: tuning time {time}" for name, time in times.items())])
