"""A board edgetune did not make, through the whole flow: fleet up, tune, build, rollout, regress
and rollback.

The field board is a network namespace with its own OpenSSH server (tests/support/netns_hosts.py) whose
Python is a board image (tests/support/board_image.py: the TVM runtime, numpy, cryptography, psutil,
cloudpickle; nothing of edgetune, not the host's venv). fleet.yaml declares it as an ordinary
board (address, python, workdir), not `simulated:`, and its host key is trusted with `fleet
trust`, as an operator would. The flow's steps are module fixtures, each on the one before
(`field` -> `up` -> `built` -> `served`): a test asks for the step it checks and gets every step
before it, whatever ran earlier; tests that change the board put back what they changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shlex
from pathlib import Path

import numpy as np
import paramiko
import pytest
from support.artifact_server import RunningServer
from support.board_image import board_image, image_without
from support.deploy_support import republish
from support.netns_hosts import add_bridge, keygen, remove_bridge, start_host, stop_host
from support.quick_profiles import quick_profiles
from support.regress_verdicts import assert_timed

from edgetune.fleet.agent_bundle import agent_argv, agent_bundle, agent_root, bundle_path
from edgetune.fleet.ssh import BoardSession, fingerprint

REPO = Path(__file__).resolve().parent.parent
MODEL = "mlp"

FLEET_YAML = """\
version: 1
name: field-t{slot}
workdir: work
trackers:
  - {{name: host, bind_host: {net}.1, public_address: {net}.1, port: {port}, port_end: {port_end}}}
ssh:
  user: root
  key: keys/operator_ed25519
  known_hosts: work/known_hosts
  connect_timeout_s: 5
  command_timeout_s: 120
device_classes:
  - {{name: field-x86, profile: {profiles}/x86-64-v3.yaml}}
boards:
  - name: field-1
    address: {net}.31
    device_class: field-x86
    python: {python}
    workdir: {board_dir}/var/lib/edgetune
models:
  - name: mlp
    builtin: mlp
    inputs:
      - {{name: x, shape: [1, 256], dtype: float32}}
tuning:
  trials_per_class: 16
  trials_per_iter: 8
  max_trials_per_task: 8
artifacts:
  dir: artifacts
  signing_key: work/keys/signing.key
  public_key: work/keys/signing.pub
deploy:
  bind: {net}.1:{deploy_port}
  url: https://{net}.1:{deploy_port}
"""


@dataclasses.dataclass
class Field:
    fleet: object
    host: object  # NetnsHost
    image: Path


@pytest.fixture(scope="module")
def field(sim_slot, tmp_path_factory):
    """A fleet of one field board, its host key trusted with `fleet trust`, nothing started."""
    from edgetune.cli import main
    from edgetune.inventory import load_fleet

    image = board_image()
    root = tmp_path_factory.mktemp("field")
    net, bridge = f"10.231.{9 + sim_slot}", f"etune-t{sim_slot}"
    (root / "keys").mkdir()
    keygen(root / "keys" / "operator_ed25519", "field-operator")
    add_bridge(bridge, f"{net}.1", 24)
    host = None
    try:
        host = start_host(
            "field-1",
            f"edgetune-field-t{sim_slot}",
            f"{net}.31",
            24,
            root / "board-sshd",
            (root / "keys" / "operator_ed25519.pub").read_text(),
            bridge=bridge,
        )
        (root / "fleet.yaml").write_text(
            FLEET_YAML.format(
                slot=sim_slot,
                net=net,
                port=9295 + 10 * sim_slot,
                port_end=9299 + 10 * sim_slot,
                profiles=quick_profiles(root / "device_profiles", ("x86-64-v3",)),
                python=image / "bin" / "python",
                board_dir=root / "board-fs",
                deploy_port=8490 + sim_slot,
            )
        )
        made = fingerprint(paramiko.PKey.from_path(host.host_key))  # as read off the board's console
        assert main(["fleet", "trust", "field-1", "--fingerprint", made, "-f", str(root / "fleet.yaml")]) == 0
        yield Field(load_fleet(root / "fleet.yaml"), host, image)
    finally:
        from edgetune.fleet import fleet_down

        if host is not None:
            fleet_down(load_fleet(root / "fleet.yaml"))
            stop_host(host)
        remove_bridge(bridge)


def on_board(fleet, command: str, check: bool = True):
    with BoardSession(fleet.board("field-1")) as session:
        return session.run(command, check=check)


def test_the_field_board_has_nothing_of_edgetune(field):
    python = shlex.quote(str(field.image / "bin" / "python"))
    found = on_board(field.fleet, f"cd / && {python} -c 'import edgetune'", check=False)
    assert found.exit_status != 0 and "No module named 'edgetune'" in found.stderr
    prefix = on_board(field.fleet, f"{python} -c 'import sys; print(sys.prefix)'").stdout.strip()
    assert Path(prefix) == field.image and not Path(prefix).samefile(REPO / ".venv")


def host_cpu() -> dict[str, str]:
    """This machine's /proc/cpuinfo, first processor: the field board's CPU (a namespace of it)."""
    first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    return {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in first.splitlines())}


def test_the_preflight_probe_reads_the_boards_cpu_and_names_the_profile_of_a_zen_4(field):
    from edgetune.fleet import on_board as probes

    with BoardSession(field.fleet.board("field-1")) as session:
        facts = probes.probe(session, field.fleet, preflight=True)
    cpu = host_cpu()
    assert (facts.cpu_vendor, facts.cpu_family, set(facts.cpu_flags)) == (
        cpu["vendor_id"],
        cpu["cpu family"],
        set(cpu["flags"].split()),
    )
    advice = probes.datapath_advice(field.fleet.board("field-1"), {"kind": "llvm", "mcpu": "icelake-server"}, facts)
    zen4 = cpu["vendor_id"] == "AuthenticAMD" and cpu["cpu family"] == "25" and "avx512f" in cpu["flags"].split()
    assert (advice is not None) == zen4, advice
    if zen4:
        assert "AMD Zen 4" in advice and "mcpu znver4 (device_profiles/x86-zen4.yaml)" in advice


def test_preflight_refuses_a_board_missing_numpy_with_the_install_command(field, tmp_path):
    from edgetune.fleet import fleet_up
    from edgetune.fleet.on_board import install_command

    bare = image_without(field.image, tmp_path / "bare", "numpy")
    board = dataclasses.replace(field.fleet.board("field-1"), python=str(bare))
    result = fleet_up(field.fleet.replace(boards=(board,)), register_timeout_s=5)
    assert not result.succeeded
    reason = result.failed["field-1"]
    assert f"{bare} lacks numpy" in reason and reason.endswith(install_command(str(bare), ["numpy"])), reason


@pytest.fixture(scope="module")
def up(field):
    """`fleet up` of the field board: its result."""
    from edgetune.fleet import fleet_up

    return fleet_up(field.fleet)


@pytest.fixture(scope="module")
def built(field, up):
    """mlp tuned (16 trials) and built for the field board's class: (tuning result, build report)."""
    from edgetune.artifact.release import build_artifacts
    from edgetune.artifact_format.signing import init_keys
    from edgetune.tune.tuner import SearchSettings, TuneOptions, tune_class

    assert up.ok, up.failed
    fleet = field.fleet
    init_keys(fleet.artifacts.signing_key, fleet.artifacts.public_key, fleet.artifacts.dir)
    tuned = tune_class(fleet, "field-x86", TuneOptions(search=SearchSettings(population_size=64)))
    return tuned, build_artifacts(fleet)


@pytest.fixture(scope="module")
def served(field, built):
    """The artifact server up, and v1 rolled out to the field board: (fleet, rollout result)."""
    from edgetune.deploy.rollout import plan_rollout, rollout

    assert built[1].ok, built[1].failures()
    server = RunningServer(field.fleet)
    try:
        yield field.fleet, rollout(field.fleet, plan_rollout(field.fleet, MODEL))
    finally:
        server.stop()


def test_fleet_up_delivers_the_agent_bundle_and_the_board_registers(field, up):
    from edgetune.fleet import fleet_up

    assert up.ok, up.failed
    board = field.fleet.board("field-1")
    copy = Path(bundle_path(board))
    assert (
        copy.parent == Path(agent_root(board))
        and hashlib.sha256(copy.read_bytes()).hexdigest() == agent_bundle().sha256
    )
    before = copy.stat().st_mtime_ns
    assert fleet_up(field.fleet).ok
    assert copy.stat().st_mtime_ns == before  # the same bundle is not uploaded again


def test_tune_and_build_measure_on_the_field_board(field, built):
    from edgetune.artifact.store import ArtifactStore

    tuned, report = built
    assert tuned.ok, tuned.error
    assert tuned.trials_run == 16 and tuned.stopped is None
    assert report.ok, report.failures()
    manifest = ArtifactStore(field.fleet.artifacts.dir).latest(MODEL, "field-x86").manifest
    assert [b.board for b in manifest.boards] == ["field-1"]


def test_a_board_without_onnxruntime_runs_the_build_without_comparing_against_it(field, built, tmp_path):
    from support.onnx_samples import qdq_model

    from edgetune.artifact.measure import RUNTIMES, OnnxModel, compare_on_board, runtime_on_board
    from edgetune.artifact.store import ArtifactStore
    from edgetune.artifact_format.manifest import LIBRARY_NAME, REFERENCE_INPUT_NAME, Tolerance
    from edgetune.artifact_format.reference import read_npz
    from edgetune.fleet.tracker import board_sessions, rpc_endpoint

    fleet = field.fleet
    stored = ArtifactStore(fleet.artifacts.dir).latest(MODEL, "field-x86")
    args = list(read_npz(stored.path / REFERENCE_INPUT_NAME).values())
    onnx = OnnxModel(
        qdq_model(tmp_path / "vad-int8.onnx"), {"x": np.zeros((1, 512), np.float32)}, {}, Tolerance(1e-4, 1e-5)
    )
    measurement = fleet.device_class("field-x86").profile.measurement
    with board_sessions(rpc_endpoint(fleet, "field-x86"), fleet.boards) as (sessions, failed):
        assert not failed, failed
        assert [runtime_on_board(sessions["field-1"], name) for name in RUNTIMES] == [
            "",
            "",
        ]  # the board image has neither
        runs = compare_on_board(
            sessions["field-1"],
            {"tuned": stored.path / LIBRARY_NAME},
            stored.manifest.entry.function,
            args,
            measurement,
            onnx,
        )
    assert list(runs) == ["tuned"] and runs["tuned"].timing.samples > 0
    assert all(board.onnxruntime is None and board.openvino is None for board in stored.manifest.boards)


def agent(fleet, verb: str, *args: str) -> dict:
    from edgetune.deploy.remote import RemoteAgent

    with BoardSession(fleet.board("field-1")) as session:
        return RemoteAgent(session, fleet).call(verb, *args)


def test_rollout_installs_on_the_field_board(served):
    fleet, result = served
    assert result.ok, result.records()
    assert [(r["board"], r["result"], r["to_version"]) for r in result.records()] == [("field-1", "installed", 1)]
    assert agent(fleet, "status")["models"][MODEL]["version"] == 1


def test_regress_measures_the_installed_release_on_the_field_board(served):
    """The board is timed against its baseline; which way the ratio goes beside the other test
    workers is not this test's business (tests/regress/test_regress_fleet.py's timed tests)."""
    from edgetune.regress.check import regress

    report = regress(served[0], models=[MODEL])
    (verdict,) = report.verdicts
    assert (verdict.board, verdict.version) == ("field-1", 1)
    assert_timed(verdict)


def test_a_tampered_bundle_is_refused_then_replaced_before_the_agent_runs(served):
    fleet, _ = served
    board = fleet.board("field-1")
    copy = Path(bundle_path(board))
    copy.write_bytes(copy.read_bytes() + b"\0tampered")
    refused = on_board(
        fleet, shlex.join(agent_argv(board, "--root", agent_root(board), "status", "--json")), check=False
    )
    assert refused.exit_status != 0 and "refused, not run" in refused.stderr and refused.stdout == ""
    assert agent(fleet, "status")["models"][MODEL]["version"] == 1  # the host replaced it first
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == agent_bundle().sha256


def test_rollout_of_a_second_version_then_rollback_on_the_field_board(served):
    """While the example application (examples/app.py, with the board image's Python and the
    agent's bundle) runs the model in a loop on the board, a rollout switches it to a second
    version: no call fails, every answer is within its version's tolerance, and the application
    is on the new version within a call of the switch. Then a rollback."""
    from edgetune.deploy.rollout import plan_rollout, rollout

    fleet, _ = served
    board = fleet.board("field-1")
    log = f"{board.workdir}/app.log"
    with BoardSession(board) as session:
        session.put_file(f"{board.workdir}/app.py", (REPO / "examples" / "app.py").read_bytes())
    started = on_board(
        fleet,
        f"nohup {shlex.quote(board.python)} -I {board.workdir}/app.py --workdir {board.workdir} "
        f"--model {MODEL} --seconds 600 < /dev/null > {log} 2>&1 & echo $!",
    )
    app_pid = int(started.stdout.strip())
    try:
        _wait_for_app(fleet, log, lambda calls: sum(call.get("version") == 1 for call in calls) >= 10)
        second = republish(fleet, MODEL, "field-x86", "field")
        result = rollout(fleet, plan_rollout(fleet, MODEL))
        assert [(r["result"], r["to_version"]) for r in result.records()] == [("installed", second.version)]
        switched = float(on_board(fleet, f"stat -c %Y {agent_root(board)}/releases/{MODEL}/current").stdout)
        lines = _wait_for_app(
            fleet, log, lambda calls: sum(call.get("version") == second.version for call in calls) >= 10
        )
    finally:
        on_board(fleet, f"kill {app_pid}", check=False)
    calls = [line for line in lines if "call" in line]
    assert all(call["ok"] for call in calls), [call for call in calls if not call["ok"]][:3]
    assert [call["version"] for call in calls] == sorted(call["version"] for call in calls)  # never back, never mixed
    (moved,) = [line["time"] for line in lines if line.get("switched_to") == second.version]
    assert moved - switched < 2.0  # the link's mtime has whole seconds: an upper bound
    back = agent(fleet, "rollback", "--model", MODEL)
    assert (back["result"], back["from_version"], back["to_version"]) == ("rolled_back", second.version, 1), back
    assert agent(fleet, "status")["models"][MODEL]["version"] == 1


def _wait_for_app(fleet, log: str, enough, timeout_s: float = 120.0) -> list[dict]:
    """The application's JSON lines on the board, once `enough(lines)` holds."""
    import json
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        text = on_board(fleet, f"cat {log}").stdout
        lines = [json.loads(line) for line in text.splitlines()[:-1] if line.startswith("{")]  # whole lines only
        if enough(lines):
            return lines
        assert time.monotonic() < deadline, f"the application did not get there:\n{text[-2000:]}"
        time.sleep(0.5)
