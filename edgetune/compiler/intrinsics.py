"""The tensor intrinsics edgetune's kernels use: a target's CPU ones from TVM, registered
cheaply, and edgetune's VNNI dot product.

`VNNI_DOT`: the integer convolution rule (edgetune.compiler.tir.integer) tensorizes with it
(edgetune.tvm_compat.vnni: TVM's own does not compile with its LLVM).

`load_cpu_intrinsics(target)`: only TVM's tensor intrinsics for the target's CPU, before
MetaSchedule creates its tune contexts (edgetune.tvm_compat.tensor_intrin: TVM would import
every architecture's).
"""

from __future__ import annotations

import tvm

from edgetune.compiler.target import target_triple
from edgetune.tvm_compat.tensor_intrin import load_only
from edgetune.tvm_compat.vnni import VNNI_DOT

__all__ = ["VNNI_DOT", "load_cpu_intrinsics"]

CPU_MODULES = {"aarch64": "arm_cpu", "arm": "arm_cpu", "riscv": "riscv_cpu"}  # by triple prefix; else x86


def load_cpu_intrinsics(target: tvm.target.Target) -> None:
    triple = target_triple(target)
    load_only(next((m for prefix, m in CPU_MODULES.items() if triple.startswith(prefix)), "x86"))
