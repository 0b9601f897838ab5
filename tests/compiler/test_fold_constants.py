"""`fold_constants_with_numpy`: transposes, reshapes, concatenations and dequantizes of constants
folded with NumPy before Relax's FoldConstant would compile a kernel for each
(edgetune.compiler.relax.graph); the dequantized values checked against TVM's own dequantize."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

from edgetune.compiler.relax.graph import fold_constants_with_numpy

pytestmark = pytest.mark.tvm


def module_of(build) -> tvm.IRModule:
    """A module whose main returns `build(x)` of a parameter x (so not everything is constant)."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1,), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(build(x))
        builder.emit_func_output(out)
    return builder.get()


@st.composite
def moved(draw):
    """A constant of rank 2-4, transposed by a random permutation, flattened to rank 2 and
    concatenated with itself along a random axis: (the Relax expression, NumPy's value)."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=2, max_size=4)))
    value = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) * draw(st.floats(-3, 3, width=32))
    axes = draw(st.permutations(range(len(shape))))
    transposed = np.transpose(value, axes)
    flat = transposed.reshape(transposed.shape[0], -1)
    axis = draw(st.integers(0, 1))
    expected = np.concatenate([flat, flat], axis=axis)
    permuted = relax.op.permute_dims(relax.const(value), axes)
    return lambda: relax.op.concat([relax.op.reshape(permuted, flat.shape)] * 2, axis=axis), expected


@settings(max_examples=40, deadline=None)
@given(moved())
def test_moved_constants_fold_to_numpys_values(case):
    build, expected = case
    mod = module_of(lambda x: relax.Tuple([x, build()]))
    folded = relax.transform.DeadCodeElimination()(fold_constants_with_numpy(mod))
    text = folded.script()
    assert "R.permute_dims(" not in text and "R.reshape(" not in text and "R.concat(" not in text, text
    (constant,) = [f for f in _returned(folded) if isinstance(f, tvm.ir.GenericConst)]
    np.testing.assert_array_equal(constant.value.numpy(), expected)
    assert constant.value.numpy().dtype == np.float32


@st.composite
def dequantized(draw):
    """A dequantize of a constant int8 or uint8 weight of rank 0-4: one scale and zero point, or
    one per index of a random axis (negative axes as ONNX allows them)."""
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=4)))
    dtype = draw(st.sampled_from(["int8", "uint8"]))
    info = np.iinfo(dtype)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    q = rng.integers(info.min, info.max + 1, shape).astype(dtype)
    axis = draw(st.integers(-len(shape), len(shape) - 1)) if shape else 0
    count = shape[axis] if shape and draw(st.booleans()) else 1
    scale = (rng.random(count) * 10.0 ** draw(st.integers(-6, 1))).astype(np.float32)
    zero = rng.integers(info.min, info.max + 1, count).astype(dtype)
    return q, scale, zero, axis


@settings(max_examples=25, deadline=None)
@given(dequantized())
def test_a_dequantized_constant_folds_to_what_tvms_dequantize_computes(case):
    q, scale, zero, axis = case
    expr = lambda: relax.op.dequantize(relax.const(q), relax.const(scale), relax.const(zero), axis=axis)  # noqa: E731
    folded = relax.transform.DeadCodeElimination()(
        fold_constants_with_numpy(module_of(lambda x: relax.Tuple([x, expr()])))
    )
    assert "R.dequantize(" not in folded.script()
    (constant,) = [f for f in _returned(folded) if isinstance(f, tvm.ir.GenericConst)]
    computed = _run_legalized(module_of(lambda x: expr()))
    assert constant.value.numpy().dtype == np.float32
    np.testing.assert_array_equal(constant.value.numpy(), computed)


def _run_legalized(mod: tvm.IRModule) -> np.ndarray:
    """What TVM's own legalized dequantize computes, built and run (nothing folded)."""
    built = tvm.compile(relax.transform.LegalizeOps()(mod), target="llvm")
    return relax.VirtualMachine(built, tvm.cpu())["main"](tvm.runtime.tensor(np.zeros(1, np.float32))).numpy()


def test_a_move_of_a_computed_value_stays():
    mod = module_of(lambda x: relax.op.reshape(relax.op.add(x, relax.const(np.ones(1, np.float32))), (1, 1)))
    assert "R.reshape(" in fold_constants_with_numpy(mod).script()


def _returned(mod: tvm.IRModule) -> list:
    """The fields of the tuple main returns, each the value it is bound to."""
    bindings = {b.var: b.value for block in mod["main"].body.blocks for b in block.bindings}
    resolve = lambda expr: resolve(bindings[expr]) if expr in bindings else expr  # noqa: E731
    return [resolve(f) for f in resolve(mod["main"].body.body).fields]
