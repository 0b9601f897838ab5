"""A Ray node lost mid-run, and Ctrl-C, on a local cluster of its own: a head without CPUs, a
node of two CPUs where the class run must search (it asks for two) and two build nodes of one
CPU. A lost build node: its builds are retried on the other and the run spends its whole
budget. A lost search node: its class ends with an error, every trial measured so far is kept,
and a re-run on a new node resumes from them, measuring none again. Ctrl-C of `edgetune tune`:
the class run on the cluster stops after the round in flight, keeping its trials, as a local
run does. Marker `ray`: `make test-ray`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.fleet_marker import starts_fleet
from support.fleets import V3, make_fleet, mlp
from support.loopback_boards import Loopback
from support.ray_clusters import connected_cluster
from support.tests_samples import FAKE_PRIVATE_KEY

from edgetune.inventory.schema import RayCompute
from edgetune.tune.database import ClassDatabasePaths, read_trials
from edgetune.tune.tuner import TuneOptions, tune_fleet

pytestmark = pytest.mark.ray

BUDGET = 24  # three rounds of 8: a node lost after the first leaves work to do


@pytest.fixture(scope="module")
def cluster():
    with connected_cluster(head_cpus=0, worker_cpus=(2, 1, 1)) as local:
        yield local


@pytest.fixture
@starts_fleet
def board(tmp_path):
    boards = Loopback(tmp_path)
    try:
        boards.start_board("a-1", "classa")
        boards.wait_registered(1)
        yield boards
    finally:
        boards.close()


def one_class_fleet(tmp_path, board, cluster):
    fleet = make_fleet(tmp_path, board.port, {"classa": V3}, {"classa": 1}, (mlp(),), BUDGET, 8, 24)
    return fleet.replace(compute=RayCompute(address=cluster.address, cpus_per_class=2, build_workers=2))


def wait_for_records(paths: ClassDatabasePaths, count: int, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(read_trials(paths)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} records after {timeout_s} s"
        time.sleep(0.5)


def test_a_lost_build_node_s_builds_go_to_the_other_and_the_budget_is_spent(cluster, board, tmp_path):
    fleet = one_class_fleet(tmp_path, board, cluster)
    paths = ClassDatabasePaths.of(tmp_path, "classa")
    lost = cluster.workers[1]
    killer = threading.Thread(target=lambda: (wait_for_records(paths, 8), cluster.kill_node(lost)))
    killer.start()
    result = tune_fleet(fleet, TuneOptions())
    killer.join()
    (tuned,) = result.classes
    assert tuned.ok, tuned.error
    assert BUDGET <= tuned.trials_run < BUDGET + 8
    trials = read_trials(paths)
    assert len(trials) == tuned.trials_run
    assert sum(t.latency_s is not None for t in trials[8:]) >= 8  # built on the node left, measured


def test_a_lost_search_node_keeps_its_trials_and_a_rerun_resumes_without_repeating_one(cluster, board, tmp_path):
    fleet = one_class_fleet(tmp_path, board, cluster)
    paths = ClassDatabasePaths.of(tmp_path, "classa")
    search_node = cluster.workers[0]  # the only node with the two CPUs a class run asks for
    before_loss: list = []
    killer = threading.Thread(
        target=lambda: (
            wait_for_records(paths, 8),
            before_loss.extend(read_trials(paths)),
            cluster.kill_node(search_node),
        )
    )
    killer.start()
    failed = tune_fleet(fleet, TuneOptions())
    killer.join()
    (lost,) = failed.classes
    assert not lost.ok and lost.error.startswith("classa: its run on the Ray cluster ended"), lost.error
    assert "every trial measured so far is kept: re-run to resume" in lost.error
    kept = read_trials(paths)
    assert kept[: len(before_loss)] == before_loss and len(kept) < BUDGET

    cluster.add_node(2)  # a new machine for the search
    resumed = tune_fleet(fleet, TuneOptions())
    (rerun,) = resumed.classes
    assert rerun.ok, rerun.error
    assert rerun.done_before == len(kept)  # every kept trial counted: none measured again
    assert BUDGET <= len(kept) + rerun.trials_run < BUDGET + 8
    assert read_trials(paths)[: len(kept)] == kept
    assert tune_fleet(fleet, TuneOptions()).trials_run == 0


FLEET_YAML = """\
version: 1
name: ray-stop
workdir: work
trackers:
  - {{name: host, bind_host: 127.0.0.1, public_address: 127.0.0.1, port: {port}, port_end: {port_end}}}
ssh: {{user: root, key: {dir}/id, known_hosts: {dir}/known_hosts}}
device_classes:
  - {{name: classa, profile: {repo}/device_profiles/x86-64-v3.yaml}}
boards:
  - {{name: a-1, address: 127.0.0.1, device_class: classa, python: {python}, workdir: /tmp/a-1}}
models:
  - {{name: mlp, builtin: mlp, inputs: [{{name: x, shape: [1, 256], dtype: float32}}]}}
tuning: {{trials_per_class: {budget}, trials_per_iter: 8, max_trials_per_task: {budget}}}
artifacts: {{dir: artifacts, signing_key: work/k, public_key: work/k.pub}}
compute: {{ray: {{address: "{address}", cpus_per_class: 2, build_workers: 2}}}}
"""
REPO = Path(__file__).resolve().parents[2]
STOPPED_BUDGET = 64  # eight rounds: the stop, asked for after the first, lands well before the last


def test_ctrl_c_stops_the_class_run_on_the_cluster_after_the_round_in_flight(cluster, board, tmp_path):
    (tmp_path / "id").write_text(FAKE_PRIVATE_KEY)
    (tmp_path / "id").chmod(0o600)
    (tmp_path / "known_hosts").write_text("")
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text(
        FLEET_YAML.format(
            port=board.port,
            port_end=board.port + 1,
            dir=tmp_path,
            repo=REPO,
            python=sys.executable,
            budget=STOPPED_BUDGET,
            address=cluster.address,
        )
    )
    paths = ClassDatabasePaths(tmp_path / "work" / "databases" / "classa")
    run = subprocess.Popen(
        [sys.executable, "-m", "edgetune", "tune", "-f", str(fleet_yaml)],
        cwd=REPO,
        start_new_session=True,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for_records(paths, 8)
        os.killpg(run.pid, signal.SIGINT)
        stdout, stderr = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode == 130, stderr[-3000:]
    assert "SIGINT: tuning stops after the rounds in flight" in stderr
    assert "stopped on request" in stdout
    assert "every measured trial is kept; re-run to resume" in stderr
    kept = len(read_trials(paths))
    assert 8 <= kept < STOPPED_BUDGET
