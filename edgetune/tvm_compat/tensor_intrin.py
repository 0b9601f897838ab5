"""Loading one CPU architecture's tensor intrinsics without all of `tvm.s_tir.tensor_intrin`.

TVM 0.27: the package's `__init__` imports every architecture's module (CUDA's parses hundreds
of TVMScript functions: 25-80 s on these machines), so importing any one of them imports all,
and both `TuneContext.__init__` and LocalBuilder's default build import the whole package.
No upstream issue found (apache/tvm#12424 made the registration explicit, not lazy).

`load_only(architecture)` installs the package as an empty namespace and imports only
`tvm.s_tir.tensor_intrin.<architecture>` into it; the later full import is then a no-op.
Call it before anything imports the package (before the first TuneContext).
Test: tests/tvm_compat/test_tensor_intrin.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

PACKAGE = "tvm.s_tir.tensor_intrin"
ARCHITECTURES = ("x86", "arm_cpu", "riscv_cpu")


def load_only(architecture: str) -> None:
    """Register TVM's tensor intrinsics of `architecture` (one of ARCHITECTURES) only."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"CPU architecture {architecture!r}: TVM has tensor intrinsics for {ARCHITECTURES}")
    if PACKAGE not in sys.modules:
        spec = importlib.util.find_spec(PACKAGE)
        if spec is None or spec.submodule_search_locations is None:
            raise ImportError(f"this TVM has no package {PACKAGE}: edgetune needs apache-tvm 0.27")
        package = types.ModuleType(PACKAGE, "CPU tensor intrinsics only (edgetune.tvm_compat.tensor_intrin)")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        package.__package__ = PACKAGE
        sys.modules[PACKAGE] = package
    importlib.import_module(f"{PACKAGE}.{architecture}")
