"""The host's half of a deploy path that holds on a hostile network: `keys init` makes the fleet
CA and the server certificate, `serve` speaks HTTPS (plain HTTP only when the fleet says so),
offers are signed decisions whose serials never go back, and only what the signed index lists
is offered or served."""

from __future__ import annotations

import json
import socket
import stat
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
import yaml
from cryptography import x509
from support.artifact_server import RunningServer
from support.deploy_support import publish_version
from support.https_requests import get

from edgetune.artifact.store import ArtifactStore
from edgetune.artifact_format.codec import from_json
from edgetune.artifact_format.decision import Asked, check_decision
from edgetune.artifact_format.places import INDEX_NAME, INDEX_SIGNATURE_NAME
from edgetune.artifact_format.signing import Signature, key_id, load_public_key
from edgetune.artifact_format.trust import TrustFile, accept_trust
from edgetune.cli import main
from edgetune.deploy.decisions import SerialCounter
from edgetune.deploy.tls import check_server_tls, rotate_server
from edgetune.errors import DeployError
from edgetune.inventory import load_fleet


def _sans(path) -> set[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {f"ip:{n}" for n in names.get_values_for_type(x509.IPAddress)} | {
        f"dns:{n}" for n in names.get_values_for_type(x509.DNSName)
    }


def test_keys_init_makes_the_fleet_ca_and_a_server_certificate_for_the_url(deploy_fleet, capsys):
    assert main(["keys", "init", "-f", str(deploy_fleet.path)]) == 0
    tls = deploy_fleet.deploy.tls
    for secret in (tls.ca_key, tls.server_key, deploy_fleet.artifacts.signing_key):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert _sans(tls.server_cert) == {"ip:127.0.0.1"}
    ca = x509.load_pem_x509_certificate(tls.ca_cert.read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert check_server_tls(deploy_fleet) == {"ssl_certfile": str(tls.server_cert), "ssl_keyfile": str(tls.server_key)}
    assert "fleet CA" in capsys.readouterr().out


def test_keys_init_if_missing_makes_tls_files_beside_an_existing_signing_key(deploy_fleet, capsys):
    publish_version(deploy_fleet, "mlp", "gw-fast", b"x")  # a signing key, and the TLS files
    tls = deploy_fleet.deploy.tls
    ca_before = tls.ca_cert.read_bytes()
    for path in (tls.server_cert, tls.server_key):
        path.unlink()
    assert main(["keys", "init", "--if-missing", "-f", str(deploy_fleet.path)]) == 0
    out = capsys.readouterr().out
    assert "keeping the existing signing key" in out and "server certificate" in out and "there was none" in out
    assert tls.server_cert.exists() and tls.ca_cert.read_bytes() == ca_before
    server_before = tls.server_cert.read_bytes()
    assert main(["keys", "init", "--if-missing", "-f", str(deploy_fleet.path)]) == 0
    assert tls.server_cert.read_bytes() == server_before and "keeping the fleet CA" in capsys.readouterr().out


def test_a_new_url_gets_a_new_server_certificate_from_the_same_ca(deploy_fleet, capsys):
    assert main(["keys", "init", "-f", str(deploy_fleet.path)]) == 0
    tls = deploy_fleet.deploy.tls
    ca_before = tls.ca_cert.read_bytes()
    data = yaml.safe_load(deploy_fleet.path.read_text())
    data["deploy"].update(
        url=f"https://artifacts.fleet.example:{deploy_fleet.deploy.port}", bind=f"0.0.0.0:{deploy_fleet.deploy.port}"
    )
    deploy_fleet.path.write_text(yaml.safe_dump(data))
    with pytest.raises(DeployError, match="did not name artifacts.fleet.example.*keys init --if-missing"):
        check_server_tls(load_fleet(deploy_fleet.path))  # `serve` refuses to start with it
    assert main(["keys", "init", "--if-missing", "-f", str(deploy_fleet.path)]) == 0
    assert _sans(tls.server_cert) == {"dns:artifacts.fleet.example"}  # 0.0.0.0 names no host
    assert tls.ca_cert.read_bytes() == ca_before


def test_plain_http_only_when_the_fleet_says_so(deploy_fleet):
    data = yaml.safe_load(deploy_fleet.path.read_text())
    data["deploy"].update(url=data["deploy"]["url"].replace("https://", "http://"), tls=False)
    deploy_fleet.path.write_text(yaml.safe_dump(data))
    fleet = load_fleet(deploy_fleet.path)
    assert fleet.deploy.tls is None and check_server_tls(fleet) == {}
    publish_version(fleet, "mlp", "gw-fast", b"x")  # the signing key the server signs decisions with
    server = RunningServer(fleet)
    try:
        with urllib.request.urlopen(f"{fleet.deploy.url}/v1/health", timeout=10) as response:
            assert json.loads(response.read()) == {"ok": True}
    finally:
        server.stop()
    assert not fleet.artifacts.signing_key.with_name("fleet-ca.pem").exists()


def test_serials_grow_across_restarts_and_a_clock_set_back(tmp_path, monkeypatch):
    path = tmp_path / "state" / "decision-serial.json"
    first = SerialCounter(path).next()
    assert abs(first - time.time() * 1000) < 60_000  # the time in milliseconds
    back = time.time() - 3600
    monkeypatch.setattr("edgetune.deploy.decisions.time", SimpleNamespace(time=lambda: back))  # set back an hour
    after_restart = [SerialCounter(path).next() for _ in range(3)]
    assert after_restart == [first + 1, first + 2, first + 3]
    monkeypatch.setattr("edgetune.deploy.decisions.time", SimpleNamespace(time=lambda: 1_000_000.0))  # 50 years back
    with pytest.raises(DeployError, match="days ahead of its signing time .* `edgetune fleet reset-serial`"):
        SerialCounter(path).next()  # boards would refuse it: nothing is signed


def test_offers_are_signed_decisions_and_serials_only_grow(deploy_fleet, published, artifact_server):
    _, tokens = published
    anchor = load_public_key(deploy_fleet.artifacts.public_key)
    serials = []
    for _ in range(2):
        offer = json.loads(get(artifact_server, "/v1/boards/fast-2/models/mlp", tokens["fast-2"])[2])
        asked = Asked("fast-2", "gw-fast", "mlp", None, last_serial=serials[-1] if serials else 0)
        trust = from_json(TrustFile, offer["trust"])
        key = accept_trust(anchor, trust, None, time.time()).decision_key(time.time())
        assert key_id(key) != key_id(anchor)  # the online key signs decisions, never the artifact key
        decision = check_decision(key, offer["decision"], Signature(**offer["decision_signature"]), asked, time.time())
        assert (decision.version, decision.pinned, decision.requested) == (1, True, False)  # fast-2's pin
        assert decision.manifest_sha256 == offer["manifest_sha256"] and decision.tarball_size == offer["tarball_size"]
        serials.append(decision.serial)
    assert serials[1] > serials[0]


def test_a_version_the_signed_index_does_not_list_is_neither_offered_nor_served(
    deploy_fleet, published, artifact_server
):
    _, tokens = published
    root = deploy_fleet.artifacts.dir
    index = {name: (root / name).read_bytes() for name in (INDEX_NAME, INDEX_SIGNATURE_NAME)}
    publish_version(deploy_fleet, "mlp", "gw-fast", b"fast-v3" * 100)
    for name, data in index.items():  # the index as it was before v3 (a crash before its rewrite)
        (root / name).write_bytes(data)
    assert ArtifactStore(root).versions("mlp", "gw-fast") == [1, 2, 3]
    offer = json.loads(get(artifact_server, "/v1/boards/fast-1/models/mlp", tokens["fast-1"])[2])
    assert offer["version"] == 2
    status, _, body = get(artifact_server, "/v1/boards/fast-1/models/mlp/versions/3", tokens["fast-1"])
    assert status == 404 and "(available: v1, v2)" in json.loads(body)["error"]
    for path in ("/v1/artifacts/mlp/gw-fast/v3.tar.gz", "/v1/artifacts/mlp/gw-fast/v3/manifest.json"):
        status, _, body = get(artifact_server, path, tokens["fast-1"])
        assert status == 404 and "listed in the signed index" in json.loads(body)["error"]


def test_an_index_whose_signature_fails_stops_every_offer(deploy_fleet, published, artifact_server):
    _, tokens = published
    index = deploy_fleet.artifacts.dir / INDEX_NAME
    index.write_bytes(index.read_bytes().replace(b'"version":1', b'"version":7', 1))
    status, _, body = get(artifact_server, "/v1/boards/fast-1/models/mlp", tokens["fast-1"])
    assert status == 503 and "signed index cannot be used" in json.loads(body)["error"]
    status, _, _ = get(artifact_server, "/v1/artifacts/mlp/gw-fast/v1.tar.gz", tokens["fast-1"])
    assert status == 503


def _served_certificate(server) -> x509.Certificate:
    host, port = server.url.removeprefix("https://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        with server.context.wrap_socket(raw, server_hostname=host) as tls:
            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))


def test_a_running_server_renews_its_short_lived_certificate(deploy_fleet, published, monkeypatch):
    """Server certificates live days; a running `serve` makes a due one anew from the fleet CA,
    and new connections get the new one."""
    server = RunningServer(deploy_fleet)
    try:
        at_start = _served_certificate(server)
        assert timedelta(days=6.9) < at_start.not_valid_after_utc - datetime.now(timezone.utc) < timedelta(days=7.1)
        with monkeypatch.context() as short:
            short.setattr("edgetune.deploy.tls.SERVER_DAYS", 2)
            rotate_server(deploy_fleet)  # the file's certificate is due now: 2 days left
        assert _served_certificate(server).serial_number == at_start.serial_number  # read at start only
        server.server.next_check = 0.0  # the hourly check, now
        deadline = time.monotonic() + 10
        while (renewed := _served_certificate(server)).serial_number == at_start.serial_number:
            assert time.monotonic() < deadline, "the running server did not renew its certificate"
            time.sleep(0.1)
        assert renewed.not_valid_after_utc - datetime.now(timezone.utc) > timedelta(days=6.9)
        on_disk = x509.load_pem_x509_certificate(deploy_fleet.deploy.tls.server_cert.read_bytes())
        assert on_disk.serial_number == renewed.serial_number
    finally:
        server.stop()
