"""Signing: key files, permissions, refusal to overwrite, signatures."""

from __future__ import annotations

import stat

import pytest

from edgetune.artifact_format.signing import init_keys, load_private_key, load_public_key, sign, signature_problem
from edgetune.errors import ArtifactError


def test_keys_init_writes_private_key_0600_and_refuses_to_overwrite(tmp_path):
    private, public = tmp_path / "k" / "signing.key", tmp_path / "k" / "signing.pub"
    pair = init_keys(private, public, tmp_path / "artifacts")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert b"BEGIN PRIVATE KEY" in private.read_bytes() and b"BEGIN PUBLIC KEY" in public.read_bytes()
    with pytest.raises(ArtifactError, match="already exists.*--force"):
        init_keys(private, public, tmp_path / "artifacts")
    replaced = init_keys(private, public, tmp_path / "artifacts", force=True)
    assert replaced.key_id != pair.key_id


def test_keys_init_refuses_a_private_key_inside_artifacts(tmp_path):
    with pytest.raises(ArtifactError, match="inside the artifacts directory"):
        init_keys(tmp_path / "artifacts" / "k.key", tmp_path / "k.pub", tmp_path / "artifacts")


def test_missing_or_exposed_key_says_what_to_do(tmp_path, keys):
    with pytest.raises(ArtifactError, match="run `edgetune keys init`"):
        load_private_key(tmp_path / "nope.key")
    exposed = tmp_path / "keys" / "signing.key"
    exposed.chmod(0o644)
    with pytest.raises(ArtifactError, match="chmod 600"):
        load_private_key(exposed)


def test_sign_and_verify(tmp_path, keys):
    private, public = keys
    sig = sign(private, b"manifest bytes")
    assert signature_problem(public, b"manifest bytes", sig) is None
    assert "modified after signing" in signature_problem(public, b"manifest bytez", sig)
    other = init_keys(tmp_path / "o.key", tmp_path / "o.pub", tmp_path / "artifacts")
    assert "wrong public key" in signature_problem(load_public_key(other.public_key), b"manifest bytes", sig)
