"""`models[].layout: NHWC`: the convolutions are compiled channels-last, each keeps its fused
activation (Clip and HardSwish included) and the element-wise operators with constants between
them, and the model answers what onnxruntime (or NumPy) answers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper, numpy_helper
from support.onnx_samples import conv_model, save, write_separable_block
from support.prepared import kernel_names
from tvm import relax

from edgetune.compiler.models import (
    entry_function,
    load_model,
    reference_inputs,
    reference_outputs,
)
from edgetune.compiler.prepare import build_untuned, prepare
from edgetune.inventory.schema import Model, ModelInput

pytestmark = pytest.mark.tvm

HOST = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})


def separable(tmp_path, layout: str) -> Model:
    return Model(
        "separable",
        (ModelInput("image", (1, 3, 32, 32)),),
        onnx=write_separable_block(tmp_path / "separable.onnx"),
        layout=layout,
    )


def kernels(model: Model) -> list[str]:
    """The names of the prepared model's kernels, those `prepare` scheduled (no task) included."""
    return kernel_names(prepare(load_model(model), HOST))


def test_nhwc_keeps_each_activation_with_its_convolution_and_transposes_only_at_the_ends(tmp_path):
    nchw, nhwc = kernels(separable(tmp_path, "NCHW")), kernels(separable(tmp_path, "NHWC"))
    assert not any("transpose" in name for name in nchw)
    assert sum("transpose" in name for name in nhwc) == 2, nhwc  # the input's and the output's
    assert all("transpose" not in name for name in nhwc if "conv2d" in name), nhwc
    assert sum("conv2d" in name for name in nhwc) == sum("conv2d" in name for name in nchw) == 3
    convolutions = _conv_calls(load_model(separable(tmp_path, "NHWC")))
    assert len(convolutions) == 3 and {str(c.attrs.data_layout) for c in convolutions} == {"NHWC"}


def _conv_calls(mod: tvm.IRModule) -> list[relax.Call]:
    calls = []
    relax.analysis.post_order_visit(
        mod[entry_function(mod)],
        lambda e: calls.append(e) if isinstance(e, relax.Call) and e.op == tvm.ir.Op.get("relax.nn.conv2d") else None,
    )
    return calls


def test_nhwc_model_answers_what_onnxruntime_answers(tmp_path):
    model = separable(tmp_path, "NHWC")
    inputs = reference_inputs(model)
    prepared = prepare(load_model(model), HOST)
    vm = relax.VirtualMachine(build_untuned(prepared, HOST), tvm.cpu())
    got = vm[entry_function(prepared)](tvm.runtime.tensor(inputs["image"])).numpy()
    expected = reference_outputs(model, inputs)[0]
    assert got.shape == expected.shape == (1, 32, 1, 1)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert float(np.abs(expected).max()) > 0.1  # the activations did not zero everything


def test_nchw_is_the_layout_the_graph_has(tmp_path):
    model = dataclasses.replace(conv_model(tmp_path / "conv.onnx"), layout="NCHW")
    assert {str(c.attrs.data_layout) for c in _conv_calls(load_model(model))} == {"NCHW"}
    assert {str(c.attrs.data_layout) for c in _conv_calls(load_model(dataclasses.replace(model, layout="NHWC")))} == {
        "NHWC"
    }


# A binary operator with a constant between two NHWC convolutions: the constants TVM's layout
# rule stops at (lower rank, or first) are reshaped or moved so that the operator stays NHWC.
CHANNELS, HEIGHT, WIDTH = 4, 3, 5
BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Max": np.maximum, "Min": np.minimum}


@st.composite
def broadcast_constants(draw) -> np.ndarray:
    """A constant that broadcasts against (1, C, H, W): its trailing dimensions each 1 or the tensor's."""
    rank = draw(st.integers(1, 4))
    full = (1, CHANNELS, HEIGHT, WIDTH)[4 - rank :]
    shape = tuple(draw(st.sampled_from([1, dim])) for dim in full)
    return draw(hnp.arrays(np.float32, shape, elements=st.floats(0.5, 2.0, width=32)))


@settings(max_examples=20, deadline=None)
@given(operator=st.sampled_from(sorted(BINARY)), constant=broadcast_constants(), constant_first=st.booleans())
def test_a_constant_broadcast_between_nhwc_convolutions_gives_numpy_values_without_transposes(
    tmp_path_factory, operator, constant, constant_first
):
    rng = np.random.default_rng(3)
    w1, w2 = (rng.standard_normal((CHANNELS, CHANNELS, 1, 1)).astype(np.float32) for _ in range(2))
    operands = ["k", "c1"] if constant_first else ["c1", "k"]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"]),
        helper.make_node(operator, operands, ["b"]),
        helper.make_node("Conv", ["b", "w2"], ["y"]),
    ]
    shape = [1, CHANNELS, HEIGHT, WIDTH]
    path = save(
        tmp_path_factory.mktemp("binary") / "binary.onnx",
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(w, n) for w, n in ((w1, "w1"), (w2, "w2"), (constant, "k"))],
    )
    model = Model("binary", (ModelInput("x", tuple(shape)),), onnx=path, layout="NHWC")
    x = reference_inputs(model)["x"]

    prepared = prepare(load_model(model), HOST)
    got = relax.VirtualMachine(build_untuned(prepared, HOST), tvm.cpu())[entry_function(prepared)](
        tvm.runtime.tensor(x)
    )

    def conv(w, t):
        return np.einsum("oi,nihw->nohw", w[:, :, 0, 0], t)

    first = conv(w1, x)
    middle = BINARY[operator](constant, first) if constant_first else BINARY[operator](first, constant)
    np.testing.assert_allclose(got.numpy(), conv(w2, middle), rtol=1e-5, atol=1e-5)
    left_alone = (
        constant_first and constant.size > 1 and operator in ("Sub", "Div")
    )  # TVM's rule takes the first operand's layout
    transposes = sum("transpose" in name for name in kernel_names(prepared))
    assert transposes == (3 if left_alone else 2), kernel_names(prepared)
