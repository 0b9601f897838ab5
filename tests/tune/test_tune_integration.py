"""Tuning for real on two device classes: one built-in model (mlp) and one ONNX model, whose
convolutions are compiled channels-last (`layout: NHWC`).

Runs on a loopback tracker with one rpc_server per class (a second board per class proves
nothing more here; tests/tune/test_faults.py covers boards coming and going). One
module-scoped run serves every assertion.
"""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pytest
import tvm
from support.fleet_marker import starts_fleet
from support.fleets import V2, V3, make_fleet
from support.loopback_boards import Loopback
from support.onnx_samples import conv_model
from tvm import relax

from edgetune.artifact.measure import interleave
from edgetune.compiler.models import (
    entry_function,
    load_model,
    reference_inputs,
    reference_outputs,
)
from edgetune.compiler.prepare import (
    apply_database_and_build,
    build_untuned,
    count_tuned_tasks,
    prepare,
)
from edgetune.compiler.target import build_target
from edgetune.compiler.tasks import class_tasks
from edgetune.inventory.schema import Model, ModelInput, TuningPolicy
from edgetune.tune.database import ClassDatabasePaths, open_database, read_trials, untuned_times
from edgetune.tune.native_log import NATIVE_LOG
from edgetune.tune.tuner import TuneOptions, tune_fleet

TRIALS_PER_CLASS = 48


@pytest.fixture(scope="module")
@starts_fleet
def tuned(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("tune")
    models = (
        Model("mlp", (ModelInput("x", (1, 256)),), builtin="mlp"),
        dataclasses.replace(conv_model(workdir / "conv.onnx"), layout="NHWC"),
    )
    policy = TuningPolicy(TRIALS_PER_CLASS, {}, 8, 16, 600, {})
    loopback = Loopback(workdir)
    try:
        for name in ("a-1", "b-1"):
            loopback.start_board(name, "class" + name[0])
        loopback.wait_registered(2)
        fleet = make_fleet(
            workdir, loopback.port, {"classa": V3, "classb": V2}, {"classa": 1, "classb": 1}, models, TRIALS_PER_CLASS
        )
        fleet = fleet.replace(workdir=workdir, models=models, tuning=policy)
        started = time.monotonic()
        first = tune_fleet(fleet, TuneOptions(borrow=False))
        first_s = time.monotonic() - started
        second = tune_fleet(fleet, TuneOptions(borrow=False))
        yield fleet, first, second, first_s
    finally:
        loopback.close()


def test_every_class_spends_its_budget_on_its_own_boards(tuned):
    fleet, first, _, first_s = tuned
    assert first.ok, [c.error for c in first.classes]
    print(f"first run: {first.trials_run} trials in {first_s:.0f} s")
    for result in first.classes:
        # MetaSchedule stops after the batch that reaches the budget (a batch may be short).
        assert TRIALS_PER_CLASS <= result.trials_run < TRIALS_PER_CLASS + fleet.tuning.trials_per_iter
        paths = ClassDatabasePaths.of(fleet.workdir, result.device_class)
        trials = read_trials(paths)
        assert len(trials) == result.trials_run
        assert sum(t.latency_s is not None for t in trials) >= TRIALS_PER_CLASS // 2
        assert len(open_database(paths)) == result.trials_run  # TVM loads it
        target = json.loads(next(iter(paths.tuning_record.open())))[1][2]
        assert target["mcpu"] == fleet.device_class(result.device_class).profile.target["mcpu"]


def test_rerun_spends_zero_trials(tuned):
    _, _, second, _ = tuned
    assert second.ok and second.trials_run == 0


def test_reports_are_written(tuned):
    fleet, first, _, _ = tuned
    for result in first.classes:
        for path in result.summaries:
            summary = json.loads(open(path).read())
            assert summary["trials"] > 0 and summary["tasks_tuned"] == summary["tasks_total"]
            assert summary["curve"] and summary["estimated_latency_s"] > 0
            assert (fleet.workdir / "reports" / result.device_class / summary["model"] / "curve.png").exists()


def test_each_kernel_was_measured_untuned_once_and_the_curve_starts_there(tuned):
    """Before its first round a class run measures each kernel built without a schedule, and
    each kernel `prepare` scheduled itself (the conv net's moves) as it is; the re-run measured
    none again; tuned, each model beats its untuned estimate (mlp's first layer by far: the small
    conv net's kernels are within a few tenths of a microsecond either way), and the report's
    curve starts at trial 0 with the untuned model."""
    fleet, first, _, _ = tuned
    for result in first.classes:
        paths = ClassDatabasePaths.of(fleet.workdir, result.device_class)
        untuned = untuned_times(paths)
        kernels = class_tasks(fleet.models, build_target(fleet.device_class(result.device_class).profile))
        searched = {t.workload_hash for t in read_trials(paths)}
        assert searched == {t.workload_hash for t in kernels.tasks} and kernels.scheduled
        assert set(untuned) == searched | set(kernels.scheduled_hashes)  # every kernel of the class
        assert all(seconds is not None and seconds > 0 for seconds in untuned.values()), untuned
        assert len(paths.untuned.read_text().splitlines()) == len(untuned)  # once: the second run added none
        for path in result.summaries:
            summary = json.loads(open(path).read())
            kernels = len(summary["tasks"])
            assert summary["early_curve"][0] == [0, summary["untuned_latency_s"], kernels, kernels]
            assert summary["estimated_latency_s"] < summary["untuned_latency_s"]
            if summary["model"] == "mlp":  # its first layer: ~150 us untuned, a few us tuned
                heaviest = max(summary["tasks"], key=lambda row: row["flops"])
                assert heaviest["best_latency_s"] < untuned[heaviest["workload_hash"]] / 2, heaviest


def test_tuned_build_is_faster_than_untuned(tuned):
    fleet, first, _, _ = tuned
    device_class = first.classes[0].device_class
    target = build_target(fleet.device_class(device_class).profile)
    database = open_database(ClassDatabasePaths.of(fleet.workdir, device_class))
    model = fleet.models[0]
    prepared = prepare(load_model(model), target)
    assert count_tuned_tasks(prepared, database, target).complete
    x = tvm.runtime.tensor(reference_inputs(model)["x"])
    timers, outputs = {}, {}
    for name, executable in (
        ("untuned", build_untuned(prepared, target)),
        ("tuned", apply_database_and_build(prepared, database, target)),
    ):
        vm = relax.VirtualMachine(executable, tvm.cpu())
        outputs[name] = vm[entry_function(prepared)](x).numpy()
        timer = vm.time_evaluator(entry_function(prepared), tvm.cpu(), number=20, repeat=3)
        timers[name] = lambda timer=timer: timer(x).results
    np.testing.assert_allclose(outputs["tuned"], outputs["untuned"], rtol=1e-4, atol=1e-5)
    samples = interleave(timers, rounds=10)  # another test's load falls on both alike
    untuned, tuned_ms = (float(np.median(samples[name])) * 1e3 for name in ("untuned", "tuned"))
    print(f"{device_class} mlp: untuned {untuned:.3f} ms, tuned {tuned_ms:.3f} ms (medians of 30 interleaved samples)")
    assert tuned_ms < 0.7 * untuned


def test_tuned_nhwc_onnx_model_answers_what_onnxruntime_answers(tuned):
    fleet, first, _, _ = tuned
    model = fleet.models[1]
    assert model.layout == "NHWC"
    for result in first.classes:
        target = build_target(fleet.device_class(result.device_class).profile)
        database = open_database(ClassDatabasePaths.of(fleet.workdir, result.device_class))
        prepared = prepare(load_model(model), target)
        assert count_tuned_tasks(prepared, database, target).complete
        vm = relax.VirtualMachine(apply_database_and_build(prepared, database, target), tvm.cpu())
        inputs = reference_inputs(model)
        got = vm[entry_function(prepared)](tvm.runtime.tensor(inputs["image"])).numpy()
        np.testing.assert_allclose(got, reference_outputs(model, inputs)[0], rtol=1e-4, atol=1e-5)


def test_each_class_run_kept_tvm_and_onnxruntime_warnings_in_its_log(tuned):
    """The class processes write TVM's and onnxruntime's warnings to logs/native.log, not the
    console (edgetune.tune.native_log; tests/tune/test_native_log.py makes them for real)."""
    fleet, first, _, _ = tuned
    for result in first.classes:
        assert (ClassDatabasePaths.of(fleet.workdir, result.device_class).logs / NATIVE_LOG).is_file()
