"""The tuning curve from the untuned model: before every kernel has a measured schedule, each one
not measured yet counts at its untuned time (else at its first measured latency), and the chart
marks that part."""

from __future__ import annotations

import json

from edgetune.compiler.tasks import KernelTask
from edgetune.tune.database import TrialRecord
from edgetune.tune.report import RunInfo, early_curve, model_curve, untuned_latency, write_model_report

TASKS = (KernelTask("dense_a", "a", 1e6, 1.0, (("mlp", 1),)), KernelTask("dense_b", "b", 1e6, 2.0, (("mlp", 2),)))


def test_the_early_curve_starts_at_the_first_trial_and_meets_the_whole_model_curve():
    trials = [
        TrialRecord("a", 4e-3),
        TrialRecord("a", None),
        TrialRecord("a", 3e-3),
        TrialRecord("b", 2e-3),
        TrialRecord("b", 1e-3),
        TrialRecord("other", 1e-9),
    ]
    early = early_curve(TASKS, "mlp", trials)
    # b is counted at its first measured 2 ms (x2 calls) until it has a record of its own
    assert [(p.trials, round(p.latency_s * 1e3, 6), p.stand_ins) for p in early] == [
        (1, 8.0, 1),
        (2, 8.0, 1),
        (3, 7.0, 1),
    ]
    assert [(p.trials, round(p.latency_s * 1e3, 6)) for p in model_curve(TASKS, "mlp", trials)] == [(4, 7.0), (5, 5.0)]


def test_a_run_stopped_before_every_kernel_had_a_record_still_draws_its_curve(tmp_path):
    trials = [TrialRecord("a", 4e-3), TrialRecord("a", 3e-3)]  # b was never measured
    run = RunInfo("gw", {"kind": "llvm"}, str(tmp_path), None, 2, 1.0, "stopped", {}, {})
    summary_path = write_model_report(tmp_path / "report", "mlp", TASKS, trials, run)
    summary = json.loads(summary_path.read_text())
    assert summary["curve"] == [] and summary["early_curve"] == [[1, 4e-3, 0, 0], [2, 3e-3, 0, 0]]
    assert summary["untuned_latency_s"] is None
    assert (tmp_path / "report" / "curve.png").stat().st_size > 0


def test_with_untuned_times_the_curve_starts_at_the_untuned_model_at_trial_0():
    trials = [TrialRecord("a", 4e-3), TrialRecord("a", 3e-3), TrialRecord("b", 2e-3), TrialRecord("b", 1e-3)]
    early = early_curve(TASKS, "mlp", trials, {"a": 9e-3, "b": 5e-3, "other": 1.0})
    # untuned: a 9 ms + b 5 ms x 2 calls = 19 ms; b stays at its untuned 5 ms until measured
    assert [(p.trials, round(p.latency_s * 1e3, 6), p.stand_ins, p.untuned) for p in early] == [
        (0, 19.0, 2, 2),
        (1, 14.0, 1, 1),
        (2, 13.0, 1, 1),
    ]
    assert round(untuned_latency(TASKS, "mlp", {"a": 9e-3, "b": 5e-3}) * 1e3, 6) == 19.0


def test_a_kernel_whose_untuned_measurement_failed_counts_at_its_first_measured_time(tmp_path):
    trials = [TrialRecord("a", 4e-3), TrialRecord("b", 2e-3)]
    untuned = {"a": 9e-3, "b": None}
    early = early_curve(TASKS, "mlp", trials, untuned)
    assert [(p.trials, round(p.latency_s * 1e3, 6), p.stand_ins, p.untuned) for p in early] == [(1, 8.0, 1, 0)]
    run = RunInfo("gw", {"kind": "llvm"}, str(tmp_path), None, 2, 1.0, None, {}, {})
    summary = json.loads(write_model_report(tmp_path / "report", "mlp", TASKS, trials, run, untuned).read_text())
    assert summary["untuned_latency_s"] is None and summary["early_curve"] == [[1, 8e-3, 1, 0]]
