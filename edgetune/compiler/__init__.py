"""The compiler half of edgetune: what a model's kernels are and how they are compiled for a
device class's target, before and after tuning. It needs nothing of the fleet: the tuning run
(`edgetune.tune`), the artifact release and the regression checks all compile through it.

- `models`: the inventory's models (ONNX or built-in) as Relax modules (`import_pipeline`: the
  passes from the frontend's module to the model's), reference input/output;
- `prepare`: `edgetune_pipeline`, the pass pipeline from an imported module to the one tuning
  and building share, and the build of that module with a database;
- `relax`: the Relax graph rewrites (layout, integer arithmetic, Winograd, channel padding,
  fast math, constants folded with NumPy);
- `tir`: the kernels the pipeline schedules itself and the MetaSchedule schedule rules
  (registered by `register_schedule_rules()`, never by an import);
- `target`, `intrinsics`: the TVM target of a device profile and its CPU's tensor intrinsics;
- `tasks`: a class's deduplicated kernels, as MetaSchedule extracts them.

The names below are the package's public face, imported on first use (TVM's Relax pipeline
takes seconds to import and `edgetune check` needs only the target). The function `prepare` is
not among them: its module of the same name would shadow it here. docs/compiler.md is the reference.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "entry_function": "models",
    "import_pipeline": "models",
    "load_model": "models",
    "reference_inputs": "models",
    "reference_outputs": "models",
    "rounding_spread": "models",
    "apply_database_and_build": "prepare",
    "build_untuned": "prepare",
    "count_tuned_tasks": "prepare",
    "edgetune_pipeline": "prepare",
    "kernel_hash": "prepare",
    "build_target": "target",
    "check_targets": "target",
    "class_task_list": "tasks",
    "register_schedule_rules": "tir.rules",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> object:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'edgetune.compiler' has no attribute {name!r}")
    return getattr(importlib.import_module(f"edgetune.compiler.{_PUBLIC[name]}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
