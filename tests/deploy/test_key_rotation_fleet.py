"""Rotating the fleet's keys on the simulated fleet: after `keys rotate ca`, `keys rotate
artifact` and `keys rotate decision`, the next rollout (over SSH, boards in their namespaces)
gives every board the new CA and the new keys' history, and the boards install what the new
keys sign; a board pinning a CA this fleet never had is refused, named, and left as it was.

Uses `released_fleet` with keys of the module's own (a copy: other modules keep theirs) and
its gw-fast boards.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

import pytest
from support.artifact_server import RunningServer
from support.deploy_support import republish

from edgetune.artifact_format.signing import key_id, load_public_key
from edgetune.artifact_format.trust import TrustFile, artifact_history
from edgetune.deploy.keys import KeyFiles, OfflineKeys
from edgetune.deploy.remote import RemoteAgent
from edgetune.deploy.rollout import plan_rollout, rollout
from edgetune.deploy.tls import ensure_tls, rotate_ca
from edgetune.fleet.agent_bundle import agent_root
from edgetune.fleet.ssh import BoardSession
from edgetune.inventory.schema import TlsFiles

MODEL = "mlp"
FAST = ["gw-fast"]


class Serving:
    """The real artifact server for `fleet`, restartable (a new certificate is read at start)."""

    def __init__(self, fleet):
        self.fleet, self.server = fleet, RunningServer(fleet)

    def restart(self) -> None:
        self.server.stop()
        self.server = RunningServer(self.fleet)


@pytest.fixture(scope="module")
def served(released_fleet, tmp_path_factory):
    """released_fleet with a keys directory of its own, served, mlp v1 on the gw-fast boards."""
    keys = tmp_path_factory.mktemp("rotated") / "keys"
    shutil.copytree(released_fleet.artifacts.signing_key.parent, keys)
    artifacts = dataclasses.replace(
        released_fleet.artifacts,
        signing_key=keys / released_fleet.artifacts.signing_key.name,
        public_key=keys / released_fleet.artifacts.public_key.name,
    )
    deploy = dataclasses.replace(released_fleet.deploy, tls=TlsFiles.beside(artifacts.signing_key))
    own = released_fleet.replace(artifacts=artifacts, deploy=deploy)
    serving = Serving(own)
    try:
        assert rollout(own, plan_rollout(own, MODEL, classes=FAST, canary=0)).ok
        yield serving
    finally:
        serving.server.stop()


def _board_file(fleet, name: str, file: str) -> Path:
    return Path(agent_root(fleet.board(name))) / file


def _running(fleet, name: str) -> int | None:
    with BoardSession(fleet.board(name)) as session:
        return RemoteAgent(session, fleet).status().models[MODEL].version


def test_the_next_rollout_carries_every_rotated_key_to_the_boards(served):
    fleet = served.fleet
    files, tls = KeyFiles.of(fleet), fleet.deploy.tls
    old_ca = tls.ca_cert.read_bytes()
    anchor = load_public_key(fleet.artifacts.public_key)
    assert _board_file(fleet, "fast-1", "fleet-ca.pem").read_bytes() == old_ca

    now = time.time()
    rotate_ca(fleet)
    OfflineKeys(fleet).rotate_artifact(now, None)
    OfflineKeys(fleet).rotate_decision(now, now)
    assert tls.ca_cert.read_bytes() != old_ca
    republish(fleet, MODEL, "gw-fast", "after-rotation")  # signed by the new artifact key

    served.restart()  # `serve` reads its new certificate at start
    result = rollout(fleet, plan_rollout(fleet, MODEL, classes=FAST, canary=0))
    assert result.ok, result.records()
    newest = key_id(load_public_key(fleet.artifacts.public_key))
    for name in ("fast-1", "fast-2"):
        assert _board_file(fleet, name, "fleet-ca.pem").read_bytes() == tls.ca_cert.read_bytes()
        taken = TrustFile.from_bytes(_board_file(fleet, name, "trust.json").read_bytes(), name)
        assert [key_id(k) for k in artifact_history(taken)] == [key_id(anchor), newest]
        assert key_id(load_public_key(_board_file(fleet, name, "fleet.pub"))) == key_id(anchor)  # the anchor stays
        assert taken == TrustFile.from_bytes(files.trust.read_bytes(), "host")
    assert _running(fleet, "fast-1") == 2  # fast-2 is pinned to v1 by the inventory


def test_a_board_pinning_a_ca_the_fleet_never_had_is_refused_and_left_alone(served, tmp_path):
    fleet = served.fleet
    foreign = TlsFiles.beside(tmp_path / "foreign" / "signing.key")
    other = fleet.replace(name="another-fleet", deploy=dataclasses.replace(fleet.deploy, tls=foreign))
    ensure_tls(other)
    pinned = _board_file(fleet, "fast-1", "fleet-ca.pem")
    ours = pinned.read_bytes()
    pinned.write_bytes(foreign.ca_cert.read_bytes())
    try:
        result = rollout(fleet, plan_rollout(fleet, MODEL, classes=FAST, canary=0))
        refused = {r["board"]: r for r in result.records()}["fast-1"]
        assert refused["result"] == "failed" and "a fleet CA this fleet never had" in refused["error"]
        assert pinned.read_bytes() == foreign.ca_cert.read_bytes()
    finally:
        pinned.write_bytes(ours)
