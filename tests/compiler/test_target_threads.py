"""A class's target `num-cores` is its runtime threads: taken from them where the profile leaves
it out, refused with the file and both fields named where it says something else."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgetune.compiler.target import build_target
from edgetune.errors import InventoryError
from edgetune.inventory import load_profile

pytestmark = pytest.mark.tvm

REPO = Path(__file__).resolve().parents[2]
PROFILE = """version: 1
name: gw
target: {{kind: llvm, mcpu: x86-64-v3{cores}}}
cross_compiler: host
runtime:
  threads: {threads}
firmware_command: uname -r
"""


def profile(tmp_path: Path, threads: int, cores: int | None = None):
    path = tmp_path / "gw.yaml"
    path.write_text(PROFILE.format(threads=threads, cores="" if cores is None else f", num-cores: {cores}"))
    return load_profile(path)


def test_num_cores_left_out_is_the_runtime_threads(tmp_path):
    assert build_target(profile(tmp_path, threads=2)).attrs["num-cores"] == 2


def test_num_cores_equal_to_the_runtime_threads_is_accepted(tmp_path):
    assert build_target(profile(tmp_path, threads=4, cores=4)).attrs["num-cores"] == 4


def test_num_cores_other_than_the_runtime_threads_is_refused(tmp_path):
    with pytest.raises(InventoryError) as raised:
        build_target(profile(tmp_path, threads=2, cores=1))
    message = str(raised.value)
    assert "gw.yaml: target.num-cores: 1 disagrees with runtime.threads: 2" in message
    assert "leave num-cores out" in message


@pytest.mark.parametrize("path", sorted((REPO / "device_profiles").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_profile_tunes_for_its_runtime_threads(path):
    shipped = load_profile(path)
    assert build_target(shipped).attrs["num-cores"] == shipped.runtime_threads
