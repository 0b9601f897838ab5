"""`edgetune import MODEL.onnx [--name N] [-f FLEET]`: print the fleet.yaml `models:` entry of a
model, and after it (as YAML comments) the `tuning.time_limit_s` that gives each of the
model's tasks a round: its task count times a round of trials at the trial rate the fleet's
workdir measured (the slowest class's), or at a stated default rate where none was measured.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from edgetune.errors import EdgetuneError, InventoryError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "import", help="print the fleet.yaml models: entry of an ONNX model (inputs read from its graph) "
                       "and a tuning time limit that fits it"
    )
    parser.add_argument("onnx", type=Path, help="the ONNX file, as fleet.yaml will name it (relative to its folder)")
    parser.add_argument("--name", help="the model's name in the inventory (default: from the file name)")
    parser.add_argument("-f", "--fleet", default="fleet.yaml",
                        help="the inventory whose class target and measured trial rate size the suggested time "
                             "limit (default: fleet.yaml, where it exists)")
    parser.set_defaults(func=drive_import)


def drive_import(args: argparse.Namespace) -> int:
    from edgetune.compiler.models.onnx_inputs import model_entry

    if not args.onnx.is_file():
        raise InventoryError(f"{args.onnx}: no such ONNX file")
    name = args.name or re.sub(r"[^A-Za-z0-9_.-]+", "-", args.onnx.stem).strip("-_.") or "model"
    print(model_entry(args.onnx, name), end="")
    print(time_limit_comment(args.onnx, name, Path(args.fleet)), end="")
    return 0


def time_limit_comment(onnx_path: Path, name: str, fleet_path: Path) -> str:
    """The suggested `tuning.time_limit_s` as YAML comment lines (`budget.suggest_time_limit`)."""
    from edgetune.inventory.schema import DEFAULT_TRIALS_PER_ITER
    from edgetune.tune.budget import suggest_time_limit

    fleet, fleet_note = _fleet_if_any(fleet_path)
    try:
        tasks = _task_count(onnx_path, name, fleet)
    except EdgetuneError as err:
        return f"# no tuning time limit suggested: the model's tasks could not be extracted ({err})\n"
    per_iter = fleet.tuning.trials_per_iter if fleet else DEFAULT_TRIALS_PER_ITER
    suggestion = suggest_time_limit(tasks, per_iter, _slowest_measured_rate(fleet) if fleet else None)
    return (
        f"# tuning time budget{fleet_note}: {suggestion.explain()}.\n"
        "# Add it to fleet.yaml's tuning: section (a limit per class run; with no trial budget set, the run\n"
        "# gives every task a round, then rounds to the tasks expected to gain most, until the limit):\n"
        "# tuning:\n"
        f"#   time_limit_s: {suggestion.time_limit_s}\n"
    )


def _fleet_if_any(path: Path):
    """(the inventory at `path`, a note) where it exists and loads, else (None, why not)."""
    from edgetune.inventory import load_fleet

    if not path.is_file():
        return None, ""
    try:
        return load_fleet(path), f" (rate from {path}'s workdir)"
    except InventoryError as err:
        return None, f" ({path} did not load: {err})"


def _task_count(onnx_path: Path, name: str, fleet) -> int:
    """The tasks of the model as imported (dynamic dimensions at 1), extracted for the fleet's
    first class's target, else for a one-core generic x86-64 target."""
    import tvm

    from edgetune.compiler.models.onnx_inputs import graph_inputs, read_graph
    from edgetune.compiler.target import build_target
    from edgetune.compiler.tasks import class_tasks
    from edgetune.inventory.schema import DTYPES, Model, ModelInput

    inputs = graph_inputs(read_graph(onnx_path))
    unfed = [i.describe() for i in inputs if i.dims is None or i.dtype not in DTYPES]
    if unfed:
        raise InventoryError(f"inputs of unknown rank or of a dtype edgetune cannot feed: {', '.join(unfed)}")
    model = Model(name=name, onnx=onnx_path.resolve(), inputs=tuple(
        ModelInput(i.name, tuple(d if isinstance(d, int) and d > 0 else 1 for d in i.dims), i.dtype) for i in inputs
    ))
    target = (build_target(fleet.device_classes[0].profile) if fleet and fleet.device_classes
              else tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 1}))
    return len(class_tasks((model,), target).tasks)


def _slowest_measured_rate(fleet):
    """The measured trial rate of the fleet's slowest class (None where no class measured one):
    each class runs to the limit on its own, so the slowest must fit."""
    from edgetune.tune.database import ClassDatabasePaths, throughput

    measured = [throughput(ClassDatabasePaths.of(fleet.workdir, c.name)) for c in fleet.device_classes]
    measured = [m for m in measured if m is not None]
    return max(measured, key=lambda m: m.seconds_per_trial) if measured else None

