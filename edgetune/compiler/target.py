"""TVM targets of the device profiles, checked once when the inventory is loaded."""

from __future__ import annotations

import shutil

import tvm
from tvm.target import codegen

from edgetune.errors import InventoryError
from edgetune.inventory.reader import display_path
from edgetune.inventory.schema import DeviceProfile, Fleet

NUM_CORES = "num-cores"
CROSS_COMPILER_PACKAGES = {"aarch64-linux-gnu-gcc": "gcc-aarch64-linux-gnu libc6-dev-arm64-cross"}


def target_triple(target: tvm.target.Target) -> str:
    """The LLVM triple code is generated for: the target's `mtriple`, else this host's."""
    return str(target.attrs.get("mtriple", "")) or codegen.llvm_get_system_triple()


def build_target(profile: DeviceProfile) -> tvm.target.Target:
    """The profile's `target` JSON dict as a TVM target, its `num-cores` the profile's runtime
    threads (`target_options`); InventoryError if TVM rejects it.

    TVM itself accepts any `mcpu` (LLVM only warns and falls back to a baseline CPU, which
    silently gives slow code), so the CPU name is checked against LLVM's list as well."""
    where = f"{display_path(profile.path)}: target"
    options = target_options(profile)
    try:
        target = tvm.target.Target(options)
    except Exception as err:  # TVM raises ValueError, TypeError or its own FFI errors
        raise InventoryError(f"{where}: TVM rejects {options}: {err}") from None
    mcpu = profile.target.get("mcpu")
    if target.kind.name == "llvm" and mcpu:
        triple = profile.target.get("mtriple") or codegen.llvm_get_system_triple()
        if not codegen.llvm_is_valid_cpu(mcpu, triple):
            raise InventoryError(f"{where}.mcpu: '{mcpu}' is not a CPU LLVM knows for {triple}")
    return target


def target_options(profile: DeviceProfile) -> dict:
    """The profile's target options with `num-cores` set to its `runtime.threads`: MetaSchedule
    sizes the parallel loops it tunes by `num-cores`, and the board runs them on that many
    threads. A `num-cores` the profile gives must equal `runtime.threads` (InventoryError)."""
    options = profile.target_json()
    threads = profile.runtime_threads
    cores = options.setdefault(NUM_CORES, threads)
    if cores != threads:
        raise InventoryError(
            f"{display_path(profile.path)}: target.{NUM_CORES}: {cores} disagrees with runtime.threads: {threads}; "
            f"kernels are tuned for the threads the board runs them with: set both to the same count, or leave "
            f"{NUM_CORES} out (it is runtime.threads)"
        )
    return options


def check_targets(fleet: Fleet) -> None:
    """Build the target of every device class, so that a bad profile fails before anything runs."""
    for device_class in fleet.device_classes:
        build_target(device_class.profile)


def missing_cross_compiler(profile: DeviceProfile) -> str | None:
    """Why libraries for `profile` cannot be linked on this host (None: they can)."""
    compiler = profile.cross_compiler
    if compiler is None or shutil.which(compiler) is not None:
        return None
    package = CROSS_COMPILER_PACKAGES.get(compiler)
    how = f" (Debian: apt-get install {package}, or `make arm-packages`)" if package else ""
    return (
        f"{display_path(profile.path)}: cross_compiler: '{compiler}' is not installed on this host, so no library "
        f"can be linked for profile '{profile.name}'; install it{how}"
    )
