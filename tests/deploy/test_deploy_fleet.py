"""Deploy on the simulated fleet, for real: the artifact server on the fleet's bridge, the board
agents fetching over HTTP from inside their own network namespaces, rollouts over SSH.

Uses `released_fleet` (tests/conftest.py): real tuned, built and signed mlp artifacts for both
classes, on boards with directories of this module's own. The module's fixture
rolls mlp out to every board twice (the second finds nothing to do), then publishes a v2 for
gw-fast; each test leaves the boards on the release it found them on.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.artifact_server import RunningServer
from support.deploy_support import republish

from edgetune.artifact.store import ArtifactStore
from edgetune.artifact_format.files import pack_tarball
from edgetune.deploy.remote import RemoteAgent
from edgetune.deploy.rollout import plan_rollout, rollout
from edgetune.fleet.agent_bundle import agent_root
from edgetune.fleet.ssh import BoardSession
from edgetune.fleet.ssh_route import uses_ssh_transport
from edgetune.fleet.state import load_deployed

MODEL = "mlp"


class AccessLog(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[dict] = []

    def emit(self, record):
        self.lines.append(json.loads(record.getMessage()))


@dataclass(frozen=True)
class Served:
    fleet: object  # edgetune's Fleet
    log: AccessLog  # the server's access log from its start
    first: object  # the first rollout's RolloutResult (all four boards at once)
    again: object  # the same rollout again


@pytest.fixture(scope="module")
def served(released_fleet):
    fleet = released_fleet
    log = AccessLog()
    logging.getLogger("edgetune.access").addHandler(log)
    logging.getLogger("edgetune.access").setLevel(logging.INFO)
    server = RunningServer(fleet)
    try:
        first = rollout(fleet, plan_rollout(fleet, MODEL, canary=0))
        again = rollout(fleet, plan_rollout(fleet, MODEL, canary=0))
        republish(fleet, MODEL, "gw-fast", "v2")
        yield Served(fleet, log, first, again)
    finally:
        server.stop()
        logging.getLogger("edgetune.access").removeHandler(log)


def agent(fleet, name: str, verb: str, *args: str) -> dict:
    with BoardSession(fleet.board(name)) as session:
        return RemoteAgent(session, fleet).call(verb, *args)


def current(fleet, name: str) -> int | None:
    return agent(fleet, name, "status")["models"].get(MODEL, {}).get("version")


def latest(fleet, device_class: str) -> int:
    return ArtifactStore(fleet.artifacts.dir).latest(MODEL, device_class).version


def test_rollout_installs_every_board_over_http_from_its_namespace(served):
    fleet, log, result = served.fleet, served.log, served.first
    assert [[t.board.name for t in stage.targets] for stage in result.plan.stages] == [
        ["fast-1", "fast-2", "slow-1", "slow-2"]
    ]
    assert result.ok, result.records()
    assert {r["board"]: (r["result"], r["to_version"]) for r in result.records()} == {
        "fast-1": ("installed", 1),
        "fast-2": ("installed", 1),
        "slow-1": ("installed", 1),
        "slow-2": ("installed", 1),
    }
    assert {name: current(fleet, name) for name in ("fast-1", "fast-2", "slow-1", "slow-2")} == dict.fromkeys(
        ("fast-1", "fast-2", "slow-1", "slow-2"), 1
    )
    assert {name: versions[MODEL] for name, versions in load_deployed(fleet).items()} == dict.fromkeys(
        ("fast-1", "fast-2", "slow-1", "slow-2"), 1
    )
    tarballs = {
        line["board"]: line["client"]
        for line in log.lines
        if line["path"].endswith(".tar.gz") and line["status"] == 200
    }
    assert set(tarballs) == {b.name for b in fleet.boards}  # each board fetched its own
    for board in fleet.boards:  # from its own address, or through its SSH connection (from this host's side)
        assert (tarballs[board.name] == board.address) is not uses_ssh_transport(board), board.name
    assert served.again.ok and {r["result"] for r in served.again.records()} == {"unchanged"}


def test_tampered_or_wrongly_signed_downloads_leave_the_board_as_it_was(served):
    fleet = served.fleet
    v2 = ArtifactStore(fleet.artifacts.dir).get(MODEL, "gw-fast", 2)
    good_tarball, good_sig = v2.tarball.read_bytes(), (v2.path / "manifest.sig").read_bytes()
    try:
        data = bytearray(good_tarball)
        data[len(data) // 2] ^= 0xFF
        v2.tarball.write_bytes(bytes(data))
        record = agent(fleet, "fast-1", "install", "--model", MODEL, "--version", "2")
        assert record["result"] == "failed" and current(fleet, "fast-1") == 1
        (v2.path / "manifest.sig").write_bytes(good_sig.replace(good_sig[-20:-10], b"A" * 10))
        v2.tarball.write_bytes(pack_tarball(v2.path))  # tampered consistently, so the server still serves it
        record = agent(fleet, "fast-1", "install", "--model", MODEL, "--version", "2")
        assert record["result"] == "failed" and "signature" in record["error"] and current(fleet, "fast-1") == 1
    finally:
        v2.tarball.write_bytes(good_tarball)
        (v2.path / "manifest.sig").write_bytes(good_sig)


def test_a_bad_token_is_refused_by_the_server(served):
    fleet = served.fleet
    token = Path(agent_root(fleet.board("fast-2"))) / "token"
    good = token.read_bytes()
    try:
        token.write_bytes(b"x" * 43)
        record = agent(fleet, "fast-2", "install", "--model", MODEL)
        assert record["result"] == "failed" and "401" in record["error"] and current(fleet, "fast-2") == 1
    finally:
        token.write_bytes(good)


def test_interrupted_download_resumes_and_older_versions_are_refused(served):
    fleet = served.fleet
    v2 = ArtifactStore(fleet.artifacts.dir).get(MODEL, "gw-fast", 2)
    downloads = Path(agent_root(fleet.board("fast-1"))) / "downloads"
    downloads.mkdir(exist_ok=True)
    half = v2.tarball.read_bytes()[: v2.tarball.stat().st_size // 2]
    fetched = agent(fleet, "fast-1", "fetch", "--model", MODEL, "--version", "2")
    partial = Path(fetched["tarball"]).with_name(Path(fetched["tarball"]).name + ".part")
    Path(fetched["tarball"]).unlink()
    partial.write_bytes(half)  # what an interrupted download leaves: half the bytes and their ETag
    partial.with_name(partial.name + ".etag").write_text(f'"{hashlib.sha256(v2.tarball.read_bytes()).hexdigest()}"')
    resumed = agent(fleet, "fast-1", "fetch", "--model", MODEL, "--version", "2")
    assert resumed["resumed_from"] == len(half) and Path(resumed["tarball"]).read_bytes() == v2.tarball.read_bytes()
    installed = agent(fleet, "fast-1", "install", "--model", MODEL, "--version", "2")
    assert (installed["result"], installed["from_version"], current(fleet, "fast-1")) == ("installed", 1, 2)
    replay = agent(fleet, "fast-1", "install", "--model", MODEL, "--version", "1")
    assert replay["result"] == "failed" and current(fleet, "fast-1") == 2
    back = agent(fleet, "fast-1", "rollback", "--model", MODEL)
    assert back["result"] == "rolled_back" and current(fleet, "fast-1") == 1


@pytest.fixture
def full_disk(served):
    """slow-2's download directory (a board of the batch after the canaries) on a tiny tmpfs,
    mounted on the board itself (its sshd's mount namespace): a real 'no space left on device'
    there and nowhere else."""
    fleet = served.fleet
    downloads = f"{agent_root(fleet.board('slow-2'))}/downloads"
    with BoardSession(fleet.board("slow-2")) as board:
        board.run(f"mkdir -p {downloads} && mount -t tmpfs -o size=8k edgetune-test-full {downloads}")
        try:
            yield "slow-2"
        finally:
            board.run(f"umount {downloads}")


def test_rollout_stops_at_the_threshold_and_rolls_back(served, full_disk):
    fleet = served.fleet
    republish(fleet, MODEL, "gw-slow", "v2")
    before = {name: current(fleet, name) for name in ("fast-1", "fast-2", "slow-1", "slow-2")}
    plan = plan_rollout(fleet, MODEL, canary=1, batch=3, max_failed_pct=0)
    result = rollout(fleet, plan)
    records = {r["board"]: r for r in result.records()}
    assert not result.ok and "failed" in result.stopped
    assert records[full_disk]["result"] == "failed" and "space" in records[full_disk]["error"].lower()
    assert records["fast-1"]["result"] == "rolled_back" and records["fast-1"]["to_version"] == 2
    assert {name: current(fleet, name) for name in before} == before  # every board on the release it had
    assert all(r["result"] in ("rolled_back", "failed", "unchanged") for r in records.values())
    assert load_deployed(fleet)["fast-1"] == {MODEL: before["fast-1"]}
