"""Integration: build, verify and reuse artifacts from a small tuned database on the simulated
fleet (`built_release`, `sim_fleet`, tests/conftest.py), run an artifact's library on a board, refuse a
tuned build that is no faster than the untuned one, keep unscheduled a kernel measured faster so, and take
an ONNX model the whole way, its class run saying when its estimate reached the faster runtime's time."""

from __future__ import annotations

import json
import re
import shutil
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime
import openvino
import pytest
import yaml
from support.inventory_dump import fleet_to_dict
from support.onnx_samples import conv_model
from tvm_ffi import structural_equal

from edgetune.artifact import release
from edgetune.artifact.measure import compare_on_board
from edgetune.artifact.release import board_speedups, build_artifacts
from edgetune.artifact.store import ArtifactStore
from edgetune.artifact.tuning_inputs import build_records
from edgetune.artifact_format.manifest import (
    EXPECTED_OUTPUT_NAME,
    LIBRARY_NAME,
    REFERENCE_INPUT_NAME,
    Tolerance,
)
from edgetune.artifact_format.reference import read_npz
from edgetune.artifact_format.signing import init_keys, load_public_key
from edgetune.artifact_format.timing_stats import ratio_text
from edgetune.artifact_format.verify import verify_artifact
from edgetune.cli import main
from edgetune.compiler.models import entry_function, load_model
from edgetune.compiler.prepare import apply_database, count_tuned_tasks, extract_tasks, kernel_hash, prepare
from edgetune.compiler.target import build_target
from edgetune.compiler.tasks import class_tasks
from edgetune.fleet.tracker import board_sessions, rpc_endpoint
from edgetune.inventory.schema import ArtifactSettings
from edgetune.inventory.workdir import Workdir
from edgetune.tune.database import (
    ClassDatabasePaths,
    RuntimeTime,
    append_untuned,
    clock_lines,
    read_trials,
    runtime_times,
    snapshot,
    untuned_times,
)
from edgetune.tune.report import NOT_YET, parity_point, read_summary
from edgetune.tune.tuner import SearchSettings, TuneOptions, tune_class

CLASS = "gw-fast"


def _tune_small_database(fleet, device_class: str) -> None:
    """The fleet's small budget (16 trials), measured on the class's simulated boards."""
    result = tune_class(fleet, device_class, TuneOptions(search=SearchSettings(population_size=64)))
    assert result.ok, result.error


@pytest.fixture(scope="module")
def built(built_release, tmp_path_factory):
    """`built_release` (mlp tuned with the fleet's small budget and built for every class) as
    this module's own copy, which its tests build into: CLASS's database and reports as built,
    the store as built and a fleet.yaml for the CLI. gw-slow's database is not copied: here
    that class was never tuned. Returns (fleet, the build's outcome of CLASS, its table)."""
    source, as_built = built_release.fleet, built_release.as_built
    root = tmp_path_factory.mktemp("built-copy")
    for tuned in (Workdir(as_built / "work").database(CLASS), Workdir(as_built / "work").reports(CLASS)):
        shutil.copytree(tuned, root / tuned.relative_to(as_built))
    shutil.copytree(as_built / "artifacts", root / "artifacts")
    fleet = source.replace(
        path=root / "fleet.yaml", workdir=root / "work", artifacts=replace(source.artifacts, dir=root / "artifacts")
    )
    fleet.path.write_text(yaml.safe_dump(fleet_to_dict(fleet)))
    table = built_release.report.table()
    print(table)
    return fleet, [o for o in built_release.report.outcomes if o.device_class == CLASS], table


def test_build_makes_a_verified_artifact_per_model(built):
    fleet, outcomes, table = built
    (outcome,) = outcomes
    assert outcome.status == "built" and outcome.version == 1, outcome.error  # and the report ok: built_release
    assert outcome.tuned_ms > 0 and outcome.untuned_ms > 0
    assert "mlp" in table and "v1" in table
    store = ArtifactStore(fleet.artifacts.dir)
    stored = store.latest("mlp", CLASS)
    public_key = load_public_key(fleet.artifacts.public_key)
    assert verify_artifact(stored.path, public_key) == stored.manifest
    assert verify_artifact(stored.tarball, public_key) == stored.manifest
    manifest = stored.manifest
    assert sorted(b.board for b in manifest.boards) == ["fast-1", "fast-2"]
    assert all(b.firmware and b.max_abs_error < 1e-4 for b in manifest.boards)
    assert manifest.record_hits.tasks_with_record > 0
    files = {f.path for f in manifest.files}
    assert {
        LIBRARY_NAME,
        REFERENCE_INPUT_NAME,
        EXPECTED_OUTPUT_NAME,
        "database/database_tuning_record.json",
        "report/summary.json",
        "report/curve.png",
    } <= files
    assert manifest.tuning.trials > 0 and manifest.tuning.tuning_time_s > 0
    compare = fleet.device_class(CLASS).profile.measurement.compare
    for board in manifest.boards:
        for timing in (board.tuned, board.untuned):
            assert timing.samples == len(timing.samples_ms) == compare.rounds * compare.repeat
            assert timing.min_ms <= timing.median_ms <= timing.max_ms
    assert all(speedup.low > release.GATE_MIN_SPEEDUP for speedup in board_speedups(manifest.boards).values())
    assert outcome.least_speedup > release.GATE_MIN_SPEEDUP
    index = json.loads((Path(fleet.artifacts.dir) / "index.json").read_bytes())
    assert [(e["model"], e["version"]) for e in index["versions"] if e["device_class"] == CLASS] == [("mlp", 1)]


def test_unchanged_rebuild_makes_no_new_version(built, capsys):
    fleet, *_ = built
    assert main(["build", "-f", str(fleet.path), "--class", CLASS]) == 0
    assert "unchanged" in capsys.readouterr().out
    assert ArtifactStore(fleet.artifacts.dir).versions("mlp", CLASS) == [1]


def test_artifact_library_runs_on_a_board_and_matches(built):
    fleet, *_ = built
    stored = ArtifactStore(fleet.artifacts.dir).latest("mlp", CLASS)
    inputs = read_npz(stored.path / REFERENCE_INPUT_NAME)
    expected = read_npz(stored.path / EXPECTED_OUTPUT_NAME)
    model = fleet.models[0]
    boards = fleet.boards_of(CLASS)[:1]
    with board_sessions(rpc_endpoint(fleet, CLASS), boards) as (sessions, failed):
        assert not failed
        run = compare_on_board(
            sessions[boards[0].name],
            {"library": stored.path / LIBRARY_NAME},
            entry_function(load_model(model)),
            [inputs[i.name] for i in model.inputs],
            fleet.device_class(CLASS).profile.measurement,
        )["library"]
    np.testing.assert_allclose(run.outputs["output0"], expected["output0"], rtol=1e-4, atol=1e-5)


def test_output_mismatch_fails_that_artifact_and_keeps_v1(built, monkeypatch):
    fleet, *_ = built
    v1_tarball = ArtifactStore(fleet.artifacts.dir).latest("mlp", CLASS).tarball.read_bytes()
    wrong = release.reference_outputs
    monkeypatch.setattr(release, "reference_outputs", lambda m, i: [o + 1.0 for o in wrong(m, i)])
    monkeypatch.setattr(release, "output_tolerance", lambda spread: Tolerance(rtol=1e-4, atol=2e-5))  # new inputs
    report = build_artifacts(fleet, classes=[CLASS])
    (outcome,) = report.outcomes
    assert outcome.status == "failed" and "output differs from the reference" in outcome.error
    store = ArtifactStore(fleet.artifacts.dir)
    assert store.versions("mlp", CLASS) == [1]
    assert store.latest("mlp", CLASS).tarball.read_bytes() == v1_tarball
    assert not list(store.class_dir("mlp", CLASS).glob(".staging-*"))


def test_class_without_database_says_run_tune(built):
    fleet, *_ = built
    (outcome,) = build_artifacts(fleet, classes=["gw-slow"]).outcomes
    assert outcome.status == "failed" and "run `edgetune tune" in outcome.error


def test_tuned_build_no_faster_than_untuned_is_refused(built, tmp_path, capsys):
    """The class database holds records for another input shape only (mlp tuned at batch 1,
    built at batch 2), so no kernel of the build finds one and the tuned build is the untuned
    one: `edgetune build` refuses it, exits 5 and stores nothing."""
    fleet, *_ = built
    mlp = fleet.models[0]
    batch2 = replace(mlp, inputs=(replace(mlp.inputs[0], shape=(2, *mlp.inputs[0].shape[1:])),))
    artifacts = tmp_path / "artifacts"
    inventory = fleet.replace(models=(batch2,), artifacts=replace(fleet.artifacts, dir=artifacts))
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text(yaml.safe_dump(fleet_to_dict(inventory)))

    assert main(["build", "-f", str(fleet_yaml), "--class", CLASS]) == 5
    out = capsys.readouterr().out
    print(out)
    assert "refused" in out
    assert "mlp on gw-fast: the tuned build is not faster than the untuned one beyond noise" in out
    compare = fleet.device_class(CLASS).profile.measurement.compare
    assert re.search(r"0 of \d+ kernels have a tuning record", out)
    assert f"over {compare.rounds * compare.repeat} samples each" in out
    assert "nothing was published for this pair: tune the class with a larger budget" in out
    store = ArtifactStore(artifacts)
    assert store.versions("mlp", CLASS) == []
    assert not list(store.class_dir("mlp", CLASS).glob(".staging-*"))


def test_onnx_model_is_tuned_built_signed_and_answers_like_onnxruntime(sim_fleet, tmp_path):
    """A model given as an .onnx file (not a built-in) goes the whole way: tuned on the class's
    boards, built, measured, signed and stored; the artifact verifies against the public key,
    its expected output is onnxruntime's answer to its reference input, and every board's run
    of the library matched it. The test fleet's boards run the host's Python, which has
    onnxruntime and OpenVINO: every board timed the file with both in the build's rounds, and
    the build's table shows the tuned build against each and against the faster, named. The class
    run timed the file with both on a board at its start and reports its time to parity: the
    trial and minute at which its estimate first reached the faster runtime's time (trial 0 where
    the untuned model already did), in summary.json and in the build's table."""
    model = conv_model(tmp_path / "conv.onnx")
    artifacts = ArtifactSettings(
        tmp_path / "artifacts", tmp_path / "keys" / "signing.key", tmp_path / "keys" / "signing.pub"
    )
    fleet = sim_fleet.replace(workdir=tmp_path / "work", models=(model,), artifacts=artifacts)
    init_keys(artifacts.signing_key, artifacts.public_key, artifacts.dir)
    _tune_small_database(fleet, CLASS)

    report = build_artifacts(fleet, classes=[CLASS])

    (outcome,) = report.outcomes
    assert report.ok and outcome.status == "built" and outcome.version == 1, report.failures()
    stored = ArtifactStore(artifacts.dir).latest(model.name, CLASS)
    assert verify_artifact(stored.tarball, load_public_key(artifacts.public_key)) == stored.manifest
    reference_input = read_npz(stored.path / REFERENCE_INPUT_NAME)
    session = onnxruntime.InferenceSession(str(model.onnx), providers=["CPUExecutionProvider"])
    (answer,) = session.run(None, {"image": reference_input["image"]})
    np.testing.assert_allclose(read_npz(stored.path / EXPECTED_OUTPUT_NAME)["output0"], answer, rtol=1e-5, atol=1e-6)
    assert sorted(b.board for b in stored.manifest.boards) == ["fast-1", "fast-2"]
    assert all(b.max_abs_error < 1e-4 for b in stored.manifest.boards)

    for board in stored.manifest.boards:
        assert board.onnxruntime.runtime == f"onnxruntime {onnxruntime.__version__}, 1 thread"
        assert board.openvino.runtime == f"openvino {openvino.__version__.split('-')[0]}, 1 thread"  # runtime.threads
        assert board.openvino.timing.samples == board.tuned.samples  # the same rounds, as many samples
        assert board.openvino.max_abs_error < 1e-4
    faster = {
        b.board: min(("onnxruntime", "openvino"), key=lambda name: getattr(b, name).timing.median_ms)
        for b in stored.manifest.boards
    }
    assert outcome.best_runtime == ", ".join(sorted(set(faster.values())))
    assert outcome.vs_best_runtime == pytest.approx(
        statistics.median(
            getattr(b, faster[b.board]).timing.median_ms / b.tuned.median_ms for b in stored.manifest.boards
        ),
        rel=0.05,
    )
    header, row = (line for line in report.table().splitlines() if line.startswith(("model", model.name)))
    assert "vs openvino" in header and "vs best runtime" in header
    assert f"{ratio_text(outcome.vs_openvino)}x" in row and f"{ratio_text(outcome.vs_onnxruntime)}x" in row
    assert f"{ratio_text(outcome.vs_best_runtime)}x {outcome.best_runtime}" in row
    _assert_time_to_parity(fleet, model, report.table())


def _assert_time_to_parity(fleet, model, table: str) -> None:
    summary = read_summary(Workdir(fleet.workdir).report(CLASS, model.name) / "summary.json")
    assert summary.runtimes["onnxruntime"].runtime == f"onnxruntime {onnxruntime.__version__}, 1 thread"
    assert summary.runtimes["openvino"].runtime == f"openvino {openvino.__version__.split('-')[0]}, 1 thread"
    faster = min(summary.runtimes, key=lambda name: summary.runtimes[name].seconds)
    paths = ClassDatabasePaths.of(fleet.workdir, CLASS)
    assert len(runtime_times(paths)) == 1  # measured once, on one board
    clock = clock_lines(paths)
    assert clock[0].start and clock[-1].trials == len(read_trials(paths))  # every record came in a clocked round
    parity = summary.parity
    print(f"time to parity: {summary.time_to_parity}; {summary.runtimes}; estimate {summary.estimated_latency_s}")
    if parity is None:
        assert summary.time_to_parity == NOT_YET
        assert summary.estimated_latency_s is None or summary.estimated_latency_s > summary.runtimes[faster].seconds
    else:
        assert parity.runtime == faster and parity.estimate_s <= parity.runtime_s == summary.runtimes[faster].seconds
        assert 0 <= parity.trial <= summary.trials and 0 < parity.minute * 60 <= summary.tuning_time_s
        if parity.trial == 0:
            assert parity.estimate_s == summary.untuned_latency_s  # the untuned model was already faster
        assert summary.time_to_parity == parity.text()
    header, row = (line for line in table.splitlines() if line.startswith(("model", model.name)))
    assert row[header.index("parity") :].startswith(summary.time_to_parity)
    # the model's moves, which `prepare` schedules itself, were measured once and count in the estimate
    kernels = class_tasks((model,), build_target(fleet.device_class(CLASS).profile))
    untuned = untuned_times(paths)
    assert kernels.scheduled and all(untuned[t.workload_hash] > 0 for t in kernels.scheduled)
    scheduled_s = sum(t.calls_in(model.name) * untuned[t.workload_hash] for t in kernels.scheduled)
    assert summary.scheduled_latency_s == pytest.approx(scheduled_s)
    best = {row.workload_hash: row.best_latency_s for row in summary.tasks}
    if summary.estimated_latency_s is not None:
        searched_s = sum(row.calls * best[row.workload_hash] for row in summary.tasks)
        assert summary.estimated_latency_s == pytest.approx(searched_s + scheduled_s)
    # against a runtime no faster than the untuned model, the same run parities at trial 0, at its start mark
    as_slow = {"onnxruntime": RuntimeTime("as slow as the untuned model", summary.untuned_latency_s)}
    trials = read_trials(paths)
    untuned_first = parity_point(kernels.tasks, model.name, trials, untuned, as_slow, clock, scheduled_s)
    assert (untuned_first.trial, untuned_first.minute) == (0, clock[0].seconds / 60)


def test_a_kernel_measured_faster_untuned_is_built_unscheduled(built, tmp_path):
    """mlp's class run measured each kernel untuned on the boards (untuned.jsonl). Say one had
    measured faster so than its best record: the build leaves that kernel as the untuned
    build has it, applies every other kernel's schedule, and counts it apart."""
    fleet, *_ = built
    target = build_target(fleet.device_class(CLASS).profile)
    prepared = prepare(load_model(fleet.models[0]), target)
    tasks = extract_tasks(prepared, target)
    database = snapshot(ClassDatabasePaths.of(fleet.workdir, CLASS), tmp_path / "database")
    assert set(untuned_times(database)) == {kernel_hash(t.dispatched[0]) for t in tasks}  # measured by the run
    before = build_records(database.directory)
    kept = next(t for t in tasks if kernel_hash(t.dispatched[0]) not in before.kept_untuned)
    append_untuned(database, {kernel_hash(kept.dispatched[0]): 1e-9})
    records = build_records(database.directory)
    assert records.kept_untuned == before.kept_untuned | {kernel_hash(kept.dispatched[0])}
    coverage = count_tuned_tasks(prepared, records.database, target, records.kept_untuned)
    assert kept.task_name in coverage.kept_untuned and not coverage.missing
    assert coverage.tuned + len(coverage.kept_untuned) == coverage.total == len(tasks)
    applied = apply_database(prepared, records.database, target)
    names = {gv.name_hint for gv in applied.get_global_vars()}
    for task in tasks:  # a scheduled kernel differs, or was renamed with its weights pre-packed
        unscheduled = task.task_name in names and structural_equal(applied[task.task_name], prepared[task.task_name])
        assert unscheduled == (task.task_name in coverage.kept_untuned), task.task_name
