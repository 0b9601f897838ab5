"""Keys by role, rotated and revoked with the real server (`edgetune serve` on loopback HTTPS) and
a board's agent: the board follows the fleet's keys from its pinned anchor, and refuses what the
old keys sign once they are retired. A host fleet of its own (the session fleet's keys never
change)."""

from __future__ import annotations

import time

import pytest
from support.agent_support import agent_cli, current

from edgetune.agent.errors import AgentError
from edgetune.agent.fetch import fetch
from edgetune.agent.install import install, rollback
from edgetune.agent.installation import Installation
from edgetune.artifact_format.decision import Asked, DecisionError, check_decision, new_decision, sign_decision
from edgetune.artifact_format.signing import key_id, load_private_key, load_public_key
from edgetune.artifact_format.trust import ARTIFACT, TrustError, TrustFile, key_statement
from edgetune.cli import main
from edgetune.deploy.keys import KeyFiles, OnlineKeys
from edgetune.deploy.pull import pull
from edgetune.errors import DeployError


def _keys(host_fleet, *args: str) -> None:
    assert main(["keys", *args, "-f", str(host_fleet.path)]) == 0


def _publish_with_current_key(host_fleet, tag: str) -> None:
    host_fleet._key = load_private_key(host_fleet.fleet.artifacts.signing_key)
    host_fleet.publish("mlp", "gw-fast", tag)


def _trust(host_fleet) -> TrustFile:
    return TrustFile.from_bytes(KeyFiles.of(host_fleet.fleet).trust.read_bytes(), "trust.json")


def test_boards_follow_every_rotation_and_refuse_what_retired_keys_sign(own_host, board_of, tmp_path):
    fleet, server = own_host
    files = KeyFiles.of(fleet.fleet)
    board = board_of(tmp_path / "board" / "agent", fleet, "fast-1", server.url)
    offline = board_of(tmp_path / "offline" / "agent", fleet, "fast-1", server.url)  # away during the rotations
    anchor = load_public_key(files.public_key)

    assert install(board, "mlp").result == "installed" and current(board) == "v1"
    assert TrustFile.from_bytes((board / "trust.json").read_bytes(), "board") == _trust(fleet)
    old_decision = load_private_key(files.decision_key)

    # The decision key: serve takes the new one at its next request; the old one is refused at once.
    _keys(fleet, "rotate", "decision")
    assert key_id(load_private_key(files.decision_key).public_key()) != key_id(old_decision.public_key())
    fetch(board, "mlp")
    trusted = Installation.open(board).trusted()
    with pytest.raises(TrustError, match="revoked since"):
        trusted.refuse_revoked(key_id(old_decision.public_key()), "decision key", time.time())
    forged = new_decision(
        board="fast-1",
        device_class="gw-fast",
        model="mlp",
        version=1,
        manifest_sha256="0" * 64,
        tarball_size=1,
        pinned=False,
        requested=False,
        serial=2**40,
        issued_at=time.time(),
        ttl_s=60,
    )
    text, signature = sign_decision(old_decision, forged)
    with pytest.raises(DecisionError, match="signed by key"):
        check_decision(
            trusted.decision_key(time.time()), text, signature, Asked("fast-1", "gw-fast", "mlp", None, 0), time.time()
        )

    # The artifact key: its successor, certified by it; the store is signed again, new versions by it.
    old_artifact = load_private_key(files.signing_key)
    _keys(fleet, "rotate", "artifact")
    new_artifact = load_private_key(files.signing_key)
    assert key_id(new_artifact.public_key()) != key_id(old_artifact.public_key())
    assert key_id(load_public_key(files.public_key)) == key_id(new_artifact.public_key())
    _publish_with_current_key(fleet, "r-v2")
    assert install(board, "mlp").result == "installed" and current(board) == "v2"
    assert key_id(Installation.open(board).trusted().artifact_key) == key_id(new_artifact.public_key())
    assert key_id(load_public_key(board / "fleet.pub")) == key_id(anchor)
    # v1, signed by the superseded (not revoked) key, still runs: a rollback to it is checked and done.
    assert rollback(board, "mlp").result == "rolled_back" and current(board) == "v1"

    # A board away during both rotations follows the whole history from its anchor.
    assert install(offline, "mlp").result == "installed" and current(offline) == "v2"

    # A thief of the old artifact key cannot fork the history the boards took.
    fork = TrustFile(
        _trust(fleet).schema,
        1,
        _trust(fleet).anchor,
        (key_statement(old_artifact, ARTIFACT, old_decision.public_key(), time.time()),),
    )
    with pytest.raises(AgentError, match="does not extend"):
        Installation.open(board).trusted(fork)
    # Nor can an older trust file (before the revocations the board took) be put in place again.
    with pytest.raises(AgentError, match="does not extend"):
        Installation.open(offline).trusted(TrustFile(_trust(fleet).schema, 1, _trust(fleet).anchor))

    # Revoking the old artifact key: what it signed is refused from then on, on every board.
    _keys(fleet, "revoke", key_id(old_artifact.public_key()))
    assert install(board, "mlp").result in ("installed", "unchanged")  # takes the revocations with the offer
    refused = rollback(board, "mlp", to=1)
    assert refused.result == "failed" and key_id(old_artifact.public_key()) in refused.error
    assert current(board) == "v2"


def test_serve_never_holds_the_artifact_key(own_host):
    fleet, server = own_host
    files = KeyFiles.of(fleet.fleet)
    # serve runs (and answers offers) with the artifact key out of its reach
    hidden = files.signing_key.with_name("offline.key")
    files.signing_key.rename(hidden)
    try:
        OnlineKeys(fleet.fleet).current()
    finally:
        hidden.rename(files.signing_key)
    # and refuses to start with the artifact key given as its decision key
    kept = files.decision_key.with_name("kept.key")
    files.decision_key.rename(kept)
    try:
        files.decision_key.symlink_to(files.signing_key)
        with pytest.raises(DeployError, match="is the artifact signing key"):
            OnlineKeys(fleet.fleet)
    finally:
        files.decision_key.unlink()
        kept.rename(files.decision_key)


def test_a_board_that_never_reaches_the_server_follows_rotations_through_pull(own_host, board_of, tmp_path):
    """`edgetune pull` writes the fleet's trust file beside the tarball; an anchor-only board
    refuses a tarball the successor key signed until it is given that file."""
    fleet, _ = own_host
    _keys(fleet, "rotate", "artifact")
    _publish_with_current_key(fleet, f"r-pull-{time.time_ns()}")
    (pulled,) = pull(fleet.fleet, "fast-1", ["mlp"], tmp_path / "pulled")
    trust = tmp_path / "pulled" / "fast-1" / "trust.json"
    assert TrustFile.from_bytes(trust.read_bytes(), "pulled") == _trust(fleet)
    board = board_of(tmp_path / "away" / "agent", fleet, "fast-1")
    status, refused = agent_cli(board, "install", "--model", "mlp", "--from", str(pulled.tarball))
    assert refused["result"] == "failed" and "signed by key" in refused["error"] and current(board) is None
    status, record = agent_cli(board, "install", "--model", "mlp", "--from", str(pulled.tarball), "--trust", str(trust))
    assert (status, record["result"], current(board)) == (0, "installed", f"v{pulled.version}"), record
