"""edgetune.tvm_compat.vnni: TVM's VNNI dot-product intrinsic does not compile with its LLVM."""

from __future__ import annotations

import pytest
import tvm
from tvm.s_tir import TensorIntrin

from edgetune.tvm_compat.tensor_intrin import load_only
from edgetune.tvm_compat.vnni import VNNI_DOT

VNNI_TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server"})  # compiled only, never run


def compile_implementation(name: str) -> tvm.runtime.Executable:
    implementation = TensorIntrin.get(name).impl.with_attr("global_symbol", "main")
    return tvm.compile(tvm.IRModule({"main": implementation}), target=VNNI_TARGET)


@pytest.mark.xfail(
    strict=True, reason="TVM 0.27: its VNNI intrinsic passes vpdpbusd <16 x i32> operands, LLVM wants <64 x i8>"
)
def test_tvms_vnni_intrinsic_compiles():
    load_only("x86")
    from tvm.s_tir.tensor_intrin.x86 import VNNI_DOT_16x4_INTRIN

    compile_implementation(VNNI_DOT_16x4_INTRIN)


def test_edgetunes_vnni_intrinsic_compiles_to_vpdpbusd():
    assembly = compile_implementation(VNNI_DOT).mod.inspect_source("asm")
    assert "vpdpbusd" in assembly
