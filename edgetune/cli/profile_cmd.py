"""`edgetune profile MODEL`: where a built artifact's time goes on a board of its class, kernel
by kernel, next to onnxruntime's per-operator profile of the same model."""

from __future__ import annotations

import argparse
import json

from edgetune.cli.common import add_fleet_argument, load_checked_fleet, positive_int


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="time a built artifact's kernels on a board, next to onnxruntime's operators",
        description=(
            "Time every kernel of a built artifact on one board of its class (through the tracker: "
            "run `edgetune fleet up` first), and the whole model call; profile the same ONNX model "
            "with onnxruntime on the host (boards carry no onnxruntime). Rows meet by kernel kind."
        ),
    )
    parser.add_argument("model", help="a model of the inventory")
    add_fleet_argument(parser)
    parser.add_argument(
        "--class",
        dest="device_class",
        metavar="CLASS",
        help="the device class (default: the one class the model is built for)",
    )
    parser.add_argument("--version", type=positive_int, help="the artifact version (default: the latest)")
    parser.add_argument(
        "--board", help="the board to run on (default: the first of the class registered with the tracker)"
    )
    parser.add_argument(
        "--repeat",
        type=positive_int,
        help="samples per kernel (default: the class profile's measurement.repeat)",
    )
    parser.add_argument("--json", action="store_true", help="print the whole profile as JSON")
    parser.set_defaults(func=drive_profile)


def drive_profile(args: argparse.Namespace) -> int:
    from edgetune.artifact.board_profile import profile_artifact

    profile = profile_artifact(
        load_checked_fleet(args), args.model, args.device_class, args.version, args.board, args.repeat
    )
    print(json.dumps(profile.as_json(), indent=1) if args.json else profile.table())
    return 0
