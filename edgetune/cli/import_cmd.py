"""`edgetune import MODEL.onnx [--name N]`: print the fleet.yaml `models:` entry of a model."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from edgetune.errors import InventoryError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "import", help="print the fleet.yaml models: entry of an ONNX model (inputs read from its graph)"
    )
    parser.add_argument("onnx", type=Path, help="the ONNX file, as fleet.yaml will name it (relative to its folder)")
    parser.add_argument("--name", help="the model's name in the inventory (default: from the file name)")
    parser.set_defaults(func=drive_import)


def drive_import(args: argparse.Namespace) -> int:
    from edgetune.tune.models.onnx_inputs import model_entry

    if not args.onnx.is_file():
        raise InventoryError(f"{args.onnx}: no such ONNX file")
    name = args.name or re.sub(r"[^A-Za-z0-9_.-]+", "-", args.onnx.stem).strip("-_.") or "model"
    print(model_entry(args.onnx, name), end="")
    return 0
