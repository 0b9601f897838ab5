"""Tuning runs: per device class, the models' kernels tuned with MetaSchedule on the class's
boards (through the fleet tracker) into one tuning database per class. What is compiled and how
(models, graph rewrites, schedule rules, targets, task extraction) is `edgetune.compiler`, which
needs nothing of the fleet; this package drives the boards.

Modules, one role each:
- `plan`, `budget`: the trial budget of a class and how it is dealt to tasks (`tune --dry-run`);
- `stop`: a stop asked for by a signal, read before every round;
- `tuner`: runs the classes (`tune_fleet`, `tune_class`) with `candidate_builder` (MetaSchedule's
  builds of candidates on the host), `runner` (the RPCRunner on the class's boards, with
  `index_inputs` for kernels that index with a runtime input), `scheduler` (which task measures
  next), `monitor` (progress, cost model, stop), `borrow` (seeding from a donor class),
  `untuned` (each kernel's time without a schedule, where the curve starts), `native_log`
  (TVM's and onnxruntime's console warnings to the run's log);
- `database`, `report`: the class databases, and the reports computed from them;
- `on_ray`: the class runs and candidate builds on a Ray cluster (`compute: {ray: ...}`), the
  one place that imports Ray.

The names below are the package's public face: what the artifact release, the regression
re-tune, the pipeline and the CLI use. They are imported on first use, because the tuner pulls
in MetaSchedule and matplotlib (seconds).
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "SharedLibraryExport": "candidate_builder",
    "connect_cluster": "on_ray.cluster",
    "recorded_trials": "database",
    "TuningPlan": "plan",
    "plan_tuning": "plan",
    "select_models": "plan",
    "stop_on_signals": "stop",
    "stop_requested": "stop",
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
