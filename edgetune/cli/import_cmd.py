"""`edgetune import MODEL.onnx [--name N] [-f FLEET]`: print the fleet.yaml `models:` entry of a
model, and after it (as YAML comments) the `tuning.time_limit_s` that gives each of the
model's tasks a round: its task count times a round of trials at the trial rate the fleet's
workdir measured (the slowest class's), or at a stated default rate where none was measured.

Stdout holds the entry and its comments alone, valid YAML whatever happens: the model is
converted and its tasks extracted before anything is printed, with whatever TVM and onnxruntime
write to stdout (the ONNX converter's `print`s, native writes to descriptor 1) sent to stderr and
their native warnings to a log that is dropped (`tune.native_log`; kept on stderr with
`--verbose`). A model with dynamic sizes (a dimension the graph leaves open, or an input of
unknown rank) is not run: the comment names those inputs and says where to give their sizes. A
conversion or task extraction that fails leaves the entry printed with the problem as a comment,
and the error on stderr (exit 4, TuneError; 2, InventoryError, for an input of a dtype edgetune
cannot feed).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, redirect_stdout
from pathlib import Path

from edgetune.errors import EdgetuneError, InventoryError, TuneError

INPUT_SHAPE_FIELD = "models[].inputs[].shape"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "import",
        help="print the fleet.yaml models: entry of an ONNX model (inputs read from its graph) "
        "and a tuning time limit that fits it",
    )
    parser.add_argument("onnx", type=Path, help="the ONNX file, as fleet.yaml will name it (relative to its folder)")
    parser.add_argument("--name", help="the model's name in the inventory (default: from the file name)")
    parser.add_argument(
        "-f",
        "--fleet",
        default="fleet.yaml",
        help="the inventory whose class target and measured trial rate size the suggested time "
        "limit (default: fleet.yaml, where it exists)",
    )
    parser.set_defaults(func=drive_import)


def drive_import(args: argparse.Namespace) -> int:
    from edgetune.compiler.models.onnx_inputs import model_entry

    if not args.onnx.is_file():
        raise InventoryError(f"{args.onnx}: no such ONNX file")
    name = args.name or re.sub(r"[^A-Za-z0-9_.-]+", "-", args.onnx.stem).strip("-_.") or "model"
    entry = model_entry(args.onnx, name)
    with libraries_off_stdout(keep_warnings=getattr(args, "verbose", False)):
        comment, error = time_limit_comment(args.onnx, name, Path(args.fleet))
    print(entry + comment, end="", flush=True)
    if error is not None:
        raise error
    return 0


@contextmanager
def libraries_off_stdout(keep_warnings: bool = False) -> Iterator[None]:
    """Inside: Python's `print`s and writes to descriptor 1 go to stderr (TVM's ONNX converter
    prints `Error converting operator ...` to stdout); TVM's and onnxruntime's native warnings
    on descriptor 2 go to a log dropped on leaving (`native_warnings_to`), unless
    `keep_warnings`; every other line reaches stderr."""
    from edgetune.tune.native_log import NATIVE_LOG, native_warnings_to

    sys.stdout.flush()
    with (
        tempfile.TemporaryDirectory(prefix="edgetune-import-") as tmp,
        nullcontext() if keep_warnings else native_warnings_to(Path(tmp) / NATIVE_LOG),
    ):
        sys.stderr.flush()
        stdout = os.dup(1)
        os.dup2(2, 1)
        try:
            with redirect_stdout(sys.stderr):
                yield
        finally:
            sys.stderr.flush()
            os.dup2(stdout, 1)
            os.close(stdout)


def comment_lines(text: str) -> str:
    """`text` as YAML comment lines: every line of it starts with `# `, whatever it holds."""
    return "".join(f"# {line}".rstrip() + "\n" for line in text.splitlines() or [""])


def time_limit_comment(onnx_path: Path, name: str, fleet_path: Path) -> tuple[str, EdgetuneError | None]:
    """The suggested `tuning.time_limit_s` as YAML comment lines (`budget.suggest_time_limit`),
    or the comment saying why there is none; with the error to report where the model's tasks
    could not be extracted (its message folded to one line)."""
    from edgetune.compiler.models.onnx_import import error_line
    from edgetune.compiler.models.onnx_inputs import graph_inputs, read_graph
    from edgetune.inventory.schema import DEFAULT_TRIALS_PER_ITER
    from edgetune.tune.budget import suggest_time_limit

    inputs = graph_inputs(read_graph(onnx_path))
    unsized = [i for i in inputs if i.dims is None or i.dynamic]
    if unsized:
        return _dynamic_sizes_comment(unsized), None
    fleet, fleet_note = _fleet_if_any(fleet_path)
    try:
        tasks = _task_count(onnx_path, name, inputs, fleet)
    except EdgetuneError as err:
        error = _one_line(err)
    except Exception as err:  # noqa: BLE001 -- TVM raises many kinds (InternalError, ValueError, ...)
        error = TuneError(f"model {name!r} ({onnx_path}): TVM cannot extract its tasks: {error_line(err)}")
        error.__cause__ = err
    else:
        per_iter = fleet.tuning.trials_per_iter if fleet else DEFAULT_TRIALS_PER_ITER
        suggestion = suggest_time_limit(tasks, per_iter, _slowest_measured_rate(fleet) if fleet else None)
        return (
            comment_lines(f"tuning time budget{fleet_note}: {suggestion.explain()}.")
            + "# Add it to fleet.yaml's tuning: section (a limit per class run; with no trial budget set, the run\n"
            "# gives every task a round, then rounds to the tasks expected to gain most, until the limit):\n"
            "# tuning:\n"
            f"#   time_limit_s: {suggestion.time_limit_s}\n"
        ), None
    why = error if isinstance(error, InventoryError) else f"the model's tasks could not be extracted: {error}"
    return comment_lines(f"no tuning time limit suggested: {why}"), error


def _one_line(err: EdgetuneError) -> EdgetuneError:
    """`err`, or where its message spans lines, an error of its kind (its nearest type of
    edgetune.errors, which sets the exit code) with the message on one line."""
    from edgetune.compiler.models.onnx_import import error_line

    line = error_line(err)
    if line == str(err):
        return err
    kind = next(cls for cls in type(err).__mro__ if cls.__module__ == EdgetuneError.__module__)
    folded = kind(line)
    folded.__cause__ = err
    return folded


def _dynamic_sizes_comment(unsized) -> str:
    """Why no limit is suggested for a model whose input sizes are left open, and what to do."""
    described = "; ".join(i.describe() + (" (rank unknown)" if i.dims is None else "") for i in unsized)
    return comment_lines(
        f"no tuning time limit suggested: input(s) with dynamic sizes: {described}.\n"
        "The model is not run at sizes it will not have: give the sizes the boards use in fleet.yaml\n"
        f"({INPUT_SHAPE_FIELD}: the shape: lines above), then run `edgetune plan` for the tuning budget."
    )


def _fleet_if_any(path: Path):
    """(the inventory at `path`, a note) where it exists and loads, else (None, why not)."""
    from edgetune.compiler.models.onnx_import import error_line
    from edgetune.inventory import load_fleet

    if not path.is_file():
        return None, ""
    try:
        return load_fleet(path), f" (rate from {path}'s workdir)"
    except InventoryError as err:
        return None, f" ({path} did not load: {error_line(err)})"


def _task_count(onnx_path: Path, name: str, inputs, fleet) -> int:
    """The tasks of the model at the sizes its graph states, extracted for the fleet's first
    class's target, else for a one-core generic x86-64 target."""
    import tvm

    from edgetune.compiler.target import build_target
    from edgetune.compiler.tasks import class_tasks
    from edgetune.inventory.schema import DTYPES, Model, ModelInput

    unfed = [i.describe() for i in inputs if i.dtype not in DTYPES]
    if unfed:
        raise InventoryError(
            f"model {name!r} ({onnx_path}): input(s) of a dtype edgetune cannot feed "
            f"({', '.join(DTYPES)}): {'; '.join(unfed)}"
        )
    model = Model(
        name=name, onnx=onnx_path.resolve(), inputs=tuple(ModelInput(i.name, tuple(i.dims), i.dtype) for i in inputs)
    )
    target = (
        build_target(fleet.device_classes[0].profile)
        if fleet and fleet.device_classes
        else tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 1})
    )
    return len(class_tasks((model,), target).tasks)


def _slowest_measured_rate(fleet):
    """The measured trial rate of the fleet's slowest class (None where no class measured one):
    each class runs to the limit on its own, so the slowest must fit."""
    from edgetune.tune.database import ClassDatabasePaths, throughput

    measured = [throughput(ClassDatabasePaths.of(fleet.workdir, c.name)) for c in fleet.device_classes]
    measured = [m for m in measured if m is not None]
    return max(measured, key=lambda m: m.seconds_per_trial) if measured else None
