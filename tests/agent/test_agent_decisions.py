"""The agent acts only on the server's signed decision, over HTTPS it checks against the pinned
fleet CA (the real server, `edgetune serve`, on loopback).

The man in the middle here holds the server's TLS key (`OfferProxy`: a TLS-terminating
middlebox, or an attacker who stole the key), so it can change the plain answers: a rewritten,
substituted, replayed or expired decision is refused before anything is downloaded, and the
board stays on its release. Without the key, a server of another CA, or a certificate that does
not name the URL's host, is refused and the refusal says which.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
from support.agent_support import current
from support.tls_proxy import OfferProxy, TlsProxy, http_body, with_body

from edgetune.agent.cli import main as agent_main
from edgetune.agent.file_tree import FileTree
from edgetune.agent.install import install
from edgetune.agent.state import last_decision_serial, record_decision_serial
from edgetune.artifact_format.codec import to_json
from edgetune.artifact_format.decision import Decision, sign_decision
from edgetune.artifact_format.signing import load_private_key
from edgetune.deploy.keys import KeyFiles
from edgetune.deploy.tls import ensure_tls
from edgetune.inventory.schema import TlsFiles


@pytest.fixture
def offer_proxy(server, fleet):
    proxy = OfferProxy(("127.0.0.1", fleet.port), fleet.tls)
    try:
        yield proxy
    finally:
        proxy.close()


def _offer_downloads(server, mark: int) -> list[str]:
    return [r["path"] for r in server.requests()[mark:] if r["path"].startswith("/v1/artifacts/")]


def test_a_pinned_board_installs_its_pin_and_records_the_serial(board_on, server):
    root = board_on(1, board="pinned-1", server=server.url)
    record = install(root, "mlp")
    assert (record.result, record.to_version) == ("installed", 2) and current(root) == "v2"  # its pin, not v3
    seen = last_decision_serial(FileTree(root))
    assert seen > 0 and install(root, "mlp").result == "unchanged"
    assert last_decision_serial(FileTree(root)) > seen


def test_an_offer_turned_into_another_signed_version_is_refused(board_on, server, offer_proxy):
    """The proxy asks the server, with the board's own token, for v3 instead of the board's
    assignment (its pin, v2): a validly signed, fresh decision, but not the one asked for."""
    root = board_on(2, board="pinned-1", server=offer_proxy.url)
    offer_proxy.path = lambda path: path.replace("/models/mlp?", "/models/mlp/versions/3?")
    mark = len(server.requests())
    record = install(root, "mlp")
    assert record.result == "failed" and current(root) == "v2"
    assert "answers a request for v3, not for the version this board should run" in record.error
    assert _offer_downloads(server, mark) == []


def test_a_rewritten_decision_is_refused(board_on, server, offer_proxy):
    root = board_on(2, board="pinned-1", server=offer_proxy.url)

    def to_v3(response: bytes) -> bytes:
        offer = json.loads(http_body(response))
        offer["decision"] = offer["decision"].replace('"version":2', '"version":3')
        offer.update(version=3, tarball_url=offer["tarball_url"].replace("/v2.", "/v3."))
        return with_body(response, json.dumps(offer).encode())

    offer_proxy.answer = to_v3
    record = install(root, "mlp")
    assert record.result == "failed" and current(root) == "v2"
    assert "signature does not match the decision's bytes" in record.error


def test_an_offer_that_says_other_than_its_decision_is_refused(board_on, server, offer_proxy):
    root = board_on(2, board="pinned-1", server=offer_proxy.url)

    def unsigned_v3(response: bytes) -> bytes:
        offer = json.loads(http_body(response))
        offer.update(version=3, manifest_url=offer["manifest_url"].replace("/v2/", "/v3/"))
        return with_body(response, json.dumps(offer).encode())

    offer_proxy.answer = unsigned_v3
    record = install(root, "mlp")
    assert record.result == "failed" and current(root) == "v2"
    assert "the offer's version 3 is not its signed decision's 2" in record.error


def test_a_replayed_older_decision_is_refused(board_on, server, offer_proxy):
    root = board_on(2, board="pinned-1", server=offer_proxy.url)
    assert install(root, "mlp").result == "unchanged"
    assert install(root, "mlp").result == "unchanged"
    first = json.loads(json.loads(http_body(offer_proxy.answers[0]))["decision"])
    offer_proxy.answer = lambda response: offer_proxy.answers[0]
    record = install(root, "mlp")
    assert record.result == "failed" and current(root) == "v2"
    assert f"it echoes nonce {first['nonce']}, not this request's" in record.error


@pytest.mark.parametrize("clock_s", [25 * 3600, -3600])
def test_a_boards_clock_ahead_or_behind_decides_nothing(board_on, server, offer_proxy, monkeypatch, clock_s):
    """A board whose clock runs a day ahead (no RTC) takes a fresh decision; one whose clock runs
    an hour behind (spoofed NTP) refuses an answer held back from an earlier request: the nonce
    it sent, echoed in the signed decision, says which answer was made for it."""
    root = board_on(2, board="pinned-1", server=offer_proxy.url)
    monkeypatch.setattr("edgetune.agent.fetch.time", SimpleNamespace(time=lambda: time.time() + clock_s))
    assert install(root, "mlp").result == "unchanged"  # fresh: taken, whatever the board's clock says
    held_back = offer_proxy.answers[-1]
    offer_proxy.answer = lambda response: held_back
    record = install(root, "mlp")
    assert record.result == "failed" and current(root) == "v2"
    assert "an answer made for another request: replayed or held back" in record.error


def test_a_decision_for_another_board_is_refused(board_on, server, fleet, offer_proxy):
    root = board_on(2, board="pinned-1", server=offer_proxy.url)
    offer_proxy.path = lambda path: path.replace("/pinned-1/", "/fast-1/")
    (root / "token").write_text(fleet.tokens["fast-1"])  # a token of fast-1, stolen
    record = install(root, "mlp")
    assert record.result == "failed" and current(root) == "v2"
    assert "it is for board fast-1 of class gw-fast, this is pinned-1 of class gw-fast" in record.error


def _other_ca(fleet, directory):
    """Another fleet CA, and a server certificate it made for the same names."""
    other = replace(fleet.fleet.deploy, tls=TlsFiles.beside(directory / "signing.key"))
    ensure_tls(fleet.fleet.replace(deploy=other))
    return other.tls


def test_a_server_of_another_ca_is_refused_saying_so(make_board, server, fleet, tmp_path):
    impostor = TlsProxy(("127.0.0.1", fleet.port), fleet.tls, presented=_other_ca(fleet, tmp_path / "other"))
    try:
        root = make_board(board="pinned-1", server=impostor.url)
        record = install(root, "mlp")
    finally:
        impostor.close()
    assert record.result == "failed" and current(root) is None
    assert "wrong CA: the server's certificate is not signed by the fleet CA pinned on this board" in record.error


def test_a_certificate_that_does_not_name_the_host_is_refused_saying_so(make_board, server):
    root = make_board(board="pinned-1", server=server.url.replace("127.0.0.1", "localhost"))
    record = install(root, "mlp")
    assert record.result == "failed" and current(root) is None
    assert "name mismatch: the server's certificate does not name the host of this URL" in record.error


FAR_AHEAD = 4102444800001  # 2100-01-01 in milliseconds


def test_a_decision_whose_serial_runs_far_ahead_of_its_signing_time_is_refused(board_on, server, fleet, offer_proxy):
    """A holder of the decision key (or a host whose clock once ran ahead) signs a serial of the
    year 2100 today: a board that took it would refuse every later decision. It is refused."""
    root = board_on(2, board="pinned-1", server=offer_proxy.url)
    seen = last_decision_serial(FileTree(root))
    key = load_private_key(KeyFiles.of(fleet.fleet).decision_key)

    def far_ahead(response: bytes) -> bytes:
        offer = json.loads(http_body(response))
        decision = replace(Decision.from_bytes(offer["decision"].encode()), serial=FAR_AHEAD)
        text, signature = sign_decision(key, decision)
        offer.update(decision=text, decision_signature=to_json(signature))
        return with_body(response, json.dumps(offer).encode())

    offer_proxy.answer = far_ahead
    record = install(root, "mlp")
    assert record.result == "failed" and current(root) == "v2"
    assert f"serial {FAR_AHEAD} is" in record.error and "days ahead of its signing time" in record.error
    assert last_decision_serial(FileTree(root)) == seen


def test_a_board_locked_out_by_a_serial_far_ahead_recovers_with_reset_serial(board_on, server, capsys):
    root = board_on(2, board="pinned-1", server=server.url)
    record_decision_serial(FileTree(root), FAR_AHEAD)  # as a board took one before serials were bounded
    record = install(root, "mlp")
    assert record.result == "failed" and f"is not above the last seen {FAR_AHEAD}" in record.error
    now = int(time.time() * 1000)
    assert agent_main(["--root", str(root), "reset-serial", "--to", str(now), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "schema": "edgetune.agent-answer",
        "schema_version": 1,
        "verb": "reset-serial",
        "record": {"board": "pinned-1", "previous": FAR_AHEAD, "last_serial": now},
    }
    assert install(root, "mlp").result == "unchanged"
    assert last_decision_serial(FileTree(root)) > now
