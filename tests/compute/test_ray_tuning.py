"""Tuning through Ray on a local cluster (a head without CPUs and two worker nodes of three
CPUs): two classes, each a class run of two CPUs (so no node holds both), their candidates built
as Ray tasks on the workers and measured on loopback boards through the tracker; a re-run spends
nothing. Marker `ray` (minutes): `make test-ray`."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from support.fleet_marker import starts_fleet
from support.fleets import V2, V3, make_fleet, mlp
from support.loopback_boards import Loopback
from support.ray_clusters import connected_cluster

from edgetune.inventory.schema import RayCompute
from edgetune.tune.database import ClassDatabasePaths, read_trials
from edgetune.tune.tuner import TuneOptions, tune_fleet

pytestmark = pytest.mark.ray

TRIALS = 16  # two rounds of 8 per class


@pytest.fixture(scope="module")
def cluster():
    with connected_cluster(head_cpus=0, worker_cpus=(3, 3)) as local:
        yield local


@pytest.fixture(scope="module")
@starts_fleet
def tuned(cluster, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("ray-tune")
    boards = Loopback(workdir)
    try:
        for name in ("a-1", "b-1"):
            boards.start_board(name, "class" + name[0])
        boards.wait_registered(2)
        fleet = make_fleet(
            workdir, boards.port, {"classa": V3, "classb": V2}, {"classa": 1, "classb": 1}, (mlp(),), TRIALS, 8, 16
        )
        fleet = fleet.replace(compute=RayCompute(address=cluster.address, cpus_per_class=2, build_workers=2))
        with placement_lines() as lines:  # the first run's
            first = tune_fleet(fleet, TuneOptions(borrow=False))
        second = tune_fleet(fleet, TuneOptions(borrow=False))
        yield fleet, first, second, lines
    finally:
        boards.close()


@contextmanager
def placement_lines() -> Iterator[list[str]]:
    """The lines the Ray cluster module logs meanwhile (where each class searched and built)."""
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("edgetune.tune.on_ray.cluster")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def placements(lines: list[str]) -> dict[str, tuple[str, dict[str, int]]]:
    """class -> (search node, builds per node) from the run's placement lines."""
    found = {}
    for line in lines:
        match = re.fullmatch(r"\[(\S+)\] searched on Ray node (\S+ \S+); candidates built per node: (.*)", line)
        if match:
            builds = dict(re.findall(r"(\S+ \S+): (\d+)", match.group(3)))
            found[match.group(1)] = (match.group(2), {node: int(n) for node, n in builds.items()})
    return found


def test_both_classes_spend_their_budget_measured_on_their_boards(tuned):
    fleet, first, _, _ = tuned
    assert first.ok, [c.error for c in first.classes]
    for result in first.classes:
        assert TRIALS <= result.trials_run < TRIALS + 8
        trials = read_trials(ClassDatabasePaths.of(fleet.workdir, result.device_class))
        assert len(trials) == result.trials_run
        assert sum(t.latency_s is not None for t in trials) >= TRIALS // 2  # built on the cluster, run on a board


def test_the_two_classes_search_on_two_nodes_and_build_on_the_workers(tuned, cluster):
    _, first, _, lines = tuned
    placed = placements(lines)
    assert set(placed) == {"classa", "classb"}, lines
    search_nodes = {node for node, _ in placed.values()}
    assert len(search_nodes) == 2  # a node of 3 CPUs holds one class run of 2
    workers = {w.node_id[:8] for w in cluster.workers}
    for (_, builds), result in zip((placed["classa"], placed["classb"]), first.classes):
        assert {node.split()[1] for node in builds} <= workers
        assert sum(builds.values()) >= result.trials_run  # every candidate measured was built on the cluster


def test_a_rerun_resumes_with_nothing_left_to_do(tuned):
    _, first, second, _ = tuned
    assert second.ok
    assert second.trials_run == 0
    assert [c.done_before for c in second.classes] == [c.trials_run for c in first.classes]


@starts_fleet
def test_a_class_searched_in_two_shards_keeps_every_trial_in_its_database_and_resumes(cluster, tmp_path):
    """One class, `shards_per_class: 2`: its two searches run as Ray tasks of one CPU each (the
    workers have three: a class run, a shard and a build fit one), every record of both lands in
    the class database (none twice), the class's cost model is retrained on them, and a re-run
    has nothing left to do."""
    boards = Loopback(tmp_path)
    try:
        boards.start_board("c-1", "classc")
        boards.wait_registered(1)
        fleet = make_fleet(tmp_path, boards.port, {"classc": V3}, {"classc": 1}, (mlp(),), TRIALS, 8, 16)
        fleet = fleet.replace(
            compute=RayCompute(address=cluster.address, cpus_per_class=1, build_workers=2, shards_per_class=2)
        )
        paths = ClassDatabasePaths.of(fleet.workdir, "classc")
        first = tune_fleet(fleet, TuneOptions(borrow=False))
        trained = paths.cost_model.stat().st_mtime
        second = tune_fleet(fleet, TuneOptions(borrow=False))
    finally:
        boards.close()
    (result,) = first.classes
    assert first.ok, result.error
    trials = read_trials(paths)
    assert TRIALS <= result.trials_run == len(trials) < TRIALS + 8  # every shard's trial in the database, once
    assert len(result.shards) == 2 and all(s.node and s.tasks and s.trials for s in result.shards), result.shards
    assert sum(s.trials for s in result.shards) == result.trials_run
    assert len({t.workload_hash for t in trials}) == sum(s.tasks for s in result.shards)  # each shard its own tasks
    assert {s.node.split()[1] for s in result.shards} <= {w.node_id[:8] for w in cluster.workers}
    assert sum(t.latency_s is not None for t in trials) >= TRIALS // 2
    assert second.ok and second.trials_run == 0 and second.classes[0].done_before == result.trials_run
    assert paths.cost_model.stat().st_mtime == trained  # nothing searched again, nothing retrained
