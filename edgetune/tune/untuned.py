"""Each kernel's time without a schedule, measured once per class on its boards: where the tuning
curve starts (`report.early_curve` counts a kernel not measured yet at this time), and the time
the class's untuned build spends in it (relax builds a kernel without a record as its
unscheduled TIR, as here).

At a class run's start, the searched kernels without a recorded untuned time are built as they
are, by the run's candidate builder, and measured in one batch by its runner, before the first
round. The times go to the class database (`untuned.jsonl`), so a resumed run measures none of
them again; a kernel whose build or measurement failed is recorded as failed (None) and not
tried again: the curve then counts it at its first measured time, as before any was measured.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Mapping

import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import BuilderInput
from tvm.s_tir.meta_schedule.runner import RunnerInput

from edgetune.tune.database import ClassDatabasePaths, append_untuned, untuned_times

log = logging.getLogger(__name__)
DEVICE_TYPE = "cpu"  # every edgetune target is an llvm one


def measure_untuned(
    device_class: str, kernels: Mapping[str, ms.ExtractedTask], target: tvm.target.Target,
    builder: ms.builder.Builder, runner: ms.runner.Runner, paths: ClassDatabasePaths,
) -> dict[str, float | None]:
    """Build and measure the kernels (workload hash -> extracted task) that have no untuned
    time in the class database yet; record and return what was measured (None: failed)."""
    recorded = untuned_times(paths)
    todo = {h: task for h, task in kernels.items() if h not in recorded}
    if not todo:
        return {}
    started = time.monotonic()
    times, errors = _measure(list(todo.items()), target, builder, runner)
    append_untuned(paths, times)
    log.info("[%s] untuned time of %d kernels measured in %.1f s", device_class, len(times) - len(errors),
             time.monotonic() - started)
    for workload_hash, error in errors.items():
        log.warning("[%s] kernel %s: no untuned time (the curve counts it at its first measured time): %s",
                    device_class, kernels[workload_hash].task_name, error.strip().splitlines()[-1] if error.strip() else "")
    return times


def _measure(kernels: list[tuple[str, ms.ExtractedTask]], target: tvm.target.Target, builder: ms.builder.Builder,
             runner: ms.runner.Runner) -> tuple[dict[str, float | None], dict[str, str]]:
    """Times by workload hash (None where it failed), and the failures' messages."""
    times: dict[str, float | None] = {h: None for h, _ in kernels}
    built = builder.build([BuilderInput(task.dispatched[0], target) for _, task in kernels])
    errors = {h: result.error_msg for (h, _), result in zip(kernels, built) if result.error_msg is not None}
    runnable = [(h, task.dispatched[0], result.artifact_path)
                for (h, task), result in zip(kernels, built) if result.error_msg is None]
    try:
        futures = runner.run([
            RunnerInput(artifact, DEVICE_TYPE, ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True))
            for _, mod, artifact in runnable
        ])
        for (workload_hash, _, _), future in zip(runnable, futures):
            result = future.result()
            if result.error_msg is None and result.run_secs:
                times[workload_hash] = sum(float(s) for s in result.run_secs) / len(result.run_secs)
            else:
                errors[workload_hash] = result.error_msg or "no timing returned"
    finally:
        for _, _, artifact in runnable:  # each candidate has a directory of its own (SharedLibraryExport)
            shutil.rmtree(os.path.dirname(artifact), ignore_errors=True)
    return times, errors
