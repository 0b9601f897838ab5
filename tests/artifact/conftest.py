"""Fixtures of the artifact tests: a key pair, a sample manifest, a store with one staged build."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.tests_samples import sample_inputs, sample_manifest

from edgetune.artifact.store import ArtifactStore
from edgetune.artifact_format.manifest import Manifest
from edgetune.artifact_format.signing import init_keys, load_private_key, load_public_key


@pytest.fixture
def keys(tmp_path: Path):
    pair = init_keys(tmp_path / "keys" / "signing.key", tmp_path / "keys" / "signing.pub", tmp_path / "artifacts")
    return load_private_key(pair.private_key), load_public_key(pair.public_key)


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "artifacts")


@pytest.fixture
def publish(store: ArtifactStore, keys):
    """publish(manifest, library=...): stage a small artifact (library + report) and commit it."""

    def _publish(manifest: Manifest, library: bytes = b"\x7fELF-library"):
        with store.stage(manifest.inputs.model, manifest.inputs.device_class) as staging:
            (staging.path / "model.so").write_bytes(library)
            (staging.path / "report").mkdir()
            (staging.path / "report" / "summary.json").write_text('{"trials": 64}')
            return store.commit(staging, manifest, keys[0])

    return _publish


@pytest.fixture
def make_inputs():
    return sample_inputs


@pytest.fixture
def make_manifest():
    return sample_manifest


FLEET_YAML = """\
version: 1
name: artifact-unit
workdir: work
sim:
  bridge: etune-unit
  host_address: 10.231.99.1/24
trackers:
  - {{name: host, bind_host: 10.231.99.1, public_address: 10.231.99.1, port: 9390, port_end: 9391}}
ssh:
  user: root
  key: work/id_ed25519
  known_hosts: work/known_hosts
device_classes:
  - {{name: gw-fast, profile: {repo}/device_profiles/x86-64-v3.yaml}}
boards:
  - {{name: fast-1, address: 10.231.99.11, device_class: gw-fast, python: /usr/bin/python3, workdir: /tmp/b, simulated: {{cpu_quota: 1.0}}}}
models:
  - name: mlp
    builtin: mlp
    inputs:
      - {{name: x, shape: [1, 256], dtype: float32}}
tuning:
  trials_per_class: 16
  trials_per_iter: 8
artifacts:
  dir: artifacts
  signing_key: work/keys/signing.key
  public_key: work/keys/signing.pub
"""


@pytest.fixture
def fleet_file(tmp_path: Path) -> Path:
    """A small valid inventory (never brought up: no machine behind it) in a fresh directory."""
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET_YAML.format(repo=Path(__file__).resolve().parents[2]))
    return path
