"""`edgetune rollout --model M ...`: install a model's artifact on the boards in stages."""

from __future__ import annotations

import argparse
import json

from tabulate import tabulate

from edgetune.cli.common import add_fleet_argument, add_select_argument
from edgetune.errors import DeployError
from edgetune.inventory import load_fleet


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("rollout", help="install a model's artifact on the boards: canary, then batches")
    parser.add_argument("--model", required=True, metavar="MODEL")
    parser.add_argument(
        "--class",
        dest="classes",
        action="append",
        default=[],
        metavar="CLASS",
        help="only the boards of this class (repeatable; default: all)",
    )
    parser.add_argument("--version", type=int, help="this version (default: each board's pin, else the newest)")
    parser.add_argument(
        "--canary", type=int, default=1, help="boards of each class tried first, one class after the other (default 1)"
    )
    add_select_argument(parser)
    parser.add_argument(
        "--batch",
        default="0",
        metavar="N|PCT%",
        help="boards per batch after the canaries, or a percentage of each class's other boards, e.g. 10%% "
        "(default: all in one batch)",
    )
    parser.add_argument(
        "--parallel",
        type=int,
        metavar="N",
        help="boards installed on at once (default: fleet.yaml's deploy.parallel, else 16, growing by one per 20 boards beyond 320 to 128)",
    )
    parser.add_argument(
        "--max-failed",
        type=float,
        default=0.0,
        metavar="PCT",
        help="stop and roll back once more than PCT %% of the boards failed (default 0)",
    )
    parser.add_argument(
        "--count-pending",
        action="store_true",
        help="count boards that cannot be reached at their turn (pending) as failed: against the canaries "
        "and --max-failed (default: they are listed, keep their assigned version for their pull, and "
        "a pending canary is replaced by the next board of its class)",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=300.0,
        help="per board (default 300); the agent stops before its switch a quarter earlier, 30 s at most",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the stages and versions; touch no board")
    parser.add_argument("--json", action="store_true", help="one JSON record per board")
    add_fleet_argument(parser)
    parser.set_defaults(func=drive_rollout)


def drive_rollout(args: argparse.Namespace) -> int:
    from edgetune.deploy.rollout import plan_rollout, rollout
    from edgetune.inventory.selectors import parse_selector

    fleet = load_fleet(args.fleet)
    select = parse_selector(args.select) if args.select is not None else None
    plan = plan_rollout(
        fleet,
        args.model,
        args.classes,
        args.version,
        args.canary,
        args.batch,
        args.max_failed,
        args.timeout_s,
        select=select,
        parallel=args.parallel,
        count_pending=args.count_pending,
    )
    if args.dry_run:
        print(json.dumps(plan.to_json(), indent=2))
        return 0
    result = rollout(fleet, plan)
    if args.json:
        print(json.dumps(result.records(), indent=2))
    else:
        columns = ["board", "class", "model", "from_version", "to_version", "result", "runs", "error"]
        print(tabulate([_row(record, columns) for record in result.records()], headers=columns))
        if result.stopped:
            print(f"stopped: {result.stopped}")
        elif result.pending:
            print(
                f"pending (not reachable at their turn; they pull their version when back): {', '.join(result.pending)}"
            )
    return 0 if result.ok else DeployError.exit_code


def _row(record: dict, columns: list[str]) -> list:
    """A table row; `runs` is what the board was read back running (none: no release active)."""
    cells = {**record, "runs": "none" if record["runs"] is None else record["runs"]}
    if record["downgrade"]:
        cells["result"] = f"{record['result']} (downgrade)"
    return [cells[c] if cells[c] is not None else "" for c in columns]
