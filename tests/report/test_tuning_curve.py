"""The tuning curve from the first trial: before every kernel has a measured schedule, each one
not measured yet counts at its first measured latency, and the chart marks that part."""

from __future__ import annotations

import json

from edgetune.compiler.tasks import KernelTask
from edgetune.tune.database import TrialRecord
from edgetune.tune.report import RunInfo, early_curve, model_curve, write_model_report

TASKS = (KernelTask("dense_a", "a", 1e6, 1.0, (("mlp", 1),)), KernelTask("dense_b", "b", 1e6, 2.0, (("mlp", 2),)))


def test_the_early_curve_starts_at_the_first_trial_and_meets_the_whole_model_curve():
    trials = [TrialRecord("a", 4e-3), TrialRecord("a", None), TrialRecord("a", 3e-3), TrialRecord("b", 2e-3),
              TrialRecord("b", 1e-3), TrialRecord("other", 1e-9)]  # fmt: skip
    early = early_curve(TASKS, "mlp", trials)
    # b is counted at its first measured 2 ms (x2 calls) until it has a record of its own
    assert [(p.trials, round(p.latency_s * 1e3, 6), p.stand_ins) for p in early] == [
        (1, 8.0, 1), (2, 8.0, 1), (3, 7.0, 1)]  # fmt: skip
    assert [(p.trials, round(p.latency_s * 1e3, 6)) for p in model_curve(TASKS, "mlp", trials)] == [(4, 7.0), (5, 5.0)]


def test_a_run_stopped_before_every_kernel_had_a_record_still_draws_its_curve(tmp_path):
    trials = [TrialRecord("a", 4e-3), TrialRecord("a", 3e-3)]  # b was never measured
    run = RunInfo("gw", {"kind": "llvm"}, str(tmp_path), None, 2, 1.0, "stopped", {}, {})
    summary_path = write_model_report(tmp_path / "report", "mlp", TASKS, trials, run)
    summary = json.loads(summary_path.read_text())
    assert summary["curve"] == [] and summary["early_curve"] == [[1, 4e-3, 0], [2, 3e-3, 0]]
    assert (tmp_path / "report" / "curve.png").stat().st_size > 0
