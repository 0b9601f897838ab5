"""`edgetune plan`: print what `tune-fleet` would do and how long its tuning takes at the trial
rate earlier runs measured, and each model's layout and why, touching no machine (models with
`layout: auto` are imported to choose it; `edgetune tune --dry-run` imports the models and
counts their tasks and the trials already done)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from tabulate import tabulate

from edgetune.cli.common import add_fleet_argument, load_checked_fleet
from edgetune.inventory.fleet_plan import FleetClassPlan, FleetPlan, plan_fleet
from edgetune.inventory.schema import Fleet

if TYPE_CHECKING:
    from edgetune.compiler.relax.layout import LayoutChoice


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plan", help="print what tune-fleet would do (boards, classes, models, budgets)")
    add_fleet_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(func=drive_plan)


def drive_plan(args: argparse.Namespace) -> int:
    from edgetune.compiler.models import model_layouts

    fleet = load_checked_fleet(args)
    plan = plan_fleet(fleet)
    times = {c.device_class: tuning_time(fleet, c) for c in plan.classes}
    layouts = model_layouts(fleet.models)
    if args.json:
        print(
            json.dumps(
                {**plan.to_json(), "tuning_time": times, "layouts": layouts_json(layouts)}, indent=2, sort_keys=True
            )
        )
    else:
        print(format_plan(plan, times))
        print("\n".join(layout_lines(layouts)))
    return 0


def layout_lines(layouts: dict[str, LayoutChoice]) -> list[str]:
    """'layout of M: NHWC: <why>' per model (`edgetune plan`, `tune --dry-run`)."""
    return [f"layout of {name}: {choice.line}" for name, choice in layouts.items()]


def layouts_json(layouts: dict[str, LayoutChoice]) -> dict[str, dict[str, str]]:
    return {name: {"layout": choice.layout, "reason": choice.reason} for name, choice in layouts.items()}


def tuning_time(fleet: Fleet, plan: FleetClassPlan) -> str:
    """How long the class's budget takes at its measured trial rate (per task where the budget
    is per task: the task count is known once the models are imported)."""
    from edgetune.tune.budget import estimate, time_is_the_budget
    from edgetune.tune.database import ClassDatabasePaths, throughput

    measured = throughput(ClassDatabasePaths.of(fleet.workdir, plan.device_class))
    if time_is_the_budget(fleet.tuning, plan.device_class):
        return (
            f"up to the time limit of {fleet.tuning.time_limit_s:g} s (its budget: a round per task, "
            "then rounds by expected gain)"
        )
    if plan.trials_per_task:
        return f"{estimate(plan.trials_per_task, measured)} per task"
    return estimate(plan.trials, measured)


def format_plan(plan: FleetPlan, times: dict[str, str]) -> str:
    rows = [
        [
            c.device_class,
            c.tracker,
            c.boards_text(),
            b.model,
            b.weight,
            f"{c.trials_per_task} per task" if c.trials_per_task else b.trials,
            c.borrows_from or "",
        ]
        for c in plan.classes
        for b in c.budgets
    ]
    table = tabulate(rows, headers=["class", "tracker", "boards", "model", "weight", "trials", "borrows from"])
    return "\n".join([table, "", *(f"{name}: tuning time {time}" for name, time in times.items())])
