"""Reshapes below the element-wise operators after them (`relax/reshapes.py`): a transformer's
dense layers fuse their bias and GELU into the pointwise convolution the rule takes, the model
answers what onnxruntime answers, and a rewrite that would change a value is not made."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from support.onnx_samples import save
from support.rule_tuning import assert_answers_like_onnxruntime, tune_briefly
from tvm import relax

from edgetune.compiler.models import load_model
from edgetune.compiler.prepare import extract_tasks, prepare
from edgetune.compiler.relax.graph import is_call
from edgetune.compiler.relax.reshapes import reshapes_last
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
    mod = reshapes_last()(_reshaped_operator(constant))
    assert is_call(_added_to(mod), "relax.reshape")


def test_a_row_along_the_kept_last_axis_moves_the_reshape_last():
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 1, 6, 4), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            reshaped = builder.emit(relax.op.reshape(x, (6, 4)))
            out = builder.emit_output(relax.op.add(reshaped, relax.const(np.arange(4, dtype=np.float32))))
        builder.emit_func_output(out)
    mod = reshapes_last()(builder.get())
    assert _added_to(mod).same_as(mod["main"].params[0])


UNARY_OPS = {"erf": relax.op.erf, "tanh": relax.op.tanh, "sigmoid": relax.op.sigmoid, "negative": relax.op.negative}
BINARY_OPS = {
    "add": relax.op.add,
    "subtract": relax.op.subtract,
    "multiply": relax.op.multiply,
    "maximum": relax.op.maximum,
}
SOURCE = (1, 2, 3, 4)
RESHAPED = ((6, 4), (4, 6), (2, 12))  # the last axis kept, and not


def _chain(reshaped: tuple[int, int], steps: list[tuple[str, str, int]]) -> tvm.IRModule:
    """x (1x2x3x4) reshaped to `reshaped`, then each step: a unary operator, or a binary one with
    the previous value and a constant (a scalar, a row, or a column) on either side, or with the
    first reshaped value again; the last value reshaped back."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SOURCE, "float32"))
    rng = np.random.default_rng(len(steps))
    constants = {
        "scalar": np.float32(1.5),
        "row": rng.standard_normal(reshaped[-1]).astype(np.float32),
        "column": rng.standard_normal((reshaped[0], 1)).astype(np.float32),
    }
    with builder.function("main", [x]):
        with builder.dataflow():
            first = value = builder.emit(relax.op.reshape(x, reshaped))
            for op, operand, side in steps:
                if op in UNARY_OPS:
                    value = builder.emit(UNARY_OPS[op](value))
                    continue
                other = first if operand == "reshaped" else relax.const(constants[operand])
                pair = (value, other) if side == 0 else (other, value)
                value = builder.emit(BINARY_OPS[op](*pair))
            out = builder.emit_output(relax.op.reshape(value, SOURCE))
        builder.emit_func_output(out)
    return builder.get()


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(relax.build(mod, tvm.target.Target("llvm")), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@settings(max_examples=8, deadline=None)
@given(
    st.sampled_from(RESHAPED),
    st.lists(
        st.tuples(
            st.sampled_from(sorted(UNARY_OPS) + sorted(BINARY_OPS)),
            st.sampled_from(["scalar", "row", "column", "reshaped"]),
            st.integers(0, 1),
        ),
        min_size=1,
        max_size=5,
    ),
)
def test_moving_reshapes_last_never_changes_a_value(reshaped, steps):
    mod = _chain(reshaped, steps)
    x = np.random.default_rng(0).standard_normal(SOURCE).astype(np.float32)
    np.testing.assert_allclose(_run(reshapes_last()(mod), x), _run(mod, x), rtol=1e-6, atol=1e-6)
