"""The quick Ray tests (default suite), on a local two-node cluster: candidate builds as Ray
tasks (`RayBuilder`): a real kernel built on the worker node and run here from the bytes it
sent back; a build that fails, or outlives its timeout, comes back as a BuilderResult error, as
LocalBuilder's do. And the refusals before anything starts: a cluster that does not answer
(`tune-fleet` exits 4 before the fleet is brought up), a node that cannot reach the tracker."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from support.fleets import V3, make_fleet, mlp
from support.inventory_files import base_fleet, write
from support.loopback_boards import _free_port
from support.ray_clusters import connected_cluster
from tvm import te
from tvm.s_tir import meta_schedule as ms

from edgetune.cli import main
from edgetune.errors import TuneError
from edgetune.inventory.schema import RayCompute
from edgetune.tune.database import ClassDatabasePaths
from edgetune.tune.on_ray import builder as ray_builder
from edgetune.tune.on_ray.builder import RayBuilder
from edgetune.tune.tuner import TuneOptions, tune_fleet

pytestmark = pytest.mark.fleet  # it starts a Ray cluster: not a unit test (`make test-unit` leaves it out)

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 1})


@pytest.fixture(scope="module")
def cluster():
    """A head without CPUs (so nothing is built there) and one worker node of one CPU."""
    with connected_cluster(head_cpus=0, worker_cpus=(1,)) as local:
        yield local


def add_one() -> tvm.IRModule:
    a = te.placeholder((64,), name="A")
    b = te.compute((64,), lambda i: a[i] + 1.0, name="B")
    return tvm.IRModule({"main": te.create_prim_func([a, b])})


def build(cluster, tmp_path, cross_compiler=None, **settings) -> ms.builder.BuilderResult:
    ray_builder.builds_by_node.clear()
    builder = RayBuilder(str(tmp_path), cross_compiler, RayCompute(address=cluster.address, **settings))
    (result,) = builder.build([ms.builder.BuilderInput(add_one(), TARGET)])
    return result


def test_a_candidate_is_built_on_the_worker_node_and_runs_here(cluster, tmp_path):
    result = build(cluster, tmp_path)
    assert result.error_msg is None
    assert result.artifact_path.startswith(str(tmp_path))
    (node,) = ray_builder.builds_by_node
    assert node.split()[1] == cluster.workers[0].node_id[:8]
    add = tvm.runtime.load_module(result.artifact_path)["main"]
    device = tvm.cpu()
    x = np.arange(64, dtype="float32")
    out = tvm.runtime.tensor(np.zeros(64, dtype="float32"), device)
    add(tvm.runtime.tensor(x, device), out)
    np.testing.assert_array_equal(out.numpy(), x + 1)


def test_a_failed_build_comes_back_as_its_error(cluster, tmp_path):
    result = build(cluster, tmp_path, cross_compiler="no-such-cc")
    assert result.artifact_path is None
    assert result.error_msg.startswith("RayBuilder: An exception occurred")
    assert "no-such-cc" in result.error_msg


def test_a_build_past_its_timeout_is_cancelled_and_comes_back_as_a_timeout(cluster, tmp_path):
    ray_builder.builds_by_node.clear()
    builder = RayBuilder(str(tmp_path), None, RayCompute(address=cluster.address), timeout_s=0.001)
    (result,) = builder.build([ms.builder.BuilderInput(add_one(), TARGET)])
    assert result.artifact_path is None
    assert result.error_msg == "RayBuilder: Timeout, killed after 0.001 seconds"


def test_a_cluster_that_does_not_answer_is_refused_before_the_fleet_comes_up(tmp_path, capsys):
    data = base_fleet(tmp_path)
    del data["sim"], data["boards"][0]["simulated"]  # nothing for `sim up` to make
    data["boards"][0]["workdir"] = "/var/lib/edgetune"
    port = _free_port()
    data["compute"] = {"ray": {"address": f"127.0.0.1:{port}", "connect_timeout_s": 5}}
    assert main(["tune-fleet", "-f", str(write(tmp_path, data))]) == 4
    err = capsys.readouterr().err
    assert f"the Ray cluster at 127.0.0.1:{port} (compute.ray.address) does not answer" in err, err
    assert "nothing was started" in err and f"ray start --head --port {port}" in err and "compute: local" in err
    assert not (tmp_path / "work" / "state").exists() and not (tmp_path / "work" / "logs").exists()


def test_nodes_that_cannot_reach_the_tracker_are_refused_before_a_class_starts(cluster, tmp_path):
    port = _free_port()  # no tracker listens there
    fleet = make_fleet(tmp_path, port, {"classa": V3}, {"classa": 1}, (mlp(),), 8)
    fleet = fleet.replace(compute=RayCompute(address=cluster.address))
    with pytest.raises(
        TuneError, match=rf"Ray node \S+ \S+ cannot reach the tracker 127.0.0.1:{port} .*nothing was tuned"
    ):
        tune_fleet(fleet, TuneOptions())
    assert not ClassDatabasePaths.of(tmp_path, "classa").directory.exists()


def test_a_class_run_larger_than_every_node_is_refused(cluster, tmp_path):
    fleet = make_fleet(tmp_path, _free_port(), {"classa": V3}, {"classa": 1}, (mlp(),), 8)
    fleet = fleet.replace(compute=RayCompute(address=cluster.address, cpus_per_class=4))
    with pytest.raises(
        TuneError,
        match="compute.ray.cpus_per_class is 4 CPUs, but the largest node of the Ray "
        "cluster at .* has 1: lower it, or add a larger node",
    ):
        tune_fleet(fleet, TuneOptions())
