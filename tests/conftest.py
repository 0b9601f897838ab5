"""Shared fixtures. `sim_fleet`: a real simulated fleet (network namespaces, OpenSSH, a TVM
tracker and an rpc_server per board) for the whole test session, torn down at the end.

Two device classes, two boards each: `gw-fast` (x86-64-v3 profile: AVX2, a full core) and
`gw-slow` (x86-64-v2 profile, half a core: twice as slow, and a lower quota would only make
every agent call, server start and timing sample there take longer). The profiles are the
repository's, timing builds and regress checks in shorter samples (quick_profiles.py). Each concurrent test
session takes its own slot (bridge `etune-tN`, subnet 10.231.(9+N).0/24, tracker port
9290+10N, artifact server port 8470+N) under a lock file, so two developers' runs on one
machine never collide.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.fleet_marker import starts_fleet
from support.quick_profiles import quick_profiles
from support.quiet_host import configure_locks, pytest_runtest_protocol  # noqa: F401 (hook)
from support.sim_checks import running
from support.sim_network import slot_network
from support.worker_groups import (  # noqa: F401 (hooks)
    nice_background_worker,
    pytest_addoption,
    pytest_configure_node,
    pytest_xdist_make_scheduler,
    record_durations,
    record_groups,
)

REPO = Path(__file__).resolve().parent.parent
SLOTS = 8

FLEET_YAML = """\
version: 1
name: test-fleet-t{slot}
workdir: work
sim:
  bridge: etune-t{slot}
  host_address: 10.231.{subnet}.1/24
trackers:
  - {{name: host, bind_host: 10.231.{subnet}.1, public_address: 10.231.{subnet}.1, port: {port}, port_end: {port_end}}}
ssh:
  user: root
  key: work/sim/id_ed25519
  known_hosts: work/known_hosts
  connect_timeout_s: 3
  command_timeout_s: 60
device_classes:
  - {{name: gw-fast, profile: {profiles}/x86-64-v3.yaml}}
  - {{name: gw-slow, profile: {profiles}/x86-64-v2.yaml}}
boards:
  - {{name: fast-1, address: 10.231.{subnet}.11, device_class: gw-fast, python: {python}, workdir: work/boards/fast-1, simulated: {{cpu_quota: 1.0}}}}
  - {{name: fast-2, address: 10.231.{subnet}.12, device_class: gw-fast, python: {python}, workdir: work/boards/fast-2, simulated: {{cpu_quota: 1.0}}}}
  - {{name: slow-1, address: 10.231.{subnet}.21, device_class: gw-slow, python: {python}, workdir: work/boards/slow-1, simulated: {{cpu_quota: 0.5}}}}
  - {{name: slow-2, address: 10.231.{subnet}.22, device_class: gw-slow, python: {python}, workdir: work/boards/slow-2, simulated: {{cpu_quota: 0.5}}}}
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
  bind: 10.231.{subnet}.1:{deploy_port}
  url: https://10.231.{subnet}.1:{deploy_port}
"""


def pytest_configure(config):
    configure_locks(config)
    nice_background_worker(config)
    record_durations(config)


def pytest_collection_modifyitems(config, items):
    """Mark `fleet` every test that needs a fixture marked `starts_fleet` (tests/support/fleet_marker.py);
    under pytest-xdist, tell the controller which tests share a worker (worker_groups.py)."""
    for item in items:
        definitions = getattr(item, "_fixtureinfo", None)
        if definitions and any(
            getattr(d.func, "starts_fleet", False) for defs in definitions.name2fixturedefs.values() for d in defs
        ):
            item.add_marker(pytest.mark.fleet)
    record_groups(config, items)


@pytest.fixture(autouse=True)
def _no_console_log_after_the_test():
    """The console handler `edgetune.cli.main()` puts on the root logger, taken off when the test
    ends: left on, it prints every later record of any thread (the artifact server's access log,
    paramiko's transport errors) to the terminal between the dots; without it, a record goes to
    the captured log of the test it comes in, shown only if that test fails."""
    yield
    cli = sys.modules.get("edgetune.cli")  # not imported here: most tests never load the CLI
    if cli is not None:
        root = logging.getLogger()
        for handler in [h for h in root.handlers if h.get_name() == cli.CONSOLE_HANDLER]:
            root.removeHandler(handler)


def _take_slot(lock_dir: Path):
    """Lock the first free slot; the open lock file keeps it until the session ends. A slot
    whose bridge exists without a lock holder was left by a killed session: it is skipped,
    never cleaned up behind someone's back (`edgetune sim down` on its fleet.yaml removes it)."""
    for slot in range(SLOTS):
        handle = open(lock_dir / f"edgetune-sim-fleet-{slot}.lock", "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        if not Path(f"/sys/class/net/etune-t{slot}").exists():
            return slot, handle
        handle.close()
    pytest.fail(f"all {SLOTS} simulated-fleet slots are in use by other test sessions or left over")


def write_fleet_yaml(directory: Path, slot: int) -> Path:
    path = directory / "fleet.yaml"
    path.write_text(
        FLEET_YAML.format(
            **slot_network(slot),
            profiles=quick_profiles(directory / "device_profiles"),
            python=sys.executable,
        )
    )
    return path


@pytest.fixture
@starts_fleet
def spare_fleet_yaml(tmp_path):
    """A fleet.yaml like sim_fleet's on a slot of its own, for tests that create and destroy
    a fleet themselves (nothing is started here)."""
    slot, lock = _take_slot(Path("/tmp"))
    try:
        yield write_fleet_yaml(tmp_path, slot)
    finally:
        lock.close()


@pytest.fixture(scope="module")
@starts_fleet
def sim_slot():
    """A simulated-fleet slot for a module that builds a fleet of its own: its number N."""
    slot, lock = _take_slot(Path("/tmp"))
    try:
        yield slot
    finally:
        lock.close()


@pytest.fixture(scope="session")
@starts_fleet
def sim_fleet(tmp_path_factory):
    """The loaded `Fleet` of a running simulated fleet: every board registered in its tracker."""
    from edgetune.fleet.errors import SimError
    from edgetune.fleet.sim import check_prerequisites
    from edgetune.inventory import load_fleet

    try:
        check_prerequisites()
    except SimError as err:
        if os.environ.get("CI"):  # CI installs everything and runs as root: a skip would hide a broken set-up
            pytest.fail(f"CI cannot build the simulated fleet: {err}")
        pytest.skip(f"no simulated fleet on this machine: {err}")
    slot, lock = _take_slot(Path("/tmp"))
    fleet = load_fleet(write_fleet_yaml(tmp_path_factory.mktemp("sim-fleet"), slot))
    try:
        with running(fleet):
            yield fleet
    finally:
        lock.close()


@pytest.fixture(scope="session")
def built_release(sim_fleet, tmp_path_factory):
    """`sim_fleet` with a store, keys and board directories of its own, in which mlp was tuned
    (the fleet's small budget, on the class's boards, both classes at once as `edgetune tune`
    does; the class databases are the fleet's) and
    built for every class: real signed artifacts with baselines measured on the boards. Returns
    `BuiltRelease`. Shared by the session: a test that builds or tunes more works on a copy of
    `as_built` (tests/artifact/test_artifact_build_sim.py's `built`)."""
    import dataclasses

    from edgetune.artifact.release import build_artifacts
    from edgetune.artifact_format.signing import init_keys
    from edgetune.inventory.schema import ArtifactSettings
    from edgetune.tune.tuner import SearchSettings, TuneOptions, tune_fleet

    root = tmp_path_factory.mktemp("built-fleet")
    fleet = sim_fleet.replace(
        boards=tuple(dataclasses.replace(b, workdir=str(root / "boards" / b.name)) for b in sim_fleet.boards),
        artifacts=ArtifactSettings(root / "artifacts", root / "keys" / "signing.key", root / "keys" / "signing.pub"),
    )
    init_keys(fleet.artifacts.signing_key, fleet.artifacts.public_key, fleet.artifacts.dir)
    tuned = tune_fleet(fleet, TuneOptions(search=SearchSettings(population_size=64)))
    assert tuned.ok, [c.error for c in tuned.classes]
    report = build_artifacts(fleet)
    assert report.ok, report.failures()
    return BuiltRelease(fleet, report, _keep_as_built(fleet, root / "as-built"))


@pytest.fixture(scope="module")
def released_fleet(built_release, tmp_path_factory):
    """`built_release`'s fleet with board directories and a store of the module's own, the store
    a copy of the build's: the boards run nothing yet (their agents are installed by the first call), and
    nothing another module rolls out, publishes or breaks is seen here. The fleet's workdir (its
    running simulation, tokens, deployed.json and journal) stays shared."""
    import dataclasses

    root = tmp_path_factory.mktemp("released")
    fleet = built_release.fleet
    shutil.copytree(built_release.as_built / "artifacts", root / "artifacts")
    return fleet.replace(
        boards=tuple(dataclasses.replace(b, workdir=str(root / "boards" / b.name)) for b in fleet.boards),
        artifacts=dataclasses.replace(fleet.artifacts, dir=root / "artifacts"),
    )


@dataclass(frozen=True)
class BuiltRelease:
    fleet: object  # edgetune's Fleet
    report: object  # the build's BuildReport
    as_built: Path  # `work/` (databases, reports) and `artifacts/` as the build left them


def _keep_as_built(fleet, directory: Path) -> Path:
    """A copy of the class databases, tuning reports and store as they are now: what tests that
    build into their own copy start from, whatever other tests add to the live ones later."""
    from edgetune.inventory.workdir import Workdir

    workdir = Workdir(fleet.workdir)
    for device_class in fleet.device_classes:
        for tuned in (workdir.database(device_class.name), workdir.reports(device_class.name)):
            shutil.copytree(tuned, directory / "work" / tuned.relative_to(fleet.workdir))
    shutil.copytree(fleet.artifacts.dir, directory / "artifacts")
    return directory
