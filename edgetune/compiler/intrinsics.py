"""The tensor intrinsics edgetune's kernels use, and TVM's CPU ones only, registered cheaply.

`VNNI_DOT` (edgetune's, registered when this module is imported): 16 int32 lanes, each
accumulating the dot product of 4 uint8 by 4 int8 values, as one AVX-512 VNNI `vpdpbusd`; the
integer convolution rule (edgetune.compiler.schedule_rules.integer) tensorizes with it. Its records
name it, so every process that loads a class database or applies one must have it registered:
edgetune.tune.database imports this module. TVM 0.27 ships the same description
(`tvm.s_tir.tensor_intrin.x86.VNNI_DOT_16x4_INTRIN`) with an implementation that its LLVM 22
rejects: `llvm.x86.avx512.vpdpbusd.512` takes <64 x i8> operands and it passes <16 x i32>
("Call parameter type does not match function signature"); this one passes the bytes. It is
written here rather than imported, because importing any part of `tvm.s_tir.tensor_intrin`
imports all of it (below).

`load_cpu_intrinsics(target)`: only TVM's tensor intrinsics for the target's CPU, before
MetaSchedule creates its tune contexts.

`TuneContext.__init__` imports the whole `tvm.s_tir.tensor_intrin` package, whose CUDA part
parses hundreds of TVMScript functions: 26 s alone here, over 80 s with two classes starting
at once. A CPU's schedule rules need only its own architecture's intrinsics (x86 0.15 s, Arm
1.1 s, RISC-V none to speak of). This installs the package as an empty namespace and imports
the target's submodule into it, so the later full import is a no-op. Call it before any
TuneContext of the target is made.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import tvm
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from edgetune.compiler.target import target_triple

VNNI_DOT = "edgetune_dot_16x4_u8i8i32_vnni"
PACKAGE = "tvm.s_tir.tensor_intrin"
CPU_MODULES = {"aarch64": "arm_cpu", "arm": "arm_cpu", "riscv": "riscv_cpu"}  # by triple prefix; else x86


def load_cpu_intrinsics(target: tvm.target.Target) -> None:
    if PACKAGE not in sys.modules:
        spec = importlib.util.find_spec(PACKAGE)
        package = types.ModuleType(PACKAGE, "CPU tensor intrinsics only (edgetune.compiler.intrinsics)")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        package.__package__ = PACKAGE
        sys.modules[PACKAGE] = package
    triple = target_triple(target)
    module = next((m for prefix, m in CPU_MODULES.items() if triple.startswith(prefix)), "x86")
    importlib.import_module(f"{PACKAGE}.{module}")


@T.prim_func(s_tir=True)
def _dot_16x4_description(
    A: T.Buffer((4,), "uint8", offset_factor=1),
    B: T.Buffer((16, 4), "int8", offset_factor=1),
    C: T.Buffer((16,), "int32", offset_factor=1),
) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:4], B[0:16, 0:4])
        T.writes(C[0:16])
        for i in T.serial(0, 16):
            for k in T.serial(0, 4):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")


@T.prim_func(s_tir=True)
def _dot_16x4_vnni(
    A: T.Buffer((4,), "uint8", offset_factor=1),
    B: T.Buffer((16, 4), "int8", offset_factor=1),
    C: T.Buffer((16,), "int32", offset_factor=1),
) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:4], B[0:16, 0:4])
        T.writes(C[0:16])
        four_inputs = T.reinterpret(A.vload([0], "uint8x4"), dtype="int32")
        C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
            C.vload([0], dtype="int32x16"),
            T.reinterpret(T.broadcast(four_inputs, 16), dtype="uint8x64"),
            B.vload([0, 0], dtype="int8x64"),
            dtype="int32x16",
        )


TensorIntrin.register(VNNI_DOT, _dot_16x4_description, _dot_16x4_vnni, override=True)
