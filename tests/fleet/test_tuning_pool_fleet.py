"""A class's tuning pool on a simulated fleet of its own (`sim_slot`): class `gw` of three boards,
`tuning_pool: [role=lab]` naming two of them (lab-1, lab-2), field-1 a target only. `fleet up`
serves the pool alone (field-1's rpc_server, started while every board tuned, is stopped);
`plan --json`, `fleet status` and the dashboard say which board is which; a tune and a build of
the built-in mlp measure on the pool boards only, and the build's gate holds over them."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
from support.quick_profiles import quick_profiles
from support.sim_checks import running
from support.sim_network import sim_fleet_yaml

from edgetune.artifact.release import build_artifacts
from edgetune.artifact.store import ArtifactStore
from edgetune.artifact_format.signing import init_keys
from edgetune.cli import main
from edgetune.fleet.on_board import server_running
from edgetune.fleet.ssh import BoardSession
from edgetune.fleet.ssh_route import rpc_address
from edgetune.fleet.state import load_fleet_state
from edgetune.fleet.tracker import query_tracker
from edgetune.inventory.workdir import Workdir
from edgetune.tune.database import ClassDatabasePaths, throughput
from edgetune.tune.tuner import SearchSettings, TuneOptions, tune_class

CLASS, POOL, TARGET = "gw", ("lab-1", "lab-2"), "field-1"

FLEET_BODY = """\
device_classes:
  - {{name: {klass}, profile: {profiles}/x86-64-v3.yaml, tuning_pool: [role=lab]}}
boards:
  - {{name: field-1, address: 10.231.{subnet}.41, device_class: {klass}, python: {python}, workdir: work/boards/field-1,
      simulated: {{cpu_quota: 1.0}}, labels: {{role: field}}}}
  - {{name: lab-1, address: 10.231.{subnet}.42, device_class: {klass}, python: {python}, workdir: work/boards/lab-1,
      simulated: {{cpu_quota: 1.0}}, labels: {{role: lab}}}}
  - {{name: lab-2, address: 10.231.{subnet}.43, device_class: {klass}, python: {python}, workdir: work/boards/lab-2,
      simulated: {{cpu_quota: 1.0}}, labels: {{role: lab}}}}
models:
  - {{name: mlp, builtin: mlp, inputs: [{{name: x, shape: [1, 256], dtype: float32}}]}}
tuning: {{trials_per_class: 16, trials_per_iter: 8, max_trials_per_task: 8}}
artifacts: {{dir: artifacts, signing_key: work/keys/signing.key, public_key: work/keys/signing.pub}}
"""


@pytest.fixture(scope="module")
def pooled(sim_slot, tmp_path_factory):
    """The fleet with its pool, up: first brought up with every board tuning (as before the pool
    was named), then `edgetune fleet up` on the fleet.yaml that names the pool. Yields (the
    fleet, field-1's rpc_server record of the first `fleet up`, the second's exit status)."""
    from edgetune.inventory import load_fleet

    directory = tmp_path_factory.mktemp("pool-fleet")
    path = directory / "fleet.yaml"
    path.write_text(
        sim_fleet_yaml(
            sim_slot,
            "pool",
            FLEET_BODY,
            klass=CLASS,
            profiles=quick_profiles(directory / "device_profiles", ("x86-64-v3",)),
            python=sys.executable,
        )
    )
    fleet = load_fleet(path)
    everyone = fleet.replace(
        device_classes=tuple(dataclasses.replace(c, tuning_pool=None) for c in fleet.device_classes)
    )
    with running(everyone):
        before = load_fleet_state(fleet).boards[TARGET]
        yield fleet, before, main(["fleet", "up", "-f", str(path)])


def test_fleet_up_serves_the_pool_and_stops_the_target_s_rpc_server(pooled):
    fleet, before, exit_status = pooled
    assert exit_status == 0
    state = load_fleet_state(fleet)
    assert sorted(state.boards) == list(POOL)
    summary = query_tracker(state.trackers["host"])
    assert summary.servers[CLASS] == tuple(sorted(rpc_address(fleet.board(name)) for name in POOL))
    with BoardSession(fleet.board(TARGET)) as session:
        assert not server_running(session, before.pid)


def test_plan_status_and_dashboard_say_pool_or_target(pooled, capsys, tmp_path):
    fleet, _, _ = pooled
    capsys.readouterr()
    assert main(["plan", "--json", "-f", str(fleet.path)]) == 0
    (planned,) = json.loads(capsys.readouterr().out)["classes"]
    assert planned["boards"] == [TARGET, *POOL] and planned["tuning_pool"] == list(POOL)
    assert main(["plan", "-f", str(fleet.path)]) == 0
    assert f"{TARGET} (target), lab-1, lab-2" in capsys.readouterr().out

    assert main(["fleet", "status", "--json", "-f", str(fleet.path)]) == 0  # a target needs no rpc_server
    roles = {b["name"]: (b["role"], b["reachable"], b["registered"]) for b in json.loads(capsys.readouterr().out)}
    assert roles == {TARGET: ("target", True, False), "lab-1": ("pool", True, True), "lab-2": ("pool", True, True)}
    assert main(["fleet", "status", "-f", str(fleet.path)]) == 0
    rows = {line.split()[0]: line.split()[1:6] for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert rows[TARGET][:2] == [CLASS, "target"] and rows[TARGET][3:] == ["yes", "-"]
    assert rows["lab-1"][:2] == [CLASS, "pool"] and rows["lab-1"][3:] == ["yes", "yes"]

    assert main(["report", "-o", str(tmp_path), "-f", str(fleet.path)]) == 0
    page = (tmp_path / "dashboard.html").read_text()
    assert f"{CLASS} (3 boards, 2 in its tuning pool)" in page
    assert f'<tr data-board="{TARGET}"><td>{TARGET}</td><td>{CLASS}</td><td>target</td>' in page
    assert '<tr data-board="lab-1"><td>lab-1</td><td>gw</td><td>pool</td>' in page


def test_tune_and_build_measure_on_the_pool_alone(pooled):
    fleet, _, _ = pooled
    tuned = tune_class(fleet, CLASS, TuneOptions(search=SearchSettings(population_size=64)))
    assert tuned.ok and tuned.trials_run > 0, tuned.error
    assert throughput(ClassDatabasePaths.of(fleet.workdir, CLASS)).boards == len(POOL)
    summary = json.loads((Workdir(fleet.workdir).reports(CLASS) / "mlp" / "summary.json").read_text())
    assert sorted(summary["firmware"]) == list(POOL)  # the boards the run measured on

    init_keys(fleet.artifacts.signing_key, fleet.artifacts.public_key, fleet.artifacts.dir)
    report = build_artifacts(fleet)
    assert report.ok, report.failures()  # the gate: faster beyond noise on every pool board
    (outcome,) = report.outcomes
    assert outcome.status == "built"
    manifest = ArtifactStore(fleet.artifacts.dir).get("mlp", CLASS, outcome.version).manifest
    assert [b.board for b in manifest.boards] == list(POOL)
