"""edgetune's AVX-512 VNNI dot-product tensor intrinsic, in place of TVM's.

TVM 0.27 ships `tvm.s_tir.tensor_intrin.x86.VNNI_DOT_16x4_INTRIN` with an implementation that
its bundled LLVM rejects ("Call parameter type does not match function signature"): it passes
`llvm.x86.avx512.vpdpbusd.512` <16 x i32> operands, and LLVM now declares them <64 x i8>
(llvm/llvm-project#155194, fixing llvm/llvm-project#97271). No TVM issue found.

`VNNI_DOT` (registered when this module is imported): 16 int32 lanes, each accumulating the dot
product of 4 uint8 by 4 int8 values, as one `vpdpbusd`, passing the bytes. The description is
TVM's; it is written here rather than imported because importing `tvm.s_tir.tensor_intrin.x86`
imports all of TVM's intrinsics (edgetune.tvm_compat.tensor_intrin). Records name it, so every
process that loads a database that may hold them must import this module.
Test: tests/tvm_compat/test_vnni.py.
"""

# mypy: disable-error-code="valid-type"
# (TVMScript's buffer annotations are calls, which mypy does not take for types)

from __future__ import annotations

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

VNNI_DOT = "edgetune_dot_16x4_u8i8i32_vnni"


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
