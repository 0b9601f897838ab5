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


ARM_NEXT_TO_X86 = """\
version: 1
name: armfail-t{slot}
workdir: work
sim: {{bridge: etune-t{slot}, host_address: 10.231.{subnet}.1/24, cache: {cache}}}
trackers:
  - {{name: host, bind_host: 10.231.{subnet}.1, public_address: 10.231.{subnet}.1, port: {port}}}
ssh: {{user: root, key: work/sim/id_ed25519, known_hosts: work/known_hosts}}
device_classes:
  - {{name: x86, profile: {repo}/device_profiles/x86-avx512.yaml}}
  - {{name: arm, profile: {repo}/device_profiles/aarch64-qemu.yaml}}
boards:
  - {{name: x86-1, address: 10.231.{subnet}.11, device_class: x86, python: {python}, workdir: work/boards/x86-1, simulated: {{}}}}
  - {{name: arm-1, address: 10.231.{subnet}.31, device_class: arm, python: /opt/tvm/bin/python, workdir: /root/edgetune,
      simulated: {{arch: aarch64}}}}
models:
  - {{name: mlp, builtin: mlp, inputs: [{{name: x, shape: [1, 256]}}]}}
tuning: {{trials_per_class: 16}}
artifacts: {{dir: artifacts, signing_key: work/k, public_key: work/k.pub}}
"""


def test_an_arm_board_this_host_cannot_have_fails_alone_and_says_why(tmp_path, sim_slot):
    import sys

    from support.sim_checks import leftovers

    from edgetune.fleet import sim_down, sim_up
    from edgetune.inventory import load_fleet

    path = tmp_path / "fleet.yaml"
    path.write_text(
        ARM_NEXT_TO_X86.format(
            slot=sim_slot,
            subnet=9 + sim_slot,
            port=9290 + 10 * sim_slot,
            cache=tmp_path / "cache",
            repo=Path(__file__).resolve().parents[2],
            python=sys.executable,
        )
    )
    fleet = load_fleet(path)
    try:
        result = sim_up(fleet)
        assert list(result.succeeded) == ["x86-1"]
        # The first reason that applies to this host: qemu-user missing (no binfmt_misc entry), or
        # else the cache below a folder that sshd will not chroot under.
        qemu_registered = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists()
        reason = "set sim.cache" if qemu_registered else "qemu-user is not registered for aarch64"
        assert "arm-1" in result.failed and reason in str(result.failed["arm-1"])
        assert not list((tmp_path / "cache").glob("rootfs-*.tar"))  # nothing was built for it
    finally:
        assert sim_down(fleet).ok
    assert leftovers(fleet) == []
