"""Each kernel's time without a schedule, measured once per class on its boards: where the tuning
curve starts (`report.early_curve` counts a kernel not measured yet at this time), and the time
the class's untuned build spends in it (relax builds a kernel without a record as its
unscheduled TIR, as here).

At a class run's start, the searched kernels without a recorded untuned time are built as they
are, by the run's candidate builder, and measured in one batch by its runner, before the first
round; with them the kernels `prepare` scheduled itself, which are never searched, so this time
is theirs in every estimate (`report.scheduled_latency`). The times go to the class database (`untuned.jsonl`), so a resumed run measures none of
them again; a kernel whose build or measurement failed is recorded as failed (None) and not
tried again: the curve then counts it at its first measured time, as before any was measured.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import tvm
from tvm.s_tir import meta_schedule as ms

from edgetune.tune.database import ClassDatabasePaths, append_untuned, untuned_times
from edgetune.tune.runner import build_and_measure

log = logging.getLogger(__name__)


def measure_untuned(
    device_class: str,
    kernels: Mapping[str, ms.ExtractedTask],
    target: tvm.target.Target,
    builder: ms.builder.Builder,
    runner: ms.runner.Runner,
    paths: ClassDatabasePaths,
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
    log.info(
        "[%s] untuned time of %d kernels measured in %.1f s",
        device_class,
        len(times) - len(errors),
        time.monotonic() - started,
    )
    for workload_hash, error in errors.items():
        log.warning(
            "[%s] kernel %s: no untuned time (the curve counts it at its first measured time): %s",
            device_class,
            kernels[workload_hash].task_name,
            error.strip().splitlines()[-1] if error.strip() else "",
        )
    return times


def _measure(
    kernels: list[tuple[str, ms.ExtractedTask]],
    target: tvm.target.Target,
    builder: ms.builder.Builder,
    runner: ms.runner.Runner,
) -> tuple[dict[str, float | None], dict[str, str]]:
    """Times by workload hash (None where it failed), and the failures' messages."""
    measured = build_and_measure([task.dispatched[0] for _, task in kernels], target, builder, runner)
    times = {
        h: None if m.run_secs is None else sum(m.run_secs) / len(m.run_secs) for (h, _), m in zip(kernels, measured)
    }
    return times, {h: m.error for (h, _), m in zip(kernels, measured) if m.error}
