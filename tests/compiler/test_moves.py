"""Kernels that only move values (`tir/moves.py`): an attention head's split and merge and a
transpose, scheduled in vectors of one register that read consecutive values, computing what
NumPy computes; a kernel that computes or gathers is left to MetaSchedule."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import s_tir, te, topi

from edgetune.compiler.tir.common import SCHEDULED
from edgetune.compiler.tir.moves import _moved, schedule_moves

pytestmark = pytest.mark.tvm

AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server", "num-cores": 2})  # compiled, never run
RUNS_HERE = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})  # any x86-64 host
LANES = 16
TOKENS, HEADS, HEAD = 8, 3, 32


def head_split() -> tvm.tirx.PrimFunc:
    """(1, 1, tokens, heads x head) -> (1, heads, tokens, head): reshape, then transpose."""
    x = te.placeholder((1, 1, TOKENS, HEADS * HEAD), name="x")
    split = topi.transpose(topi.reshape(x, (1, TOKENS, HEADS, HEAD)), (0, 2, 1, 3))
    return te.create_prim_func([x, split])


def head_merge() -> tvm.tirx.PrimFunc:
    """(1, heads, tokens, head) -> (1, 1, tokens, heads x head)."""
    x = te.placeholder((1, HEADS, TOKENS, HEAD), name="x")
    merged = topi.reshape(topi.transpose(x, (0, 2, 1, 3)), (1, 1, TOKENS, HEADS * HEAD))
    return te.create_prim_func([x, merged])


def run(func: tvm.tirx.PrimFunc, *inputs: np.ndarray) -> np.ndarray:
    lib = tvm.compile(tvm.IRModule({"main": func}), target=RUNS_HERE)
    out = func.params[-1]
    result = tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], out.dtype))
    lib.mod["main"](*[tvm.runtime.tensor(a) for a in inputs], result)
    return result.numpy()


def vector_extents(func: tvm.tirx.PrimFunc) -> list[int]:
    """The extents of the vectorized loops around the output's block."""
    sch = s_tir.Schedule(func)
    (block,) = sch.get_child_blocks(sch.get_sblock("root"))
    loops = [sch.get(loop) for loop in sch.get_loops(block)]
    return [int(loop.extent) for loop in loops if loop.kind == tvm.tirx.ForKind.VECTORIZED]


@pytest.mark.parametrize(
    "kernel, reference",
    [
        pytest.param(head_split, lambda x: x.reshape(1, TOKENS, HEADS, HEAD).transpose(0, 2, 1, 3), id="head split"),
        pytest.param(head_merge, lambda x: x.transpose(0, 2, 1, 3).reshape(1, 1, TOKENS, HEADS * HEAD), id="merge"),
    ],
)
def test_an_attention_heads_move_is_vectorized_by_register_and_moves_what_numpy_moves(kernel, reference):
    func = kernel()
    scheduled = _moved(func, LANES)
    assert scheduled is not None and scheduled.attrs[SCHEDULED]
    assert vector_extents(scheduled) == [LANES]
    assembly = tvm.compile(tvm.IRModule({"main": scheduled}), target=AVX512).mod.inspect_source("asm")
    assert "vinsertps" not in assembly  # whole vectors loaded, not built a lane at a time
    x = np.random.default_rng(0).standard_normal([int(d) for d in func.params[0].shape]).astype(np.float32)
    np.testing.assert_array_equal(run(scheduled, x), reference(x))


def test_a_row_shorter_than_a_register_is_one_vector():
    x = te.placeholder((4, 6, 24), name="x")
    func = te.create_prim_func([x, topi.transpose(x, (1, 0, 2))])
    scheduled = _moved(func, LANES)
    assert scheduled is not None and vector_extents(scheduled) == [24]  # not a multiple of 16: whole
    values = np.random.default_rng(1).standard_normal((4, 6, 24)).astype(np.float32)
    np.testing.assert_array_equal(run(scheduled, values), values.transpose(1, 0, 2))


@pytest.mark.parametrize(
    "kernel",
    [
        pytest.param(lambda x: topi.transpose(topi.add(x, 1.0), (0, 2, 1)), id="computes"),
        pytest.param(
            lambda x: topi.take(x, te.placeholder((1, 4), name="ids", dtype="int32"), axis=1),
            id="gathers: a task, measured with the indices in range",
        ),
    ],
)
def test_a_kernel_that_computes_or_gathers_is_left_to_metaschedule(kernel):
    x = te.placeholder((1, TOKENS, HEADS * HEAD), name="x")
    out = kernel(x)
    func = te.create_prim_func([x, *[t for t in out.op.input_tensors if t.name == "ids"], out])
    assert _moved(func, LANES) is None
    mod = tvm.IRModule({"main": func})
    assert schedule_moves(AVX512)(mod).same_as(mod)
