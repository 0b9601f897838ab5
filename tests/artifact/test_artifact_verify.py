"""verify: intact artifacts pass; each kind of damage, and an artifact that is not what it
should be (another class, an old version renamed, a copy), is named precisely."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from edgetune.artifact_format.files import pack_tarball
from edgetune.artifact_format.signing import init_keys, load_public_key, sign
from edgetune.artifact_format.verify import Expected, VerificationError, verify_artifact
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


# --- what the artifact is: model, class, version, place in the store ------------------------


def _cli_verify(path, *flags):
    return main(["verify", str(path), "--public-key", str(path_of_public_key(path)), *flags])


def path_of_public_key(path):
    """The fixtures' public key: tmp_path/keys/signing.pub, tmp_path being above the store."""
    for parent in path.parents:
        if (parent / "keys" / "signing.pub").exists():
            return parent / "keys" / "signing.pub"
    raise AssertionError(f"no key above {path}")


def test_artifact_for_another_class_or_model_or_too_old_is_refused(v1, keys):
    for expect, wanted in (
        (Expected(device_class="gateway-avx2"), "built for device class 'gateway-avx512', expected 'gateway-avx2'"),
        (Expected(model="resnet"), "built for model 'mlp', expected 'resnet'"),
        (Expected(min_version=2), "version 1, expected v2 or newer"),
    ):
        for path in (v1.path, v1.tarball):
            with pytest.raises(VerificationError) as err:
                verify_artifact(path, keys[1], expect)
            (problem,) = err.value.problems
            assert wanted in problem
    matching = Expected(model="mlp", device_class="gateway-avx512", min_version=1)
    assert verify_artifact(v1.tarball, keys[1], matching) == v1.manifest


def test_cli_flags_name_what_was_expected_and_what_the_manifest_says(v1, capsys):
    assert _cli_verify(v1.tarball, "--model", "mlp", "--class", "gateway-avx512", "--min-version", "1") == 0
    assert "in its place mlp/gateway-avx512/v1" in capsys.readouterr().out
    assert _cli_verify(v1.tarball, "--class", "rpi4") == 5
    assert "built for device class 'gateway-avx512', expected 'rpi4'" in capsys.readouterr().err
    assert _cli_verify(v1.path, "--min-version", "0") == 5
    assert "minimum version must be a whole number >= 1" in capsys.readouterr().err


def test_old_version_renamed_as_newer_or_copied_is_refused_by_its_path(publish, make_manifest, make_inputs, capsys):
    v1 = publish(make_manifest()).stored
    publish(make_manifest(make_inputs(database_sha256="f" * 64)))
    class_dir = v1.path.parent
    shutil.copytree(v1.path, class_dir / "v3")  # v1 offered as v3
    shutil.copyfile(v1.tarball, class_dir / "v3.tar.gz")
    os.replace(class_dir / "v2.tar.gz", class_dir / "v2.tar.gz.orig")
    shutil.copyfile(v1.tarball, class_dir / "v2.tar.gz")  # v1 copied over v2's tarball
    for path in (class_dir / "v3", class_dir / "v3.tar.gz", class_dir / "v2.tar.gz"):
        assert _cli_verify(path) == 5, path
        err = capsys.readouterr().err
        assert f"is mlp/gateway-avx512/v1, but it is stored as mlp/gateway-avx512/{path.name[:2]}" in err
    assert _cli_verify(v1.tarball) == 0


def test_outside_a_store_the_path_says_nothing(v1, tmp_path, capsys):
    """A download directory is not a store: `<board>/<model>/v7.tar.gz` is no claim."""
    download = tmp_path / "pulled" / "board-1" / "mlp"
    download.mkdir(parents=True)
    shutil.copyfile(v1.tarball, download / "v7.tar.gz")
    assert _cli_verify(download / "v7.tar.gz") == 0
    assert _cli_verify(download / "v7.tar.gz", "--model", "mlp", "--min-version", "7") == 5
    assert "version 1, expected v7 or newer" in capsys.readouterr().err


# --- the directory holds exactly the listed files ------------------------------------------


def test_links_fifos_and_unlisted_directories_are_refused(v1, keys, tmp_path):
    outside = tmp_path / "outside.so"
    outside.write_bytes((v1.path / "model.so").read_bytes())
    (v1.path / "model.so").unlink()
    (v1.path / "model.so").symlink_to(outside)  # same bytes, but not a file of the artifact
    (v1.path / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(v1.path / "report" / "pipe")
    (v1.path / "empty" / "deeper").mkdir(parents=True)
    assert _problems(v1.path, keys[1]) == [
        "model.so: a symlink, not the regular file the manifest lists",
        "dangling: a symbolic link (not allowed in an artifact)",
        "empty/: a directory that holds no listed file (not allowed in an artifact)",
        "empty/deeper/: a directory that holds no listed file (not allowed in an artifact)",
        "report/pipe: a fifo (not allowed in an artifact)",
    ]


def test_a_linked_directory_is_not_followed(v1, keys, tmp_path):
    shutil.move(v1.path / "report", tmp_path / "report")
    (v1.path / "report").symlink_to(tmp_path / "report")
    assert _problems(v1.path, keys[1]) == [
        "report/summary.json: missing (listed in the manifest)",
        "report: a symbolic link (not allowed in an artifact)",
    ]


def test_manifest_listing_a_path_outside_the_artifact_is_refused(v1, keys):
    raw = json.loads((v1.path / "manifest.json").read_bytes())
    raw["files"][0]["path"] = "../../etc/passwd"
    data = json.dumps(raw).encode()
    (v1.path / "manifest.json").write_bytes(data)
    (v1.path / "manifest.sig").write_bytes(sign(keys[0], data).to_bytes())  # even if signed
    problems = _problems(v1.path, keys[1])
    assert "manifest.json: '../../etc/passwd': not a normalized relative path inside the artifact" in problems


# --- crafted manifests and signatures: exit 5 naming the file, never a traceback ------------


@pytest.mark.parametrize(
    ("name", "content", "wanted"),
    [
        ("manifest.json", b"[" * 100_000 + b"]" * 100_000, "manifest.json: nested too deeply"),
        ("manifest.sig", b'{"a":' * 10_000 + b"1" + b"}" * 10_000, "manifest.sig: nested too deeply"),
        ("manifest.sig", b" " * 100_000, "manifest.sig: 100000 bytes, more than the 65536 allowed"),
        ("manifest.json", b'{"schema": NaN}', "manifest.json: NaN is not a number JSON allows"),
        ("manifest.json", b'{"schema": 1e999}', "manifest.json: 1e999 is too large"),
        ("manifest.sig", b'{"algorithm": "\xff"}', "manifest.sig: not UTF-8 text"),
        ("manifest.json", "{}".encode("utf-16"), "manifest.json: not UTF-8 text"),
    ],
)
def test_crafted_json_is_a_named_error(v1, capsys, name, content, wanted):
    for path in (v1.path, v1.tarball):
        (v1.path / name).write_bytes(content)
        if path == v1.tarball:
            path.write_bytes(pack_tarball(v1.path))
        assert _cli_verify(path) == 5
        err = capsys.readouterr().err
        assert wanted in err and "Traceback" not in err
