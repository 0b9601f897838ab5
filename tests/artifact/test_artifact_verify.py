"""verify: intact artifacts pass; each kind of damage is named precisely."""

from __future__ import annotations

import json

import pytest

from edgetune.artifact.signing import init_keys, load_public_key
from edgetune.artifact.verify import VerificationError, verify_artifact
from edgetune.cli import main


@pytest.fixture
def v1(publish, make_manifest):
    return publish(make_manifest()).stored


def _problems(path, public_key):
    with pytest.raises(VerificationError) as err:
        verify_artifact(path, public_key)
    return err.value.problems


def test_intact_directory_and_tarball_verify(v1, keys):
    assert verify_artifact(v1.path, keys[1]) == v1.manifest
    assert verify_artifact(v1.tarball, keys[1]) == v1.manifest


def test_tampered_library(v1, keys):
    lib = v1.path / "model.so"
    lib.write_bytes(lib.read_bytes().replace(b"E", b"e"))
    (problem,) = _problems(v1.path, keys[1])
    assert problem.startswith("model.so: sha256 is ") and "(modified)" in problem


def test_truncated_library_and_extra_and_missing_files(v1, keys):
    (v1.path / "model.so").write_bytes(b"\x7f")
    (v1.path / "backdoor.py").write_text("")
    (v1.path / "report" / "summary.json").unlink()
    assert _problems(v1.path, keys[1]) == [
        "model.so: size is 1 bytes, the manifest says 12 (modified or cut short)",
        "report/summary.json: missing (listed in the manifest)",
        "backdoor.py: present but not listed in the manifest",
    ]


def test_tampered_manifest(v1, keys):
    path = v1.path / "manifest.json"
    raw = json.loads(path.read_bytes())
    raw["boards"][0]["tuned"]["median_ms"] = 0.001
    path.write_bytes(json.dumps(raw, sort_keys=True, separators=(",", ":")).encode())
    assert _problems(v1.path, keys[1]) == [
        "manifest.json: signature does not match the manifest's bytes (the manifest was modified after signing)"
    ]


def test_wrong_public_key(v1, tmp_path):
    other = init_keys(tmp_path / "o.key", tmp_path / "o.pub", tmp_path / "artifacts")
    (problem,) = _problems(v1.path, load_public_key(other.public_key))
    assert problem.startswith("manifest.json: signed by key ") and "wrong public key" in problem


def test_missing_signature(v1, keys):
    (v1.path / "manifest.sig").unlink()
    assert _problems(v1.tarball.parent / "v1", keys[1]) == ["manifest.sig: missing"]


def test_truncated_tarball(v1, keys):
    data = v1.tarball.read_bytes()
    v1.tarball.write_bytes(data[: len(data) // 2])
    (problem,) = _problems(v1.tarball, keys[1])
    assert problem.startswith("v1.tar.gz: truncated or corrupt archive")


def test_cli_verify_exit_codes(v1, tmp_path, capsys):
    public = tmp_path / "keys" / "signing.pub"
    assert main(["verify", str(v1.tarball), "--public-key", str(public)]) == 0
    assert "OK" in capsys.readouterr().out
    (v1.path / "model.so").write_bytes(b"tampered")
    assert main(["verify", str(v1.path), "--public-key", str(public)]) == 5
    assert "model.so: size is 8 bytes" in capsys.readouterr().err
