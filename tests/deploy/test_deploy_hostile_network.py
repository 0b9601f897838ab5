"""A hostile network between the artifact server and a board of the simulated fleet: the board's
agent, in its own network namespace, reaches the server through a proxy on the fleet's bridge.

The proxy holds the server's TLS key (the worst case: a stolen key, or a TLS-terminating
middlebox): it replays an older signed decision, or puts a validly signed decision for another
request in place of the board's. Both are refused and the board stays on its release. A proxy
without the key can only present a certificate of another CA, or one that names another host:
refused, saying which. Uses `released_fleet` (real tuned and signed mlp artifacts).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.artifact_server import RunningServer
from support.tls_proxy import OfferProxy, TlsProxy

from edgetune.artifact.store import ArtifactStore
from edgetune.deploy.remote import RemoteAgent
from edgetune.deploy.tls import ensure_tls
from edgetune.deploy.tokens import ensure_token
from edgetune.fleet.ssh import BoardSession
from edgetune.inventory.schema import TlsFiles

MODEL = "mlp"
BOARD = "slow-2"


@pytest.fixture(scope="module")
def served(released_fleet):
    server = RunningServer(released_fleet)
    try:
        yield released_fleet
    finally:
        server.stop()


def through(fleet, url: str, verb: str, *args: str) -> dict:
    """Run an agent verb on the board, its agent configured to reach the server at `url`."""
    proxied = fleet.replace(deploy=replace(fleet.deploy, url=url))
    with BoardSession(fleet.board(BOARD)) as session:
        agent = RemoteAgent(session, proxied)
        agent.provision(ensure_token(fleet, fleet.board(BOARD)), fleet.artifacts.public_key.read_bytes())
        return agent.call(verb, *args)


def current(fleet, url: str) -> int | None:
    return through(fleet, url, "status")["models"].get(MODEL, {}).get("version")


def test_replayed_and_substituted_decisions_are_refused_in_the_namespace(served):
    fleet = served
    bridge = fleet.deploy.bind_host
    newest = ArtifactStore(fleet.artifacts.dir).latest(MODEL, "gw-slow").version
    proxy = OfferProxy((bridge, fleet.deploy.port), fleet.deploy.tls, host=bridge)
    try:
        first = through(fleet, proxy.url, "install", "--model", MODEL)
        assert first["result"] in ("installed", "unchanged") and current(fleet, proxy.url) == newest
        proxy.answer = lambda response: proxy.answers[0]  # the same signed answer, again
        replayed = through(fleet, proxy.url, "install", "--model", MODEL)
        assert (
            replayed["result"] == "failed"
            and "an answer made for another request: replayed or held back" in replayed["error"]
        )
        proxy.answer = None
        proxy.path = lambda path: path.replace(f"/models/{MODEL}?", f"/models/{MODEL}/versions/{newest}?")
        substituted = through(fleet, proxy.url, "install", "--model", MODEL)
        assert substituted["result"] == "failed"
        assert f"answers a request for v{newest}, not for the version this board should run" in substituted["error"]
        assert current(fleet, proxy.url) == newest
    finally:
        proxy.close()


def _certificate(fleet, directory, ca: str, names_host: str) -> TlsFiles:
    """A server certificate for `names_host`, by the fleet CA (`ca="fleet"`) or a CA of its own."""
    own = TlsFiles.beside(directory / "signing.key")
    files = own if ca == "other" else replace(own, ca_cert=fleet.deploy.tls.ca_cert, ca_key=fleet.deploy.tls.ca_key)
    named = replace(fleet.deploy, url=f"https://{names_host}:{fleet.deploy.port}", bind_host=names_host, tls=files)
    ensure_tls(fleet.replace(deploy=named))
    return files


@pytest.mark.parametrize(
    "ca, names_host, refusal",
    [
        ("other", None, "wrong CA: the server's certificate is not signed by the fleet CA pinned on this board"),
        ("fleet", "10.9.9.9", "name mismatch: the server's certificate does not name the host of this URL"),
    ],
)
def test_a_server_without_the_fleet_certificate_is_refused_in_the_namespace(served, tmp_path, ca, names_host, refusal):
    fleet = served
    bridge = fleet.deploy.bind_host
    presented = _certificate(fleet, tmp_path, ca, names_host or bridge)
    impostor = TlsProxy((bridge, fleet.deploy.port), fleet.deploy.tls, presented=presented, host=bridge)
    try:
        record = through(fleet, impostor.url, "install", "--model", MODEL)
    finally:
        impostor.close()
    assert record["result"] == "failed" and refusal in record["error"]
