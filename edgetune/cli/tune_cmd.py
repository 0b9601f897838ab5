"""`edgetune tune`: tune every model for every device class (or a selection) on its boards."""

from __future__ import annotations

import argparse
import json
import sys

from edgetune.cli.common import add_fleet_argument, load_checked_fleet
from edgetune.errors import Interrupted, TuneError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tune", help="tune the models per device class on the class's boards (resumable)")
    add_fleet_argument(parser)
    parser.add_argument(
        "--class", dest="classes", action="append", metavar="C", help="tune only this device class (repeatable)"
    )
    parser.add_argument(
        "--model", dest="models", action="append", metavar="M", help="tune only this model (repeatable)"
    )
    parser.add_argument(
        "--no-borrow", action="store_true", help="ignore tuning.borrow (do not seed from other classes)"
    )
    parser.add_argument(
        "--no-starters", action="store_true", help="do not seed tasks from the profiles' starter records"
    )
    parser.add_argument(
        "--measure-exclusively",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="search and build nothing while a board measures (default: on for a class "
        "with a simulated board, as it shares the host's CPUs)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan (boards, tasks, budgets) and measure nothing"
    )
    parser.add_argument("--json", action="store_true", help="print the plan or result as JSON")
    parser.set_defaults(func=drive_tune)


def drive_tune(args: argparse.Namespace) -> int:
    from edgetune.tune import (
        TuneOptions,
        plan_tuning,
        stop_on_signals,
        stop_requested,
        tune_fleet,
    )

    fleet = load_checked_fleet(args)
    classes = tuple(args.classes) if args.classes else None
    models = tuple(args.models) if args.models else None
    if args.dry_run:
        return _print_plan(fleet, plan_tuning(fleet, classes, models), models, args.json)
    with stop_on_signals():
        result = tune_fleet(
            fleet,
            TuneOptions(
                classes=classes,
                models=models,
                borrow=not args.no_borrow,
                starters=not args.no_starters,
                measure_exclusively=args.measure_exclusively,
            ),
        )
        stopped = stop_requested()
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        for c in result.classes:
            status = f"error: {c.error}" if c.error else (f"stopped: {c.stopped}" if c.stopped else "done")
            print(
                f"{c.device_class}: {c.trials_run} trials this run, {c.done_before} before, "
                f"budget {c.budget}, {c.tuning_time_s:.0f} s; {status}"
            )
            for summary in c.summaries:
                print(f"  report: {summary}")
    if stopped:
        raise Interrupted(stopped)
    if not result.ok:
        print(
            "some classes could not tune; fix the errors above and re-run `edgetune tune` (finished trials are kept)",
            file=sys.stderr,
        )
    return 0 if result.ok else TuneError.exit_code


def _print_plan(fleet, plan, models: tuple[str, ...] | None, as_json: bool) -> int:
    """The plan, and the layout of each model planned and why."""
    from edgetune.cli.plan_cmd import layout_lines, layouts_json
    from edgetune.compiler.models import model_layouts
    from edgetune.tune.plan import select_models

    layouts = model_layouts(select_models(fleet, models))
    if as_json:
        print(json.dumps({**json.loads(plan.to_json()), "layouts": layouts_json(layouts)}, indent=2, sort_keys=True))
    else:
        print("\n".join([plan.format(), *layout_lines(layouts)]))
    return 0
