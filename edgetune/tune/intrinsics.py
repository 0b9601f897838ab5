"""Register only the CPU tensor intrinsics before MetaSchedule creates its tune contexts.

`TuneContext.__init__` imports the whole `tvm.s_tir.tensor_intrin` package, whose CUDA part
parses hundreds of TVMScript functions: 26 s alone here, over 80 s with two classes starting
at once. CPU schedule rules need only the x86, Arm and RISC-V intrinsics (about 4 s). This
installs the package as an empty namespace with just those submodules imported, so the
later full import is a no-op. Call it once per tuning process, before any TuneContext.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

PACKAGE = "tvm.s_tir.tensor_intrin"
CPU_MODULES = ("x86", "arm_cpu", "riscv_cpu")


def load_cpu_intrinsics() -> None:
    if PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(PACKAGE)
    package = types.ModuleType(PACKAGE, "CPU tensor intrinsics only (edgetune.tune.intrinsics)")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__package__ = PACKAGE
    sys.modules[PACKAGE] = package
    for name in CPU_MODULES:
        importlib.import_module(f"{PACKAGE}.{name}")
