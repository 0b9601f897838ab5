"""The ARM path end to end on an emulated aarch64 board (marker `aarch64`, `make test-arm`):
a simulated board whose sshd chroots into a cached arm64 Debian root file system run under
qemu-user. Tune mlp for its class, cross-compile, sign, verify, check the library on the board
itself, install it with the board agent and check it with `regress`. Emulated timings are qemu's, not a real board's; these tests check that ARM
artifacts are really built, loaded and right, and that tuning still pays off there."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.sim_checks import running
from support.sim_network import sim_fleet_yaml

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.aarch64

EM_AARCH64 = 183  # ELF e_machine
BOARD = "arm-1"
CLASS = "arm-emulated"

FLEET_BODY = """\
device_classes:
  - {{name: {klass}, profile: {repo}/device_profiles/aarch64-qemu.yaml}}
boards:
  - {{name: {board}, address: 10.231.{subnet}.31, device_class: {klass}, python: /opt/tvm/bin/python,
      workdir: /root/edgetune, simulated: {{arch: aarch64}}}}
models:
  - {{name: mlp, builtin: mlp, inputs: [{{name: x, shape: [1, 256], dtype: float32}}]}}
tuning: {{trials_per_class: 16, trials_per_iter: 8, max_trials_per_task: 8}}
artifacts: {{dir: artifacts, signing_key: work/keys/signing.key, public_key: work/keys/signing.pub}}
deploy: {{bind: "10.231.{subnet}.1:{deploy_port}", url: "https://10.231.{subnet}.1:{deploy_port}"}}
"""


@pytest.fixture(scope="module")
def arm_fleet(tmp_path_factory, sim_slot):
    from edgetune.inventory import load_fleet

    slot = sim_slot
    directory = tmp_path_factory.mktemp("arm-fleet")
    (directory / "fleet.yaml").write_text(
        sim_fleet_yaml(
            slot,
            "arm",
            FLEET_BODY,
            connect_timeout_s=5,
            command_timeout_s=300,
            repo=REPO,
            klass=CLASS,
            board=BOARD,
        )
    )
    with running(load_fleet(directory / "fleet.yaml"), register_timeout_s=240) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def arm_built(arm_fleet):
    from edgetune.artifact.release import build_artifacts
    from edgetune.artifact_format.signing import init_keys
    from edgetune.tune.tuner import SearchSettings, TuneOptions, tune_class

    fleet = arm_fleet
    init_keys(fleet.artifacts.signing_key, fleet.artifacts.public_key, fleet.artifacts.dir)
    tuned = tune_class(fleet, CLASS, TuneOptions(search=SearchSettings(population_size=64)))
    assert tuned.ok, tuned.error
    report = build_artifacts(fleet)
    print(report.table())
    assert report.ok, report.failures()
    return fleet


def test_the_board_is_an_aarch64_machine_over_ssh(arm_fleet):
    from edgetune.fleet.on_board import read_firmware
    from edgetune.fleet.ssh import BoardSession

    (board,) = arm_fleet.boards
    with BoardSession(board) as session:
        assert session.run("uname -m").stdout.strip() == "aarch64"
        assert (
            session.run(f"{board.python} -c 'import platform; print(platform.machine())'").stdout.strip() == "aarch64"
        )
        assert "emulated by qemu-user" in read_firmware(session, arm_fleet)


def test_arm_artifact_is_an_aarch64_library_verified_on_the_board(arm_built):
    from edgetune.artifact.release import board_speedups
    from edgetune.artifact.store import ArtifactStore
    from edgetune.artifact_format.manifest import LIBRARY_NAME
    from edgetune.artifact_format.signing import load_public_key
    from edgetune.artifact_format.verify import verify_artifact

    stored = ArtifactStore(arm_built.artifacts.dir).latest("mlp", CLASS)
    assert verify_artifact(stored.tarball, load_public_key(arm_built.artifacts.public_key)) == stored.manifest
    header = (stored.path / LIBRARY_NAME).read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == EM_AARCH64
    (board,) = stored.manifest.boards
    assert board.board == BOARD and "emulated by qemu-user" in board.firmware
    assert board.max_abs_error < 1e-4  # the reference output, computed on the host, matched on the ARM board
    assert not board_speedups(stored.manifest.boards)[BOARD].below(1.0)  # the tuned build is not slower
    assert stored.manifest.tuning.trials > 0


def test_the_board_agent_installs_it_on_the_arm_board_and_regress_runs_it_there_without_a_regression(arm_built):
    """regress loads, checks and times the installed release on the board; how fast qemu runs it
    then against the build's timing is not this test's business: any verdict but `slower` will do."""
    from support.artifact_server import RunningServer

    from edgetune.deploy.rollout import plan_rollout, rollout
    from edgetune.regress.check import regress

    server = RunningServer(arm_built)
    try:
        result = rollout(arm_built, plan_rollout(arm_built, "mlp", canary=0))
        assert result.ok, result.records()
    finally:
        server.stop()
    report = regress(arm_built, models=["mlp"])
    (verdict,) = report.verdicts
    assert verdict.board == BOARD and verdict.verdict in ("ok", "faster"), verdict.to_json()


def test_sim_down_removes_the_board_but_keeps_the_cached_root(arm_fleet):
    from edgetune.fleet import fleet_down, sim_down
    from edgetune.fleet.sim import plan_sim

    (sim,) = plan_sim(arm_fleet)
    cached = sorted(arm_fleet.sim.cache.glob("rootfs-aarch64-*.tar"))
    fleet_down(arm_fleet)
    assert sim_down(arm_fleet).ok
    assert not sim.root.exists()
    assert sorted(arm_fleet.sim.cache.glob("rootfs-aarch64-*.tar")) == cached != []
    assert not [line for line in Path("/proc/self/mounts").read_text().splitlines() if str(sim.root) in line]
