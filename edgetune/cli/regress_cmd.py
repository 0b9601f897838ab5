"""`edgetune regress`: after a firmware change, are the deployed models still right and fast?

Exit code: 0 every board checked is ok (or faster); else, the first that applies: 5 a regression
(`slower`, `wrong_output`, `load_failed`), 3 a board could not be reached, 6 a board runs no
release of a model checked (`not_deployed`)."""

from __future__ import annotations

import argparse
import json

from tabulate import tabulate

from edgetune.cli.common import add_fleet_argument, add_select_argument, load_checked_fleet, selected_boards
from edgetune.errors import InventoryError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("regress", help="re-check deployed artifacts on the boards against their baselines")
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--board", dest="boards", action="append", default=[], metavar="BOARD", help="only this board (repeatable)"
    )
    which.add_argument(
        "--class",
        dest="classes",
        action="append",
        default=[],
        metavar="CLASS",
        help="only this class's boards (repeatable)",
    )
    add_select_argument(parser)
    parser.add_argument(
        "--model", dest="models", action="append", default=[], metavar="MODEL", help="only this model (repeatable)"
    )
    parser.add_argument(
        "--changed-only", action="store_true", help="only boards whose firmware changed since the baseline"
    )
    parser.add_argument("--json", action="store_true", help="one JSON record per board and model")
    parser.add_argument(
        "--retune", action="store_true", help="re-tune and rebuild the classes found slower (no rollout)"
    )
    parser.add_argument(
        "--retune-trials", type=int, metavar="N", help="extra trials per re-tuned class (default: its budget)"
    )
    add_fleet_argument(parser)
    parser.set_defaults(func=drive_regress)


def drive_regress(args: argparse.Namespace) -> int:
    from edgetune.regress.check import regress

    fleet = load_checked_fleet(args)
    boards, classes = args.boards, args.classes
    if args.select is not None:  # the selected boards among those named, or of the classes named
        chosen = [
            b
            for b in selected_boards(fleet, args)
            if (not boards or b.name in boards) and (not classes or b.device_class in classes)
        ]
        if not chosen:
            raise InventoryError(f"--select {args.select} matches none of the boards --board or --class names")
        boards, classes = [b.name for b in chosen], []
    report = regress(fleet, boards, classes, args.models, args.changed_only)
    if args.json:
        print(json.dumps([v.to_json() for v in report.verdicts], indent=2))
    else:
        print(
            tabulate(
                [_row(v) for v in report.verdicts],
                headers=[
                    "board",
                    "class",
                    "model",
                    "version",
                    "verdict",
                    "ratio [interval]",
                    "now ms",
                    "baseline ms",
                    "firmware",
                    "detail",
                ],
            )
        )
    if args.retune and report.slower_classes():
        from edgetune.regress.retune import retune

        rows = retune(fleet, report, args.models, args.retune_trials)
        print(
            tabulate(
                [
                    [
                        r.device_class,
                        r.model,
                        _v(r.deployed_version),
                        _ms(r.baseline_ms),
                        _ms(r.now_ms),
                        _v(r.new_version),
                        _ms(r.new_ms),
                        r.status,
                        r.error or "",
                    ]
                    for r in rows
                ],
                headers=["class", "model", "deployed", "baseline ms", "now ms", "new", "new ms", "build", "error"],
            )
        )
        print("the new versions are built, not rolled out: `edgetune rollout --model M --class C` when satisfied")
    return report.exit_code


def _row(v) -> list:
    ratio = f"{v.ratio:.2f} [{v.interval[0]:.2f}, {v.interval[1]:.2f}]" if v.ratio else ""
    firmware = "" if v.firmware_changed is None else ("CHANGED" if v.firmware_changed else "same")
    return [
        v.board,
        v.device_class,
        v.model,
        _v(v.version),
        v.verdict,
        ratio,
        _ms(v.median_ms),
        _ms(v.baseline_ms),
        firmware,
        v.detail.splitlines()[0] if v.detail else "",
    ]


def _v(version: int | None) -> str:
    return f"v{version}" if version else ""


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"
