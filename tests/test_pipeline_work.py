"""`pipeline.work.find_work`, the check `tune-fleet` makes before starting anything: per class,
trials left to tune; per (model, class), whether `build` would make a new version. On a real
inventory, class database files and artifact store, with no fleet behind them: the tasks are
given (TVM's extraction is `plan_tuning`'s, tested with the plan), the build's inputs are
computed as `build` computes them (the whole job's test, test_tune_fleet.py, checks that its
second run finds what its first built unchanged)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.tests_samples import sample_inputs, sample_manifest

from edgetune.artifact.store import ArtifactStore
from edgetune.artifact_format.signing import init_keys, load_private_key
from edgetune.compiler.tasks import KernelTask
from edgetune.inventory import load_fleet
from edgetune.pipeline.work import ClassWork, PairWork, Work, changed_inputs, find_work
from edgetune.tune.database import ClassDatabasePaths

REPO = Path(__file__).resolve().parents[1]

FLEET_YAML = """\
version: 1
name: work-unit
workdir: work
sim:
  bridge: etune-unit
  host_address: 10.231.99.1/24
trackers:
  - {{name: host, bind_host: 10.231.99.1, public_address: 10.231.99.1, port: 9390, port_end: 9391}}
ssh:
  user: root
  key: work/id_ed25519
  known_hosts: work/known_hosts
device_classes:
  - {{name: gw-fast, profile: {repo}/device_profiles/x86-64-v3.yaml}}
boards:
  - {{name: fast-1, address: 10.231.99.11, device_class: gw-fast, python: /usr/bin/python3, workdir: /tmp/b, simulated: {{cpu_quota: 1.0}}}}
models:
  - name: mlp
    builtin: mlp
    inputs:
      - {{name: x, shape: [1, 256], dtype: float32}}
tuning:
  trials_per_class: {trials}
  trials_per_iter: 8
  max_trials_per_task: 8
artifacts:
  dir: artifacts
  signing_key: work/keys/signing.key
  public_key: work/keys/signing.pub
"""

TASKS = (KernelTask("dense0", "h0", 1e6, 1.0, (("mlp", 1),)), KernelTask("dense1", "h1", 5e5, 1.0, (("mlp", 1),)))


def tasks_of(fleet, device_class, models):
    return TASKS


def write_fleet(directory: Path, trials: int = 16):
    path = directory / "fleet.yaml"
    path.write_text(FLEET_YAML.format(repo=REPO, trials=trials))
    return load_fleet(path)


def record(fleet, workload_hash: str, trials: int) -> None:
    """`trials` measured trials of `workload_hash` appended to gw-fast's database, in MetaSchedule's
    file shapes as far as `read_trials` and the snapshot read them."""
    paths = ClassDatabasePaths.of(fleet.workdir, "gw-fast")
    paths.directory.mkdir(parents=True, exist_ok=True)
    hashes = (
        [json.loads(line)[0] for line in paths.workload.read_text().splitlines()] if paths.workload.exists() else []
    )
    if workload_hash not in hashes:
        with paths.workload.open("a") as out:
            out.write(json.dumps([workload_hash, "{}"]) + "\n")
        hashes.append(workload_hash)
    with paths.tuning_record.open("a") as out:
        for i in range(trials):
            out.write(json.dumps([hashes.index(workload_hash), [[], [1e-3 * (1 + i % 3)], {}, []]]) + "\n")


def publish(fleet, inputs) -> None:
    """A version of (mlp, gw-fast) whose manifest states `inputs`, signed and stored as `build` stores one."""
    pair = (
        init_keys(fleet.artifacts.signing_key, fleet.artifacts.public_key, fleet.artifacts.dir)
        if not fleet.artifacts.signing_key.exists()
        else None
    )
    key = load_private_key(fleet.artifacts.signing_key)
    assert pair is None or pair.private_key == fleet.artifacts.signing_key
    store = ArtifactStore(fleet.artifacts.dir)
    with store.stage("mlp", "gw-fast") as staging:
        (staging.path / "model.so").write_bytes(b"\x7fELF-library")
        (staging.path / "report").mkdir()
        (staging.path / "report" / "summary.json").write_text('{"trials": 16}')
        store.commit(staging, sample_manifest(inputs), key)


@pytest.fixture
def tuned(tmp_path):
    """An inventory whose class has spent its 16 trials, and no artifact yet."""
    fleet = write_fleet(tmp_path)
    record(fleet, "h0", 8)
    record(fleet, "h1", 8)
    return fleet


def test_spent_budget_and_no_version_yet_is_work_to_build(tuned):
    work = find_work(tuned, tasks_of)
    assert work.classes == (ClassWork("gw-fast", 16, 16, 0, False),)
    [pair] = work.pairs
    assert pair.to_do and pair.reason == "to build: no version yet" and pair.inputs is not None
    assert pair.inputs.model == "mlp" and pair.inputs.device_class == "gw-fast"
    assert not work.nothing
    assert "gw-fast: its trial budget is spent (16 trials in the database, budget 16)" in work.lines()


def test_nothing_to_do_when_the_latest_version_has_the_inputs_of_now(tuned):
    publish(tuned, find_work(tuned, tasks_of).pairs[0].inputs)
    work = find_work(tuned, tasks_of)
    assert work.nothing, work.lines()
    assert work.lines() == [
        "gw-fast: its trial budget is spent (16 trials in the database, budget 16)",
        "mlp on gw-fast: unchanged since v1",
    ]
    report = work.unchanged_report()
    [outcome] = report.outcomes
    assert (outcome.model, outcome.device_class, outcome.status, outcome.version) == ("mlp", "gw-fast", "unchanged", 1)
    assert report.ok and "v1" in report.table() and "unchanged" in report.table()


def test_a_record_added_to_the_database_is_a_new_version_to_build(tuned):
    publish(tuned, find_work(tuned, tasks_of).pairs[0].inputs)
    record(tuned, "h1", 1)  # past the budget: nothing left to tune, but the build's database changed
    work = find_work(tuned, tasks_of)
    assert not any(c.to_do for c in work.classes)
    assert [p.reason for p in work.pairs] == ["to build: database changed since v1"]
    assert not work.nothing
    with pytest.raises(ValueError):
        work.unchanged_report()


def test_a_raised_budget_that_every_task_s_cap_holds_back_is_no_work(tuned, tmp_path):
    publish(tuned, find_work(tuned, tasks_of).pairs[0].inputs)
    work = find_work(write_fleet(tmp_path, trials=32), tasks_of)  # each task already has its 8 (max_trials_per_task)
    assert [(c.budget, c.done, c.remaining) for c in work.classes] == [(32, 16, 0)]
    assert work.nothing  # `tune` would measure nothing either: its plan is this one


def test_a_raised_cap_and_budget_leaves_trials_to_tune(tuned, tmp_path):
    publish(tuned, find_work(tuned, tasks_of).pairs[0].inputs)
    path = tmp_path / "fleet.yaml"
    path.write_text(
        path.read_text()
        .replace("trials_per_class: 16", "trials_per_class: 32")
        .replace("max_trials_per_task: 8", "max_trials_per_task: 16")
    )
    work = find_work(load_fleet(path), tasks_of)
    assert [(c.budget, c.done, c.remaining) for c in work.classes] == [(32, 16, 16)]
    assert work.pairs == () and not work.nothing
    assert work.lines() == [
        "gw-fast: 16 trials left to tune (16 of 32 in the database)",
        "the artifacts: built after the tuning, where their inputs changed",
    ]


def test_a_changed_profile_is_a_new_version_to_build(tuned, tmp_path):
    publish(tuned, find_work(tuned, tasks_of).pairs[0].inputs)
    profile = tmp_path / "x86-64-v3.yaml"
    profile.write_text(
        (REPO / "device_profiles" / "x86-64-v3.yaml").read_text().replace("  threads: 1", "  threads: 2")
    )
    path = tmp_path / "fleet.yaml"
    path.write_text(path.read_text().replace(f"{REPO}/device_profiles/x86-64-v3.yaml", str(profile)))
    [pair] = find_work(load_fleet(path), tasks_of).pairs
    assert pair.to_do and pair.reason == "to build: profile changed since v1"


def test_no_database_cannot_be_told_without_building(tmp_path):
    fleet = write_fleet(tmp_path, trials=0)
    work = find_work(fleet, tasks_of)
    [pair] = work.pairs
    assert pair.to_do and pair.reason.startswith(
        "to build (cannot tell without building: class gw-fast has no tuning database"
    )


def test_changed_inputs_names_each_field_that_differs():
    before = sample_inputs()
    assert changed_inputs(before, before) == []
    assert changed_inputs(before, sample_inputs(tvm_version="0.28.0", database_sha256="f" * 64)) == [
        "tvm_version",
        "database",
    ]


def test_nothing_needs_a_pair_and_no_work_anywhere():
    spent, left = ClassWork("a", 16, 16, 0, False), ClassWork("b", 16, 8, 8, False)
    same, new = (
        PairWork("mlp", "a", False, "unchanged since v1"),
        PairWork("mlp", "b", True, "to build: no version yet"),
    )
    assert Work((spent,), (same,)).nothing
    assert not Work((spent,), ()).nothing  # no pair checked: nothing known, the job runs
    assert not Work((spent, left), (same,)).nothing
    assert not Work((spent,), (same, new)).nothing


def test_nothing_to_do_is_a_success_with_no_tuning_result():
    from edgetune.artifact.release import BuildReport
    from edgetune.cli.tune_fleet_cmd import pipeline_exit_code
    from edgetune.pipeline import PipelineResult

    idle = Work((ClassWork("a", 16, 16, 0, False),), (PairWork("mlp", "a", False, "unchanged since v1"),))
    result = PipelineResult(build=BuildReport(()), nothing_to_do=idle)
    assert result.ok and pipeline_exit_code(result) == 0
    assert pipeline_exit_code(PipelineResult(build=BuildReport(()))) == 4  # no tuning and not idle: tuning failed
