"""A build on a simulated 2-thread board (one class whose profile says `runtime.threads: 2`, its
target's `num-cores` left out, one board of cpu quota 2.0) is timed at 2 threads: the board's
rpc_server runs with TVM_NUM_THREADS=2, and the manifest and the build's table say 2."""

from __future__ import annotations

import sys

import pytest
import yaml
from support.quick_profiles import quick_profiles
from support.sim_checks import running
from support.sim_network import sim_fleet_yaml

from edgetune.artifact.release import build_artifacts
from edgetune.artifact.store import ArtifactStore
from edgetune.artifact_format.signing import init_keys
from edgetune.compiler.target import build_target
from edgetune.fleet.on_board import RPC_SERVER_PID
from edgetune.fleet.ssh import BoardSession
from edgetune.tune.tuner import SearchSettings, TuneOptions, tune_class

FLEET_BODY = """\
device_classes:
  - {{name: gw-two, profile: {profile}}}
boards:
  - {{name: two-1, address: 10.231.{subnet}.61, device_class: gw-two, python: {python}, workdir: work/boards/two-1,
      simulated: {{cpu_quota: 2.0}}}}
models:
  - {{name: mlp, builtin: mlp, inputs: [{{name: x, shape: [1, 256]}}]}}
tuning: {{trials_per_class: 16, trials_per_iter: 8, max_trials_per_task: 8}}
artifacts: {{dir: artifacts, signing_key: work/keys/signing.key, public_key: work/keys/signing.pub}}
"""


def two_thread_profile(directory):
    """x86-64-v3 (compare samples shortened) for a board of 2 threads, its num-cores left out."""
    path = quick_profiles(directory, ("x86-64-v3",)) / "x86-64-v3.yaml"
    profile = yaml.safe_load(path.read_text())
    profile["runtime"]["threads"] = 2
    del profile["target"]["num-cores"]
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def two_thread_build(sim_slot, tmp_path_factory):
    """The builtin MLP tuned and built on the 2-thread board: (the fleet, the build's report, the
    rpc_server's environment on the board while it ran, one `NAME=value` a line)."""
    from edgetune.inventory import load_fleet

    directory = tmp_path_factory.mktemp("two-thread-fleet")
    path = directory / "fleet.yaml"
    path.write_text(
        sim_fleet_yaml(
            sim_slot,
            "threads",
            FLEET_BODY,
            profile=two_thread_profile(directory / "device_profiles"),
            python=sys.executable,
        )
    )
    fleet = load_fleet(path)
    init_keys(fleet.artifacts.signing_key, fleet.artifacts.public_key, fleet.artifacts.dir)
    with running(fleet):
        tuned = tune_class(fleet, "gw-two", TuneOptions(search=SearchSettings(population_size=64)))
        assert tuned.ok, tuned.error
        report = build_artifacts(fleet)
        (board,) = fleet.boards
        with BoardSession(board) as ssh:
            environ = ssh.run(f"cd {board.workdir} && tr '\\0' '\\n' </proc/$(cat {RPC_SERVER_PID})/environ").stdout
    print(report.table(), file=sys.stderr)
    return fleet, report, environ


def test_the_class_is_tuned_for_its_runtime_threads(two_thread_build):
    fleet, *_ = two_thread_build
    assert build_target(fleet.device_class("gw-two").profile).attrs["num-cores"] == 2


def test_the_boards_rpc_server_runs_tvm_on_two_threads(two_thread_build):
    *_, environ = two_thread_build
    assert "TVM_NUM_THREADS=2" in environ.splitlines()


def test_the_build_says_it_was_timed_at_two_threads(two_thread_build):
    fleet, report, _ = two_thread_build
    (outcome,) = report.outcomes
    assert report.ok and outcome.status == "built", report.failures()
    header, _, row = report.table().splitlines()
    at = header.index("threads")
    assert row[at : at + len("threads")].strip() == "2"
    (board,) = ArtifactStore(fleet.artifacts.dir).latest("mlp", "gw-two").manifest.boards
    assert board.board == "two-1" and board.threads == 2
