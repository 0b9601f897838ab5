"""edgetune.tvm_compat.tensor_intrin: TVM imports every architecture's tensor intrinsics at once."""

from __future__ import annotations

import pytest

from edgetune.tvm_compat.tensor_intrin import load_only

CUDA = "tvm.s_tir.tensor_intrin.cuda"  # the slow one (hundreds of TVMScript functions)

TUNE_CONTEXT = """
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms
a = te.placeholder((16,), name="a")
mod = tvm.IRModule({"main": te.create_prim_func([a, te.compute((16,), lambda i: a[i] + 1.0, name="b")])})
ms.TuneContext(mod, target=tvm.target.Target({"kind": "llvm", "num-cores": 1}), space_generator="post-order-apply", num_threads=1)
"""


@pytest.mark.xfail(strict=True, reason="TVM 0.27: importing one architecture's intrinsics imports all of them")
def test_one_architectures_intrinsics_import_alone(python_without):
    run = python_without("import tvm.s_tir.tensor_intrin.x86", [CUDA])
    assert run.returncode == 0, run.stderr[-800:]


@pytest.mark.xfail(strict=True, reason="TVM 0.27: TuneContext imports every architecture's intrinsics")
def test_a_tune_context_needs_no_other_architecture(python_without):
    run = python_without(TUNE_CONTEXT, [CUDA])
    assert run.returncode == 0, run.stderr[-800:]


def test_load_only_registers_one_architecture_and_a_tune_context_then_imports_no_more(python_without):
    code = """
from edgetune.tvm_compat.tensor_intrin import load_only
load_only("x86")
from tvm.s_tir import TensorIntrin
from tvm.s_tir.tensor_intrin.x86 import VNNI_DOT_16x4_INTRIN
TensorIntrin.get(VNNI_DOT_16x4_INTRIN)
"""
    run = python_without(code + TUNE_CONTEXT, [CUDA])
    assert run.returncode == 0, run.stderr[-800:]


def test_an_unknown_architecture_is_named():
    with pytest.raises(ValueError, match="'sparc'.*x86"):
        load_only("sparc")
