"""`edgetune verify PATH`: check an artifact (version directory or .tar.gz) before using it, or
an artifacts directory's signed index."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgetune.artifact.index_check import verify_index
from edgetune.artifact_format.places import INDEX_NAME
from edgetune.artifact_format.signing import load_public_key
from edgetune.artifact_format.verify import Expected, verify_artifact
from edgetune.cli.common import add_fleet_argument
from edgetune.errors import ArtifactError
from edgetune.inventory import load_fleet


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check an artifact's signature, files and identity, or an artifacts directory's index",
        description=(
            "Check an artifact against its signed manifest. Inside an artifacts directory, the "
            "manifest must also be the model, class and version of the path it is found at. "
            "Given the artifacts directory itself, check its signed index.json."
        ),
    )
    parser.add_argument(
        "path", type=Path, help="an artifact version directory or its .tar.gz, or an artifacts directory"
    )
    parser.add_argument("--model", help="refuse an artifact built for another model")
    parser.add_argument("--class", dest="device_class", help="refuse an artifact built for another device class")
    parser.add_argument("--min-version", type=int, help="refuse an artifact older than this version")
    parser.add_argument("--public-key", type=Path, help="PEM public key (default: artifacts.public_key of the fleet)")
    add_fleet_argument(parser)
    parser.set_defaults(func=drive_verify)


def drive_verify(args: argparse.Namespace) -> int:
    key_path = args.public_key or load_fleet(args.fleet).artifacts.public_key
    public_key = load_public_key(key_path)
    if args.path.is_dir() and (args.path / INDEX_NAME).exists():
        return _verify_store_index(args, public_key, key_path)
    expect = Expected.for_path(args.path, args.model, args.device_class, args.min_version)
    manifest = verify_artifact(args.path, public_key, expect)
    inputs = manifest.inputs
    place = f", in its place {expect.stored_as}" if expect.stored_as else ""
    print(
        f"OK {args.path}: {inputs.model} for {inputs.device_class} v{manifest.version}{place}, "
        f"{len(manifest.files)} files, signature valid ({key_path})"
    )
    return 0


def _verify_store_index(args: argparse.Namespace, public_key, key_path: Path) -> int:
    if args.model or args.device_class or args.min_version is not None:
        raise ArtifactError(
            f"{args.path} is an artifacts directory: --model, --class and --min-version apply to one "
            "artifact (give its v<N> directory or v<N>.tar.gz)"
        )
    index = verify_index(args.path, public_key)
    print(
        f"OK {args.path}: {INDEX_NAME} lists {len(index.versions)} versions, each with its manifest, "
        f"signature valid ({key_path})"
    )
    return 0
