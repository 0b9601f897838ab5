"""The compiler half of edgetune: what a model's kernels are and how they are compiled for a
device class's target, before and after tuning. It needs nothing of the fleet: the tuning run
(`edgetune.tune`), the artifact release and the regression checks all compile through it.

Modules, one role each:
- `models`: the inventory's models (ONNX or built-in) as Relax modules, reference input/output;
- `layout`, `integer`, `graph`: graph rewrites (NHWC convolutions, integer arithmetic);
- `prepare`, `prepack`, `fast_math`, `concatenation`, `single_pixel`: the Relax pipeline before
  tuning and building (pre-packed weights, vector element-wise functions, the kernels it
  schedules itself);
- `target`, `intrinsics`: the TVM target of a device profile and its CPU's tensor intrinsics;
- `schedule_rules`: edgetune's MetaSchedule rules (GEMM and depthwise micro-kernels);
- `tasks`: a class's deduplicated kernels, as MetaSchedule extracts them.

The names below are the package's public face, imported on first use (TVM's Relax pipeline
takes seconds to import and `edgetune check` needs only the target). The function `prepare` is
not among them: its module of the same name would shadow it here.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "entry_function": "models",
    "load_model": "models",
    "reference_inputs": "models",
    "reference_outputs": "models",
    "rounding_spread": "models",
    "apply_database_and_build": "prepare",
    "build_untuned": "prepare",
    "count_tuned_tasks": "prepare",
    "kernel_hash": "prepare",
    "build_target": "target",
    "check_targets": "target",
    "class_task_list": "tasks",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> object:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'edgetune.compiler' has no attribute {name!r}")
    return getattr(importlib.import_module(f"edgetune.compiler.{_PUBLIC[name]}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
