"""Moves carried below the element-wise operators and reductions after them
(`relax/moves_last.py`): a transformer's dense layers fuse their bias and GELU into the
pointwise convolution the rule takes, a transposed convolution's epilogue and pooling come
before its transpose, the models answer what onnxruntime (or the module before the pass)
answers, and a rewrite that would change a value is not made."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tvm
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from support.onnx_samples import save
from support.rule_tuning import assert_answers_like_onnxruntime, tune_briefly
from tvm import relax

from edgetune.compiler.models import load_model
from edgetune.compiler.prepare import extract_tasks, prepare
from edgetune.compiler.relax.graph import is_call
from edgetune.compiler.relax.moves_last import moves_last
from edgetune.compiler.tir.convolution import RULE
from edgetune.inventory.schema import Model, ModelInput

pytestmark = pytest.mark.tvm

HOST = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})
RNG = np.random.default_rng(5)
TOKENS, WIDTH, HIDDEN = 8, 32, 64


def _array(name: str, *shape: int, scale: float = 0.2) -> TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def _shape(name: str, *dims: int) -> TensorProto:
    return numpy_helper.from_array(np.array(dims, np.int64), name)


def write_feed_forward(path: Path) -> Path:
    """A transformer's feed-forward block as BERT's ONNX export writes it: the tokens reshaped
    to rows, dense layers with their bias added after the MatMul, GELU as x * (erf(x / sqrt 2)
    + 1) * 0.5, back to the tokens' shape, then the residual."""
    nodes = [
        helper.make_node("Reshape", ["x", "rows"], ["x2"]),
        helper.make_node("MatMul", ["x2", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Reshape", ["hb", "tokens_hidden"], ["h3"]),
        helper.make_node("Div", ["h3", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["h3", "e1"], ["m"]),
        helper.make_node("Mul", ["m", "half"], ["g"]),
        helper.make_node("Reshape", ["g", "hidden_rows"], ["g2"]),
        helper.make_node("MatMul", ["g2", "w2"], ["o"]),
        helper.make_node("Add", ["o", "b2"], ["ob"]),
        helper.make_node("Reshape", ["ob", "tokens"], ["o3"]),
        helper.make_node("Add", ["o3", "x"], ["y"]),
    ]
    constants = [
        _shape("rows", TOKENS, WIDTH),
        _shape("tokens_hidden", 1, TOKENS, HIDDEN),
        _shape("hidden_rows", TOKENS, HIDDEN),
        _shape("tokens", 1, TOKENS, WIDTH),
        _array("w1", WIDTH, HIDDEN),
        _array("b1", HIDDEN, scale=1.0),
        _array("w2", HIDDEN, WIDTH),
        _array("b2", WIDTH, scale=1.0),
        numpy_helper.from_array(np.array(2**0.5, np.float32), "sqrt2"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    return save(
        path,
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, TOKENS, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, TOKENS, WIDTH])],
        constants,
    )


def feed_forward(tmp_path: Path) -> Model:
    return Model(
        "feed-forward",
        (ModelInput("x", (1, TOKENS, WIDTH)),),
        onnx=write_feed_forward(tmp_path / "ffn.onnx"),
        layout="NHWC",
    )


def test_a_dense_layers_bias_and_gelu_are_computed_in_its_convolution_kernel(tmp_path):
    tasks = extract_tasks(prepare(load_model(feed_forward(tmp_path)), HOST), HOST)
    names = [task.task_name for task in tasks]
    convolutions = [task for task in tasks if "conv2d" in task.task_name]
    assert len(convolutions) == 2, names
    assert all(RULE in task.dispatched[0].script() for task in convolutions)
    assert all("add" in task.task_name for task in convolutions), names  # each with its bias
    assert [task.task_name for task in tasks if "erf" in task.task_name] == [
        next(task.task_name for task in convolutions if "erf" in task.task_name)
    ], names  # GELU in the first layer's kernel, nowhere else


def test_the_fused_kernels_tuned_answer_like_onnxruntime(tmp_path):
    model = feed_forward(tmp_path)
    prepared = prepare(load_model(model), HOST)
    convolutions = [task for task in extract_tasks(prepared, HOST) if "conv2d" in task.task_name]
    database = tune_briefly(convolutions, HOST, tmp_path)
    assert_answers_like_onnxruntime(model, prepared, database, HOST, tuned_tasks=2)


def _reshaped_operator(constant: np.ndarray) -> tvm.IRModule:
    """x (2 x 6) reshaped to 3 x 4, then added to `constant`."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 6), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            reshaped = builder.emit(relax.op.reshape(x, (3, 4)))
            out = builder.emit_output(relax.op.add(reshaped, relax.const(constant)))
        builder.emit_func_output(out)
    return builder.get()


def _added_to(mod: tvm.IRModule) -> relax.Expr:
    """What the add of `_reshaped_operator`'s module adds its constant to."""
    adds = []
    relax.analysis.post_order_visit(mod["main"], lambda e: adds.append(e) if is_call(e, "relax.add") else None)
    (add,) = adds
    bindings = {b.var: b.value for block in mod["main"].body.blocks for b in block.bindings}
    return bindings.get(add.args[0], add.args[0])


@pytest.mark.parametrize(
    "constant",
    [
        pytest.param(np.arange(4, dtype=np.float32), id="a row of the new last axis, which the source has not"),
        pytest.param(np.arange(3, dtype=np.float32).reshape(3, 1), id="a column"),
    ],
)
def test_a_constant_that_would_meet_other_values_keeps_the_reshape_first(constant):
    mod = moves_last()(_reshaped_operator(constant))
    assert is_call(_added_to(mod), "relax.reshape")


def test_a_row_along_the_kept_last_axis_moves_the_reshape_last():
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 1, 6, 4), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            reshaped = builder.emit(relax.op.reshape(x, (6, 4)))
            out = builder.emit_output(relax.op.add(reshaped, relax.const(np.arange(4, dtype=np.float32))))
        builder.emit_func_output(out)
    mod = moves_last()(builder.get())
    assert _added_to(mod).same_as(mod["main"].params[0])


def test_a_transposed_convolutions_bias_activation_and_pooling_are_computed_before_the_transpose():
    """Magika's pattern: a row convolution's NHWC output transposed back to channels-first, its
    bias, tanh and the max over its length after that: all carried before the transpose, which
    the max then leaves as a reshape of channels."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 1, 8, 16), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            moved = builder.emit(relax.op.reshape(relax.op.permute_dims(x, [0, 3, 1, 2]), (1, 16, 8)))
            biased = builder.emit(relax.op.add(moved, relax.const(np.arange(16, dtype=np.float32).reshape(16, 1))))
            pooled = builder.emit_output(relax.op.max(relax.op.tanh(biased), axis=[2], keepdims=True))
        builder.emit_func_output(pooled)
    mod = builder.get()
    carried = moves_last()(mod)
    calls = []
    relax.analysis.post_order_visit(
        carried["main"], lambda e: calls.append(e.op.name) if isinstance(e, relax.Call) else None
    )
    assert "relax.permute_dims" not in calls, carried.script()
    values = np.random.default_rng(2).standard_normal((1, 1, 8, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(carried, values), _run(mod, values), rtol=1e-6)


UNARY_OPS = {"erf": relax.op.erf, "tanh": relax.op.tanh, "sigmoid": relax.op.sigmoid, "negative": relax.op.negative}
BINARY_OPS = {
    "add": relax.op.add,
    "subtract": relax.op.subtract,
    "multiply": relax.op.multiply,
    "maximum": relax.op.maximum,
}
REDUCTIONS = {"max": relax.op.max, "sum": relax.op.sum, "mean": relax.op.mean}
SOURCE = (1, 2, 3, 4)
MOVES = (  # reshapes that keep the last axis and that do not, transposes, and both
    (("reshape", (6, 4)),),
    (("reshape", (4, 6)),),
    (("reshape", (2, 12)),),
    (("permute", (0, 3, 1, 2)),),
    (("permute", (0, 2, 3, 1)), ("reshape", (3, 8))),
    (("reshape", (2, 3, 4)), ("permute", (2, 0, 1))),
)


def _move(value: relax.Expr, move: tuple[str, tuple[int, ...]]) -> relax.Expr:
    kind, argument = move
    return relax.op.reshape(value, argument) if kind == "reshape" else relax.op.permute_dims(value, list(argument))


def _chain(moves, steps: list[tuple[str, str, int]], reduction: tuple[str, int, bool] | None) -> tvm.IRModule:
    """x (1x2x3x4) moved by `moves`, then each step: a unary operator, or a binary one with the
    previous value and a constant (a scalar, a row along the last axis, or a column along the
    one before) on either side, or with the first moved value again; then `reduction` (operator,
    axis, keepdims) or none."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SOURCE, "float32"))
    rng = np.random.default_rng(len(steps))
    with builder.function("main", [x]):
        with builder.dataflow():
            moved = x
            for move in moves:
                moved = builder.emit(_move(moved, move))
            shape = [int(d) for d in moved.ty.shape.values]
            column = [1] * len(shape)
            column[-2] = shape[-2]
            constants = {
                "scalar": np.float32(1.5),
                "row": rng.standard_normal(shape[-1]).astype(np.float32),
                "column": rng.standard_normal(column).astype(np.float32),
            }
            value = moved
            for op, operand, side in steps:
                if op in UNARY_OPS:
                    value = builder.emit(UNARY_OPS[op](value))
                    continue
                other = moved if operand == "moved" else relax.const(constants[operand])
                pair = (value, other) if side == 0 else (other, value)
                value = builder.emit(BINARY_OPS[op](*pair))
            if reduction is not None:
                op, axis, keepdims = reduction
                value = builder.emit(REDUCTIONS[op](value, axis=[axis % len(shape)], keepdims=keepdims))
            out = builder.emit_output(value)
        builder.emit_func_output(out)
    return builder.get()


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(relax.build(mod, tvm.target.Target("llvm")), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@settings(max_examples=12, deadline=None)
@given(
    st.sampled_from(MOVES),
    st.lists(
        st.tuples(
            st.sampled_from(sorted(UNARY_OPS) + sorted(BINARY_OPS)),
            st.sampled_from(["scalar", "row", "column", "moved"]),
            st.integers(0, 1),
        ),
        min_size=1,
        max_size=5,
    ),
    st.none() | st.tuples(st.sampled_from(sorted(REDUCTIONS)), st.integers(0, 3), st.booleans()),
)
@example(MOVES[3], [("add", "row", 0)], None)  # a constant placed back through a transpose
@example(MOVES[4], [("subtract", "column", 1), ("tanh", "scalar", 0)], ("max", 0, True))
def test_carrying_moves_last_never_changes_a_value(moves, steps, reduction):
    mod = _chain(moves, steps, reduction)
    x = np.random.default_rng(0).standard_normal(SOURCE).astype(np.float32)
    np.testing.assert_allclose(_run(moves_last()(mod), x), _run(mod, x), rtol=1e-5, atol=1e-5)
