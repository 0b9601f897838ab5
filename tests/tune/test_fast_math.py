"""Sigmoid (and so SiLU) and softmax are legalized with TVM's fast_exp: no scalar libm `expf` call
is left in the kernels, and the values stay within float32 rounding of the exact functions."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from edgetune.inventory.schema import Model, ModelInput
from edgetune.tune.models import entry_function, load_model, reference_inputs
from edgetune.tune.prepare import build_untuned, prepare

from onnx_samples import save

HOST = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})
SHAPE = (1, 8, 16, 16)
# fast_exp's polynomial without FMA (x86-64-v2) was measured up to 5.1e-6 off the exact value (libm: 1.5e-7)
# where the result is tiny (below 1e-29); such values are compared absolutely, to ABSOLUTE_ERROR
RELATIVE_ERROR, ABSOLUTE_ERROR = 1e-5, 1e-20


def silu_model(path) -> Model:
    """conv 3x3 (8->8) + SiLU (Sigmoid and Mul), as YOLO-family detectors follow every convolution."""
    weight = np.random.default_rng(0).standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.3
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1] * 4),
        helper.make_node("Sigmoid", ["c"], ["s"]),
        helper.make_node("Mul", ["c", "s"], ["y"]),
    ]
    onnx = save(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(SHAPE))], [numpy_helper.from_array(weight, "w")])
    return Model("silu", (ModelInput("x", SHAPE),), onnx=onnx)


def one_node_model(path, op: str) -> Model:
    """`op` (Sigmoid, or Softmax over axis 1 as YOLOv8's box head has it) of one input."""
    nodes = [helper.make_node(op, ["x"], ["y"], **({"axis": 1} if op == "Softmax" else {}))]
    onnx = save(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(SHAPE))], [])
    return Model(op.lower(), (ModelInput("x", SHAPE),), onnx=onnx)


def built(model: Model):
    prepared = prepare(load_model(model), HOST)
    executable = build_untuned(prepared, HOST)
    return executable, relax.VirtualMachine(executable, tvm.cpu()), entry_function(prepared)


def test_the_silu_kernel_calls_no_libm_exp_and_answers_what_onnxruntime_answers(tmp_path):
    model = silu_model(tmp_path / "silu.onnx")
    executable, vm, entry = built(model)
    assembly = "".join(m.inspect_source("asm") for m in executable.mod.imports if m.kind == "llvm")
    assert "vfmadd" in assembly or "mulps" in assembly  # the kernel is in the library inspected
    assert "expf" not in assembly

    x = reference_inputs(model)["x"]
    ours = vm[entry](tvm.runtime.tensor(x)).numpy()
    theirs = ort.InferenceSession(str(model.onnx), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(ours, theirs, rtol=RELATIVE_ERROR, atol=1e-6)


@pytest.fixture(scope="module")
def sigmoid(tmp_path_factory):
    _, vm, entry = built(one_node_model(tmp_path_factory.mktemp("sigmoid") / "sigmoid.onnx", "Sigmoid"))
    return lambda x: vm[entry](tvm.runtime.tensor(x)).numpy()


@pytest.fixture(scope="module")
def softmax(tmp_path_factory):
    executable, vm, entry = built(one_node_model(tmp_path_factory.mktemp("softmax") / "softmax.onnx", "Softmax"))
    assert "expf" not in "".join(m.inspect_source("asm") for m in executable.mod.imports if m.kind == "llvm")
    return lambda x: vm[entry](tvm.runtime.tensor(x)).numpy()


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, SHAPE, elements=st.floats(-120, 120, width=32)))
def test_sigmoid_is_within_float32_rounding_of_the_exact_function_everywhere(sigmoid, x):
    exact = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    ours = sigmoid(x)
    assert np.all(np.isfinite(ours))
    np.testing.assert_allclose(ours, exact, rtol=RELATIVE_ERROR, atol=ABSOLUTE_ERROR)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, SHAPE, elements=st.floats(-120, 120, width=32)))
def test_softmax_is_within_float32_rounding_of_the_exact_function_everywhere(softmax, x):
    shifted = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    exact = shifted / shifted.sum(axis=1, keepdims=True)
    ours = softmax(x)
    assert np.all(np.isfinite(ours))
    np.testing.assert_allclose(ours, exact, rtol=RELATIVE_ERROR, atol=ABSOLUTE_ERROR)
