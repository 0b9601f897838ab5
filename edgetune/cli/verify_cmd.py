"""`edgetune verify PATH`: check an artifact (version directory or .tar.gz) before using it."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgetune.artifact.signing import load_public_key
from edgetune.artifact.verify import verify_artifact
from edgetune.cli.common import add_fleet_argument
from edgetune.inventory import load_fleet


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify", help="check an artifact's files against its manifest and its signature"
    )
    parser.add_argument("path", type=Path, help="an artifact version directory or its .tar.gz")
    parser.add_argument(
        "--public-key", type=Path, help="PEM public key (default: artifacts.public_key of the fleet)"
    )
    add_fleet_argument(parser)
    parser.set_defaults(func=drive_verify)


def drive_verify(args: argparse.Namespace) -> int:
    key_path = args.public_key or load_fleet(args.fleet).artifacts.public_key
    manifest = verify_artifact(args.path, load_public_key(key_path))
    inputs = manifest.inputs
    print(
        f"OK {args.path}: {inputs.model} for {inputs.device_class} v{manifest.version}, "
        f"{len(manifest.files)} files, signature valid ({key_path})"
    )
    return 0
