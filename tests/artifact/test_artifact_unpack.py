"""Unpacking a downloaded tarball: the signed manifest is read first and decides everything
else; bombs, unlisted, duplicate or oversized members are refused before a byte is written."""

from __future__ import annotations

import gzip
import io
import json
import tarfile

import pytest

from edgetune.artifact_format.files import UnpackLimits, pack_tarball, unpack_tarball
from edgetune.artifact_format.verify import VerificationError, verify_artifact
from edgetune.errors import ArtifactError

GIB = 1 << 30


@pytest.fixture
def v1(publish, make_manifest):
    return publish(make_manifest()).stored


def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mode = size, kind, 0o644
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def _member(name: str, data: bytes, kind: bytes = tarfile.REGTYPE) -> bytes:
    return _header(name, len(data), kind) + data + b"\0" * (-len(data) % 512)


def _head(v1) -> bytes:
    return _member("manifest.json", (v1.path / "manifest.json").read_bytes()) + _member(
        "manifest.sig", (v1.path / "manifest.sig").read_bytes()
    )


def _tarball(tmp_path, raw_tar: bytes, name: str = "v1.tar.gz"):
    path = tmp_path / name
    path.write_bytes(gzip.compress(raw_tar + b"\0" * 1024))
    return path


def _bytes_under(directory) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file()) if directory.exists() else 0


def _gzip_bomb(tmp_path, prefix: bytes, size: int):
    """`prefix` then `size` zero bytes (a multiple of 1 MiB), gzipped: about 1 KiB per MiB."""
    one_mib = gzip.compress(b"\0" * (1 << 20))
    path = tmp_path / "bomb.tar.gz"
    path.write_bytes(gzip.compress(prefix) + one_mib * (size >> 20))
    return path


def test_intact_tarball_unpacks_to_its_directory(v1, keys, tmp_path):
    dest = tmp_path / "out"
    assert unpack_tarball(v1.tarball, dest, keys[1]) == v1.manifest
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        "model.so",
        "report/summary.json",
    ]
    assert (dest / "model.so").read_bytes() == (v1.path / "model.so").read_bytes()
    with tarfile.open(v1.tarball) as tar:
        assert tar.getnames()[:2] == ["manifest.json", "manifest.sig"]


def test_gzip_bomb_member_is_refused_before_it_is_written(v1, keys, tmp_path):
    """A 1 MiB download whose model.so would expand to 1 GiB (the manifest says 12 bytes)."""
    bomb = _gzip_bomb(tmp_path, _head(v1) + _header("model.so", GIB), GIB)
    assert bomb.stat().st_size < 2 << 20
    dest = tmp_path / "out"
    with pytest.raises(ArtifactError, match=f"member 'model.so' is {GIB} bytes, manifest.json says 12; refused"):
        unpack_tarball(bomb, dest, keys[1])
    assert _bytes_under(dest) == 0
    with pytest.raises(VerificationError, match="refused before extracting it"):
        verify_artifact(bomb, keys[1])


def test_bomb_in_a_pax_header_stops_at_the_bytes_the_manifest_accounts_for(v1, keys, tmp_path):
    bomb = _gzip_bomb(tmp_path, _head(v1) + _header("model.so", GIB, tarfile.XHDTYPE), GIB)
    dest = tmp_path / "out"
    with pytest.raises(ArtifactError, match="holds more data than its manifest accounts for"):
        unpack_tarball(bomb, dest, keys[1])
    assert _bytes_under(dest) == 0


def test_manifest_claiming_a_huge_file_is_refused_by_signature_or_by_limits(v1, keys, tmp_path):
    raw = json.loads((v1.path / "manifest.json").read_bytes())
    raw["files"][0]["size"] = GIB
    forged = json.dumps(raw).encode()
    prefix = _member("manifest.json", forged) + _member("manifest.sig", (v1.path / "manifest.sig").read_bytes())
    bomb = _gzip_bomb(tmp_path, prefix + _header("model.so", GIB), GIB)
    dest = tmp_path / "out"
    with pytest.raises(ArtifactError, match="manifest.json: signature does not match"):
        unpack_tarball(bomb, dest, keys[1])
    with pytest.raises(ArtifactError, match=f"lists 2 files of {GIB + 14} bytes, more than allowed"):
        unpack_tarball(bomb, dest, limits=UnpackLimits(max_total_bytes=64 << 20))  # no key: limits hold
    assert _bytes_under(dest) == 0


def test_tampered_manifest_stops_verification_before_the_members(v1, keys, tmp_path):
    raw = json.loads((v1.path / "manifest.json").read_bytes())
    raw["boards"][0]["tuned"]["median_ms"] = 0.001
    prefix = _member("manifest.json", json.dumps(raw).encode()) + _member(
        "manifest.sig", (v1.path / "manifest.sig").read_bytes()
    )
    crafted = _tarball(tmp_path, prefix + _member("../../evil.sh", b"rm -rf /"))
    with pytest.raises(VerificationError) as err:
        verify_artifact(crafted, keys[1])
    assert err.value.problems == [
        "manifest.json: signature does not match the manifest's bytes (the manifest was modified after signing)"
    ]


@pytest.mark.parametrize(
    ("members", "wanted"),
    [
        ([("model.so", b"\x7fELF-library"), ("model.so", b"\x7fELF-library")], "member 'model.so' appears twice"),
        ([("backdoor.py", b"import os")], "member 'backdoor.py' is not listed in manifest.json"),
        ([("../model.so", b"\x7fELF-library")], "member '../model.so' is not listed"),
        ([("manifest.json", b"{}")], "member 'manifest.json' is not listed"),
    ],
)
def test_unlisted_duplicate_or_repeated_head_members_are_refused(v1, keys, tmp_path, members, wanted):
    crafted = _tarball(tmp_path, _head(v1) + b"".join(_member(n, d) for n, d in members))
    dest = tmp_path / "out"
    with pytest.raises(ArtifactError, match=wanted):
        unpack_tarball(crafted, dest, keys[1])
    assert not (dest / "backdoor.py").exists() and not (tmp_path / "model.so").exists()


def test_links_and_devices_are_refused_even_under_listed_names(v1, keys, tmp_path):
    link = tarfile.TarInfo("model.so")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    crafted = _tarball(tmp_path, _head(v1) + link.tobuf(format=tarfile.USTAR_FORMAT))
    with pytest.raises(ArtifactError, match="member 'model.so' is not a regular file"):
        unpack_tarball(crafted, tmp_path / "out", keys[1])


def test_modified_or_missing_member_is_named(v1, keys, tmp_path):
    crafted = _tarball(tmp_path, _head(v1) + _member("model.so", b"\x7fELF-librarx"))
    with pytest.raises(ArtifactError) as err:
        unpack_tarball(crafted, tmp_path / "out", keys[1])
    assert "model.so: sha256 is " in str(err.value)
    assert "report/summary.json: missing from the archive (listed in the manifest)" in str(err.value)


def test_tarball_not_starting_with_its_manifest_is_refused(v1, keys, tmp_path):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:  # names sorted, as older edgetune packed them
        for name in ("database/records.json", "manifest.json", "manifest.sig", "model.so"):
            tar.add(v1.path / name if name != "database/records.json" else v1.path / "model.so", arcname=name)
    legacy = tmp_path / "legacy.tar.gz"
    legacy.write_bytes(gzip.compress(raw.getvalue()))
    with pytest.raises(ArtifactError, match="must be manifest.json, found 'database/records.json'.*rebuild it"):
        unpack_tarball(legacy, tmp_path / "out", keys[1])


def test_existing_files_are_never_overwritten(v1, keys, tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "model.so").write_bytes(b"installed")
    with pytest.raises(ArtifactError, match="cannot write .*model.so .*File exists"):
        unpack_tarball(v1.tarball, dest, keys[1])
    assert (dest / "model.so").read_bytes() == b"installed"


def test_member_count_limit(v1, keys, tmp_path):
    with pytest.raises(ArtifactError, match="lists 2 files of 26 bytes, more than allowed \\(1 files"):
        unpack_tarball(v1.tarball, tmp_path / "out", keys[1], limits=UnpackLimits(max_members=1))


def test_store_tarball_is_what_pack_makes_of_its_directory(v1):
    assert pack_tarball(v1.path) == v1.tarball.read_bytes()
