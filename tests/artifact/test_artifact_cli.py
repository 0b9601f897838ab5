"""CLI of keys and build: key creation and its guards, build's early errors (before any work)."""

from __future__ import annotations

import stat

from edgetune.cli import main


def test_keys_init_then_refuse_then_if_missing(fleet_file, capsys):
    key = fleet_file.parent / "work" / "keys" / "signing.key"
    assert main(["keys", "init", "-f", str(fleet_file)]) == 0
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert (fleet_file.parent / "work" / "keys" / "signing.pub").exists()
    first = key.read_bytes()
    assert main(["keys", "init", "-f", str(fleet_file)]) == 5
    assert "already exists" in capsys.readouterr().err
    assert main(["keys", "init", "-f", str(fleet_file), "--if-missing"]) == 0
    assert key.read_bytes() == first
    assert main(["keys", "init", "-f", str(fleet_file), "--force"]) == 0
    assert key.read_bytes() != first


def test_build_without_signing_key_says_keys_init(fleet_file, capsys):
    assert main(["build", "-f", str(fleet_file)]) == 5
    assert "run `edgetune keys init`" in capsys.readouterr().err


def test_build_with_unwritable_artifacts_dir(fleet_file, capsys):
    (fleet_file.parent / "artifacts").write_text("a file where the directory should be")
    assert main(["build", "-f", str(fleet_file)]) == 5
    assert "not writable" in capsys.readouterr().err


def test_build_unknown_class(fleet_file, capsys):
    assert main(["build", "-f", str(fleet_file), "--class", "rpi9"]) == 5
    assert "unknown device class rpi9 (known: gw-fast)" in capsys.readouterr().err
