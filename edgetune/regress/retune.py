"""`edgetune regress --retune`: re-tune and rebuild the classes found slower; never rolls out.

The class database is resumed, not restarted: its records stay, and the search gets `extra`
more trials (and per-task room for them), measured on the boards as they are now (on the new
firmware). The rebuild makes a new version only if the database changed; the report puts the
latency of the version the boards run (its baseline, and as measured now) beside the new
version's, per class and model. Rolling the new version out is the operator's decision.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from edgetune.artifact.release import build_artifacts
from edgetune.compiler import class_task_list
from edgetune.inventory.schema import Fleet
from edgetune.regress.check import SLOWER, RegressReport
from edgetune.tune import TuneOptions, recorded_trials, select_models, tune_class


@dataclass(frozen=True)
class RetuneRow:
    device_class: str
    model: str
    deployed_version: int | None
    baseline_ms: float | None  # the deployed version's baseline (build time, old firmware)
    now_ms: float | None  # the deployed version measured by this check (new firmware)
    new_version: int | None
    new_ms: float | None  # the rebuilt version, measured at its build (new firmware)
    status: str  # built | unchanged | failed
    error: str | None = None


def retune(
    fleet: Fleet, report: RegressReport, models: Sequence[str] = (), extra_trials: int | None = None
) -> list[RetuneRow]:
    """Re-tune and rebuild every class with a `slower` verdict; one row per (class, model)."""
    rows = []
    for device_class in report.slower_classes():
        tuned = tune_class(
            _with_more_budget(fleet, device_class, extra_trials),
            device_class,
            TuneOptions(models=tuple(models) or None),
        )
        build = build_artifacts(fleet, classes=[device_class], models=models)
        for outcome in build.outcomes:
            slower = [
                v
                for v in report.verdicts
                if v.device_class == device_class and v.model == outcome.model and v.verdict == SLOWER
            ]
            rows.append(
                RetuneRow(
                    device_class,
                    outcome.model,
                    slower[0].version if slower else None,
                    slower[0].baseline_ms if slower else None,
                    statistics.median(v.median_ms for v in slower) if slower else None,
                    outcome.version,
                    outcome.tuned_ms,
                    outcome.status,
                    tuned.error or outcome.error,
                )
            )
    return rows


def _with_more_budget(fleet: Fleet, device_class: str, extra_trials: int | None) -> Fleet:
    """The fleet with the class's budget raised to what its database holds plus `extra`
    (default: the class's own budget again), and room per task for the extra trials."""
    policy = fleet.tuning
    spent = sum(recorded_trials(fleet, device_class).values())
    tasks = max(1, len(class_task_list(fleet, device_class, select_models(fleet, None))))
    rule, trials = policy.task_budget_rule(device_class)
    extra = extra_trials or (trials * tasks if rule == "per_task" else trials)
    cap = policy.max_trials_per_task
    overrides = {**policy.trials_per_class_override, device_class: spent + extra}
    tuning = replace(
        policy,
        trials_per_class_override=overrides,
        max_trials_per_task=None if cap is None else cap + math.ceil(extra / tasks),
    )
    return fleet.replace(tuning=tuning)
