"""`edgetune build`: build, measure, check, sign and store an artifact per (model, class)."""

from __future__ import annotations

import argparse

from edgetune.cli.common import add_fleet_argument, load_checked_fleet
from edgetune.errors import ArtifactError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("build", help="build signed, versioned artifacts from the class tuning databases")
    add_fleet_argument(parser)
    parser.add_argument(
        "--class",
        dest="classes",
        action="append",
        default=[],
        metavar="CLASS",
        help="only this device class (repeatable; default: all)",
    )
    parser.add_argument(
        "--model",
        dest="models",
        action="append",
        default=[],
        metavar="MODEL",
        help="only this model (repeatable; default: all)",
    )
    parser.set_defaults(func=drive_build)


def drive_build(args: argparse.Namespace) -> int:
    from edgetune.artifact.release import build_artifacts

    report = build_artifacts(load_checked_fleet(args), classes=args.classes, models=args.models)
    print(report.table())
    for line in report.layouts():
        print(line)
    for line in report.warnings():
        print(f"warning: {line}")
    for line in report.failures():
        print(f"error: {line}")
    return 0 if report.ok else ArtifactError.exit_code
