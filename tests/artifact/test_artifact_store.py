"""Store: versions grow only when inputs change, crashes leave nothing that looks complete."""

from __future__ import annotations

import json
import os
import tarfile

import pytest

from edgetune.artifact.files import pack_tarball
from edgetune.artifact.manifest import MANIFEST_NAME, SIGNATURE_NAME
from edgetune.artifact.store import INDEX_NAME
from edgetune.errors import ArtifactError


def test_first_build_makes_v1_with_manifest_signature_tarball_and_index(store, publish, make_manifest):
    result = publish(make_manifest())
    assert result.created and result.stored.version == 1
    v1 = store.root / "mlp" / "gateway-avx512" / "v1"
    assert sorted(p.name for p in v1.iterdir()) == [MANIFEST_NAME, SIGNATURE_NAME, "model.so", "report"]
    manifest = result.stored.manifest
    assert manifest.version == 1
    assert [f.path for f in manifest.files] == ["model.so", "report/summary.json"]
    with tarfile.open(v1.with_name("v1.tar.gz")) as tar:
        assert sorted(tar.getnames()) == sorted([MANIFEST_NAME, SIGNATURE_NAME, "model.so", "report/summary.json"])
    index = json.loads((store.root / INDEX_NAME).read_bytes())
    (entry,) = index["versions"]
    assert entry["version"] == 1 and entry["manifest_sha256"] == manifest.digest()
    assert entry["tuned_median_ms"] == 0.25
    assert not list(store.root.glob("mlp/gateway-avx512/.staging-*"))


def test_unchanged_rebuild_makes_no_new_version(store, publish, make_manifest):
    first = publish(make_manifest(created="2025-01-01T00:00:00Z"))
    again = publish(make_manifest(created="2025-02-02T00:00:00Z"))
    assert not again.created and again.stored.version == 1
    assert again.stored.manifest == first.stored.manifest
    assert store.versions("mlp", "gateway-avx512") == [1]
    assert not list(store.root.glob("mlp/gateway-avx512/.staging-*"))


def test_changed_input_makes_v2_and_keeps_v1(store, publish, make_manifest, make_inputs):
    publish(make_manifest())
    second = publish(make_manifest(make_inputs(database_sha256="f" * 64)), library=b"better")
    assert second.created and second.stored.version == 2
    assert store.versions("mlp", "gateway-avx512") == [1, 2]
    assert (store.root / "mlp" / "gateway-avx512" / "v1" / "model.so").read_bytes() == b"\x7fELF-library"
    index = json.loads((store.root / INDEX_NAME).read_bytes())
    assert [e["version"] for e in index["versions"]] == [1, 2]


def test_crashed_staging_is_not_listed_and_is_cleaned(store, publish, make_manifest):
    dead = store.root / "mlp" / "gateway-avx512" / ".staging-999999999-dead"
    dead.mkdir(parents=True)
    (dead / MANIFEST_NAME).write_text("{}")
    assert store.versions("mlp", "gateway-avx512") == []
    assert store.latest("mlp", "gateway-avx512") is None
    publish(make_manifest())
    assert store.versions("mlp", "gateway-avx512") == [1]
    assert not dead.exists()


def test_failed_build_leaves_no_trace(store, make_manifest):
    with pytest.raises(RuntimeError):
        with store.stage("mlp", "gateway-avx512") as staging:
            (staging.path / "model.so").write_bytes(b"half")
            raise RuntimeError("board failed the output check")
    assert list((store.root / "mlp" / "gateway-avx512").iterdir()) == []


def test_missing_tarball_is_repacked_at_next_commit(store, publish, make_manifest, make_inputs):
    first = publish(make_manifest())
    first.stored.tarball.unlink()
    publish(make_manifest(make_inputs(database_sha256="f" * 64)))
    assert first.stored.tarball.read_bytes() == pack_tarball(first.stored.path)


def test_tarball_is_deterministic(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"x")
    (tmp_path / "b.txt").write_text("b")
    first = pack_tarball(tmp_path)
    os.utime(tmp_path / "b.txt", (1, 1))
    assert pack_tarball(tmp_path) == first


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_store_is_a_clear_error(store):
    store.root.mkdir()
    store.root.chmod(0o500)
    try:
        with pytest.raises(ArtifactError, match="not writable.*artifacts.dir"):
            store.check_writable()
    finally:
        store.root.chmod(0o700)


def test_store_under_a_file_is_a_clear_error(tmp_path):
    from edgetune.artifact.store import ArtifactStore

    (tmp_path / "file").write_text("")
    with pytest.raises(ArtifactError, match="not writable"):
        ArtifactStore(tmp_path / "file" / "artifacts").check_writable()
