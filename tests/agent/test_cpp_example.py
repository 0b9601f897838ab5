"""The C++ example (examples/cpp: run_release.cc and its CMakeLists.txt) on a board image.

Built once per session with cmake and g++ against the board image's TVM wheel (tests/support/board_image.py:
nothing of edgetune, not the host's venv), with no RPATH, and run with an environment that has
nothing but the TVM runtime: LD_LIBRARY_PATH names one directory holding copies of the wheel's
libtvm_runtime.so and libtvm_ffi.so alone (no libtvm_compiler.so, no Python). It runs a release as
the agent installed it (`releases/mlp/current`, published, signed and installed like any), a copy
whose expected output was changed (it must fail, saying how), one whose library was cut short,
and a module with several outputs of the dtypes a release may use (expected output written by
numpy.savez itself, ZIP64 records and all).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from support.board_image import board_image
from support.fleet_marker import starts_fleet
from tvm.script import ir as I
from tvm.script import relax as R

from edgetune.artifact_format.reference import npz_bytes, read_npz

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cpp"
RUNTIME_LIBRARIES = ("libtvm_runtime.so", "libtvm_ffi.so")


@I.ir_module
class EveryDtype:
    """Three inputs, four outputs (a tuple) of the dtypes a release uses."""

    @R.function
    def main(a: R.Tensor((2, 3), "int8"), b: R.Tensor((3,), "float16"), c: R.Tensor((2, 3), "uint8")):
        return (
            R.add(R.astype(a, "float16"), b),
            R.astype(a, "int32"),
            R.greater(c, R.const(3, "uint8")),
            R.astype(c, "int64"),
        )


@dataclass(frozen=True)
class CppExample:
    program: Path
    libraries: Path  # the only directory on LD_LIBRARY_PATH: RUNTIME_LIBRARIES, nothing else

    def run(self, release: Path) -> subprocess.CompletedProcess:
        environment = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(self.libraries), "TVM_NUM_THREADS": "1"}
        return subprocess.run(
            [str(self.program), str(release)],
            env=environment,
            cwd=self.libraries.parent,
            capture_output=True,
            text=True,
            timeout=60,
        )


def _toolchain_or_skip() -> None:
    missing = [tool for tool in ("cmake", "g++") if shutil.which(tool) is None]
    if missing:
        if os.environ.get("CI"):  # CI installs them (Makefile: system-packages): a skip would hide that
            pytest.fail(f"CI has no {' and no '.join(missing)} to build examples/cpp")
        pytest.skip(f"cannot build examples/cpp: no {' and no '.join(missing)} (apt-get install cmake g++)")


def _run(argv: list[str], cwd: Path) -> None:
    done = subprocess.run(
        argv,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd)},
    )
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="session")
@starts_fleet  # a board image (made with pip when not cached) and a C++ build: not unit-level
def cpp_example(tmp_path_factory) -> CppExample:
    _toolchain_or_skip()
    image = board_image()
    (site_packages,) = image.glob("lib/python3*/site-packages")
    directory = tmp_path_factory.mktemp("cpp-example")
    build = directory / "build"
    _run(
        [
            "cmake",
            "-S",
            str(EXAMPLE),
            "-B",
            str(build),
            f"-DTVM_PYTHON={image / 'bin' / 'python'}",
            "-DRUN_RELEASE_RPATH=OFF",
        ],
        directory,
    )
    _run(["cmake", "--build", str(build)], directory)
    cache = (build / "CMakeCache.txt").read_text()
    assert f"TVM_RUNTIME_LIBRARY:FILEPATH={site_packages / 'tvm' / 'lib' / 'libtvm_runtime.so'}" in cache
    libraries = directory / "lib"
    libraries.mkdir()
    shutil.copy(site_packages / "tvm" / "lib" / "libtvm_runtime.so", libraries)
    shutil.copy(site_packages / "tvm_ffi" / "lib" / "libtvm_ffi.so", libraries)
    return CppExample(build / "run_release", libraries)


def test_the_program_needs_only_the_runtime_libraries(cpp_example):
    dynamic = subprocess.run(["readelf", "-d", str(cpp_example.program)], capture_output=True, text=True, check=True)
    needed = {line.split("[")[1].rstrip("]") for line in dynamic.stdout.splitlines() if "(NEEDED)" in line}
    assert {name for name in needed if "tvm" in name} == set(RUNTIME_LIBRARIES)
    assert "RPATH" not in dynamic.stdout and "RUNPATH" not in dynamic.stdout
    assert sorted(p.name for p in cpp_example.libraries.iterdir()) == sorted(RUNTIME_LIBRARIES)


def test_runs_an_installed_release_and_matches_its_expected_output(cpp_example, board_on):
    release = board_on(1) / "releases" / "mlp" / "current"
    assert release.is_symlink()

    done = cpp_example.run(release)

    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(
        "match: v1 forward(x): 1 output within rtol 0.0001 / atol 1e-05 of expected_output.npz (max |error| "
    ), done.stdout
    assert done.stdout.count("\n") == 1 and done.stderr == ""


def test_fails_when_the_expected_output_is_changed(cpp_example, board_on, tmp_path):
    release = tmp_path / "release"
    shutil.copytree(board_on(1) / "releases" / "mlp" / "current", release)
    expected = read_npz(release / "expected_output.npz")
    changed = npz_bytes({name: out + 1.0 for name, out in expected.items()})
    assert len(changed) == (release / "expected_output.npz").stat().st_size  # the manifest's size still holds
    (release / "expected_output.npz").write_bytes(changed)

    done = cpp_example.run(release)

    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == (
        "MISMATCH: v1 forward(x) does not match expected_output.npz: "
        "output0: max |error| 1 exceeds rtol 0.0001 / atol 1e-05\n"
    )


def test_refuses_a_library_cut_short(cpp_example, board_on, tmp_path):
    release = tmp_path / "release"
    shutil.copytree(board_on(1) / "releases" / "mlp" / "current", release)
    library = (release / "model.so").read_bytes()
    (release / "model.so").write_bytes(library[: len(library) // 2])

    done = cpp_example.run(release)

    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (
        f"error: {release.resolve()}/model.so is {len(library) // 2} bytes, the manifest lists {len(library)}\n"
    )


def test_outputs_of_every_dtype_a_release_uses(cpp_example, tmp_path):
    """Three inputs, four outputs (a tuple): float16, int32, bool, int64; expected_output.npz
    written by numpy.savez (ZIP64 records), the reference input by edgetune's writer."""
    import tvm
    from support.tests_samples import sample_manifest
    from tvm import relax

    from edgetune.artifact_format.manifest import Entry

    release = tmp_path / "release"
    release.mkdir()
    relax.build(EveryDtype, target="llvm").export_library(str(release / "model.so"))
    inputs = {
        "a": np.array([[1, -2, 3], [-128, 127, 0]], "int8"),
        "b": np.array([0.5, -1.25, 1e4], "float16"),
        "c": np.array([[1, 5, 200], [3, 4, 0]], "uint8"),
    }
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(release / "model.so")), tvm.cpu())
    outputs = {f"output{i}": out.numpy() for i, out in enumerate(vm["main"](*map(tvm.runtime.tensor, inputs.values())))}
    assert [out.dtype for out in outputs.values()] == [np.float16, np.int32, np.bool_, np.int64]
    manifest = replace(sample_manifest(), entry=Entry(function="main", inputs=("a", "b", "c")))
    (release / "manifest.json").write_bytes(manifest.to_bytes())
    (release / "reference_input.npz").write_bytes(npz_bytes(inputs))
    np.savez(release / "expected_output.npz", **outputs)

    done = cpp_example.run(release)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("match: main(a, b, c): 4 outputs within rtol 0.0001 / atol 1e-05"), done.stdout

    outputs["output0"][1, 2] += np.float16(8)  # 10000 -> 10008, the next float16
    outputs["output2"] = outputs["output2"][:1]
    np.savez(release / "expected_output.npz", **outputs)
    done = cpp_example.run(release)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == (
        "MISMATCH: main(a, b, c) does not match expected_output.npz: output0: max |error| 8 exceeds rtol 0.0001 / "
        "atol 1e-05; output2: shape (2, 3), expected (1, 3)\n"
    )
