"""edgetune.tvm_compat.ffi_pin: apache-tvm admits the apache-tvm-ffi release that breaks it."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from edgetune.tvm_compat.ffi_pin import BROKEN_TVM_FFI, TVM_FFI_PIN

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def tvms_ffi_requirement() -> Requirement:
    return next(r for r in map(Requirement, metadata.requires("apache-tvm")) if r.name == "apache-tvm-ffi")


@pytest.mark.xfail(
    strict=True, reason="TVM 0.27: apache-tvm asks for apache-tvm-ffi>=0.1.14.post0, with no upper bound"
)
def test_apache_tvm_excludes_the_ffi_release_that_breaks_it():
    assert BROKEN_TVM_FFI not in tvms_ffi_requirement().specifier


def test_edgetune_pins_the_ffi_release_that_works_and_it_is_installed():
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    assert f"apache-tvm-ffi=={TVM_FFI_PIN}" in dependencies
    assert metadata.version("apache-tvm-ffi") == TVM_FFI_PIN
