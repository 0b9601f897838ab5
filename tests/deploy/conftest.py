"""Fixtures of the deploy tests: a loopback fleet with a `deploy` section, a store holding
signed versions (`published`), and the real artifact server (uvicorn, HTTPS) on a free
loopback port."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from support.artifact_server import RunningServer
from support.deploy_support import publish_version
from support.fleet_marker import starts_fleet
from support.tests_samples import FAKE_PRIVATE_KEY

REPO = Path(__file__).resolve().parents[2]

FLEET_YAML = """\
version: 1
name: deploy-unit
workdir: work
trackers:
  - {{name: host, bind_host: 127.0.0.1, public_address: 127.0.0.1, port: 9390}}
ssh: {{user: root, key: id_ed25519, known_hosts: known_hosts}}
device_classes:
  - {{name: gw-fast, profile: {repo}/device_profiles/x86-64-v3.yaml, pin: {{}}}}
  - {{name: gw-slow, profile: {repo}/device_profiles/x86-64-v2.yaml}}
boards:
  - {{name: fast-1, address: 127.0.0.11, device_class: gw-fast, python: /usr/bin/python3, workdir: /tmp/f1}}
  - {{name: fast-2, address: 127.0.0.12, device_class: gw-fast, python: /usr/bin/python3, workdir: /tmp/f2, pin: {{mlp: 1}}}}
  - {{name: slow-1, address: 127.0.0.21, device_class: gw-slow, python: /usr/bin/python3, workdir: /tmp/s1, token_env: EDGETUNE_TEST_SLOW1_TOKEN}}
models:
  - {{name: mlp, builtin: mlp, inputs: [{{name: x, shape: [1, 256]}}]}}
  - {{name: other, builtin: mlp, inputs: [{{name: x, shape: [1, 256]}}]}}
tuning: {{trials_per_class: 16}}
artifacts: {{dir: artifacts, signing_key: work/keys/signing.key, public_key: work/keys/signing.pub}}
deploy: {{bind: "127.0.0.1:{port}", url: "https://127.0.0.1:{port}"}}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def deploy_fleet(tmp_path):
    from edgetune.inventory import load_fleet

    key = tmp_path / "id_ed25519"
    key.write_text(FAKE_PRIVATE_KEY)
    key.chmod(0o600)
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET_YAML.format(repo=REPO, port=free_port()))
    return load_fleet(path)


@pytest.fixture
@starts_fleet
def artifact_server(deploy_fleet):
    server = RunningServer(deploy_fleet)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def published(deploy_fleet, monkeypatch):
    """mlp v1, v2 for gw-fast; mlp v1 for gw-slow; tokens for every board."""
    from edgetune.deploy.tokens import ensure_token

    monkeypatch.setenv("EDGETUNE_TEST_SLOW1_TOKEN", "s" * 40)
    versions = [
        publish_version(deploy_fleet, "mlp", "gw-fast", b"fast-v1" * 100),
        publish_version(deploy_fleet, "mlp", "gw-fast", b"fast-v2" * 100),
        publish_version(deploy_fleet, "mlp", "gw-slow", b"slow-v1" * 100),
    ]
    tokens = {b.name: ensure_token(deploy_fleet, b) for b in deploy_fleet.boards}
    return versions, tokens
