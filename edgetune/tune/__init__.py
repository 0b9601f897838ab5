"""Tuning: per device class, the models' kernels tuned with MetaSchedule on the class's boards
(through the fleet tracker) into one tuning database per class, and the pieces the artifact
release reuses to build exactly the way the tuner measured.

Modules, one role each:
- `models`: the inventory's models (ONNX or built-in) as Relax modules, reference input/output;
- `prepare`, `target`, `intrinsics`: the Relax pipeline before tuning and building, the TVM target;
- `tasks`, `plan`: the class's deduplicated kernels and the trial budget (`tune --dry-run`);
- `stop`: a stop asked for by a signal, read before every round;
- `tuner`: runs the classes (`tune_fleet`, `tune_class`) with `candidate_builder` (MetaSchedule's
  builds of candidates on the host), `runner` (the RPCRunner on the class's boards), `monitor`
  (progress, cost model, stop), `borrow` (seeding from a donor class);
- `database`, `report`: the class databases, and the reports computed from them.

The names below are the package's public face: what the artifact release, the regression
re-tune, the pipeline and the CLI use. They are imported on first use, because the tuner pulls
in MetaSchedule and matplotlib (seconds) and `edgetune check` needs only the target. The
function `prepare` is not among them: its module of the same name would shadow it here.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "SharedLibraryExport": "candidate_builder",
    "recorded_trials": "database",
    "entry_function": "models",
    "load_model": "models",
    "reference_inputs": "models",
    "reference_outputs": "models",
    "rounding_spread": "models",
    "TuningPlan": "plan",
    "plan_tuning": "plan",
    "select_models": "plan",
    "apply_database_and_build": "prepare",
    "build_untuned": "prepare",
    "count_tuned_tasks": "prepare",
    "build_target": "target",
    "check_targets": "target",
    "stop_on_signals": "stop",
    "stop_requested": "stop",
    "class_task_list": "tasks",
    "TuneOptions": "tuner",
    "TuneResult": "tuner",
    "tune_class": "tuner",
    "tune_fleet": "tuner",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> object:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'edgetune.tune' has no attribute {name!r}")
    return getattr(importlib.import_module(f"edgetune.tune.{_PUBLIC[name]}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
