"""The emulated boards' root file systems: where they may live, and that removing one never
deletes through the /proc and /dev mounted into it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from edgetune.fleet import rootfs
from edgetune.fleet.errors import SimError


def test_a_root_below_a_world_writable_folder_is_refused_with_the_setting_to_change(tmp_path):
    with pytest.raises(SimError, match=r"is not owned by root or is writable by others.*set sim.cache"):
        rootfs.ensure_board_root(tmp_path / "root.tar", tmp_path / "boards" / "fleet-arm-1")


def test_removing_a_board_root_unmounts_first_and_keeps_what_was_mounted(tmp_path):
    host_dev = tmp_path / "host-dev"
    host_dev.mkdir()
    (host_dev / "keep-me").write_text("a file of the host")
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(host_dev), str(root / "dev")], check=True)
    try:
        assert (root / "dev" / "keep-me").exists()
        assert rootfs.remove_board_root(root)
    finally:
        subprocess.run(["umount", str(root / "dev")], capture_output=True)
    assert not root.exists()
    assert (host_dev / "keep-me").read_text() == "a file of the host"
    assert not rootfs.remove_board_root(root)  # nothing left to remove
