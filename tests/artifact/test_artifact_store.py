"""Store: versions grow only when inputs change and are never reused, crashes leave nothing that
looks complete, tarballs match their directories, the index is signed."""

from __future__ import annotations

import json
import os
import shutil
import tarfile

import pytest

from edgetune.artifact.index_check import verify_index
from edgetune.artifact.store import HIGHWATER_NAME
from edgetune.artifact_format.files import pack_tarball
from edgetune.artifact_format.manifest import MANIFEST_NAME, SIGNATURE_NAME
from edgetune.artifact_format.places import INDEX_NAME
from edgetune.artifact_format.verify import VerificationError
from edgetune.cli import main
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


def _new_inputs(make_manifest, make_inputs, n: int):
    return make_manifest(make_inputs(database_sha256=f"{n:064x}"))


def test_version_numbers_are_never_reused_after_a_delete(store, publish, make_manifest, make_inputs):
    for n in (1, 2, 3):
        publish(_new_inputs(make_manifest, make_inputs, n))
    class_dir = store.class_dir("mlp", "gateway-avx512")
    shutil.rmtree(class_dir / "v3")
    (class_dir / "v3.tar.gz").unlink()
    assert store.versions("mlp", "gateway-avx512") == [1, 2]
    result = publish(_new_inputs(make_manifest, make_inputs, 4))
    assert result.stored.version == 4 and store.versions("mlp", "gateway-avx512") == [1, 2, 4]
    assert (class_dir / HIGHWATER_NAME).read_text() == "4\n"
    shutil.rmtree(class_dir / "v4")
    shutil.rmtree(class_dir / "v2")
    assert publish(_new_inputs(make_manifest, make_inputs, 5)).stored.version == 5


def test_a_damaged_highwater_mark_is_a_clear_error(store, publish, make_manifest, make_inputs):
    publish(make_manifest())
    (store.class_dir("mlp", "gateway-avx512") / HIGHWATER_NAME).write_text("many")
    with pytest.raises(ArtifactError, match="holds 'many', not a version number.*write that number into it"):
        publish(_new_inputs(make_manifest, make_inputs, 2))


def test_a_tarball_whose_manifest_differs_from_its_directory_is_repacked(store, publish, make_manifest, make_inputs):
    first = publish(make_manifest()).stored
    second = publish(_new_inputs(make_manifest, make_inputs, 2)).stored
    shutil.copyfile(second.tarball, first.tarball)  # a stale v1.tar.gz (say, from a reused number)
    publish(_new_inputs(make_manifest, make_inputs, 3))
    assert first.tarball.read_bytes() == pack_tarball(first.path)
    assert second.tarball.read_bytes() == pack_tarball(second.path)


def test_index_is_signed_and_verified(store, publish, make_manifest, make_inputs, keys, tmp_path, capsys):
    publish(make_manifest())
    publish(_new_inputs(make_manifest, make_inputs, 2))
    index = verify_index(store.root, keys[1])
    assert [(e.model, e.version) for e in index.versions] == [("mlp", 1), ("mlp", 2)]
    public = str(tmp_path / "keys" / "signing.pub")
    assert main(["verify", str(store.root), "--public-key", public]) == 0
    assert "index.json lists 2 versions" in capsys.readouterr().out

    data = (store.root / INDEX_NAME).read_bytes()
    (store.root / INDEX_NAME).write_bytes(data.replace(b'"version":2', b'"version":3'))
    with pytest.raises(VerificationError, match="index.json: signature does not match"):
        verify_index(store.root, keys[1])
    (store.root / INDEX_NAME).write_bytes(b'{"versions":' * 5000 + b"[]" + b"}" * 5000)
    assert main(["verify", str(store.root), "--public-key", public]) == 5
    err = capsys.readouterr().err
    assert "index.json: nested too deeply" in err and "Traceback" not in err


def test_version_copied_by_hand_is_left_out_of_the_index_and_named(store, publish, make_manifest, make_inputs, keys):
    v1 = publish(make_manifest()).stored
    shutil.copytree(v1.path, v1.path.with_name("v2"))  # v1 copied to v2
    publish(_new_inputs(make_manifest, make_inputs, 3))  # rewrites the index
    index = json.loads((store.root / INDEX_NAME).read_bytes())
    assert [e["version"] for e in index["versions"]] == [1, 3]
    with pytest.raises(VerificationError) as err:
        verify_index(store.root, keys[1])
    (problem,) = err.value.problems
    assert problem.startswith("mlp/gateway-avx512/v2: a version directory index.json does not list")
    (store.root / "mlp" / "gateway-avx512" / "v3" / MANIFEST_NAME).write_bytes(b"{}")
    shutil.rmtree(v1.path.with_name("v2"))
    with pytest.raises(VerificationError, match="v3/manifest.json: not the manifest index.json lists"):
        verify_index(store.root, keys[1])
