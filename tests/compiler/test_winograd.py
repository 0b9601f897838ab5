"""3x3 stride-1 convolutions computed by Winograd's F(4x4, 3x3) (edgetune.compiler.relax.winograd):
which convolutions `prepare` rewrites, that the result is the convolution (against NumPy in
float64, onnxruntime for a whole model), and that its 36 products are one task of the
convolution rule."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from support.onnx_samples import save
from support.rule_tuning import assert_answers_like_onnxruntime, tune_briefly
from tvm import relax

from edgetune.compiler.models import import_model
from edgetune.compiler.prepare import build_untuned, extract_tasks, prepare
from edgetune.compiler.relax.winograd import INPUT_KERNEL, transform_matrices
from edgetune.compiler.tir.convolution import RULE
from edgetune.inventory.schema import Model, ModelInput

pytestmark = pytest.mark.tvm

HOST = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})  # 4 float32 lanes


def convolution(
    batch: int, size: tuple[int, int], channels: tuple[int, int], padding, stride=1, groups=1, kernel=(3, 3)
):
    """A Relax module of one NHWC convolution with a constant OHWI weight, and its weight."""
    height, width = size
    channels_in, channels_out = channels
    weight = np.random.default_rng(3).standard_normal((channels_out, *kernel, channels_in // groups)).astype("float32")
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, height, width, channels_in), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(
                relax.op.nn.conv2d(
                    x,
                    relax.const(weight),
                    strides=stride,
                    padding=padding,
                    groups=groups,
                    data_layout="NHWC",
                    kernel_layout="OHWI",
                )
            )
        builder.emit_func_output(out)
    return builder.get(), weight


def direct_in_float64(x: np.ndarray, weight: np.ndarray, padding) -> np.ndarray:
    top, left, bottom, right = padding
    _, kernel_h, kernel_w, _ = weight.shape
    padded = np.pad(x.astype(np.float64), [(0, 0), (top, bottom), (left, right), (0, 0)])
    height, width = padded.shape[1] - kernel_h + 1, padded.shape[2] - kernel_w + 1
    return sum(
        np.einsum("nhwc,oc->nhwo", padded[:, i : i + height, j : j + width, :], weight[:, i, j, :].astype(np.float64))
        for i in range(kernel_h)
        for j in range(kernel_w)
    )


def rewritten(prepared: tvm.IRModule) -> int:
    """How many convolutions of a prepared module became Winograd's (one input transform each)."""
    return sum(1 for gv in prepared.get_global_vars() if INPUT_KERNEL in gv.name_hint)


def test_the_transform_matrices_compute_a_4x4_tile_of_a_3x3_convolution():
    a, b, g = transform_matrices(3)
    rng = np.random.default_rng(0)
    tile, kernel = rng.standard_normal((6, 6)), rng.standard_normal((3, 3))
    winograd = a.T @ ((g @ kernel @ g.T) * (b.T @ tile @ b)) @ a
    direct = np.array([[np.sum(tile[i : i + 3, j : j + 3] * kernel) for j in range(4)] for i in range(4)])
    np.testing.assert_allclose(winograd, direct, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("taps", [3, 5])
def test_the_transform_matrices_compute_4_outputs_of_a_one_dimensional_filter(taps):
    a, b, g = transform_matrices(taps)
    rng = np.random.default_rng(1)
    tile, kernel = rng.standard_normal(4 + taps - 1), rng.standard_normal(taps)
    direct = np.array([np.dot(tile[i : i + taps], kernel) for i in range(4)])
    np.testing.assert_allclose(a.T @ ((g @ kernel) * (b.T @ tile)), direct, rtol=1e-9, atol=1e-9)


@settings(max_examples=6, deadline=None)
@given(
    batch=st.integers(1, 2),
    size=st.tuples(st.integers(32, 38), st.integers(32, 38)),  # at least 8 x 8 tiles
    channels=st.tuples(st.integers(64, 70), st.sampled_from([64, 72])),
    padding=st.sampled_from([(1, 1, 1, 1), (0, 0, 0, 0), (2, 1, 0, 2)]),
)
def test_a_rewritten_convolution_answers_what_numpy_computes_in_float64(batch, size, channels, padding):
    """Any image size (tiles cut off at the edges), batch, channel count and padding."""
    mod, weight = convolution(batch, size, channels, padding)
    prepared = prepare(mod, HOST)
    assert rewritten(prepared) == 1
    x = np.random.default_rng(5).standard_normal((batch, *size, channels[0])).astype("float32")
    got = relax.VirtualMachine(build_untuned(prepared, HOST), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    expected = direct_in_float64(x, weight, padding)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-5 * np.abs(expected).max())


@pytest.mark.parametrize("taps, padding", [(5, (0, 0, 0, 0)), (5, (0, 2, 0, 2)), (3, (0, 1, 0, 1))])
def test_a_convolution_along_a_row_answers_what_numpy_computes_in_float64(taps, padding):
    """A one-dimensional convolution as the layout pass writes it: over an image one pixel high
    (Magika's 5 taps along 512 bytes)."""
    mod, weight = convolution(1, (1, 262), (64, 64), padding, kernel=(1, taps))
    prepared = prepare(mod, HOST)
    assert rewritten(prepared) == 1
    x = np.random.default_rng(6).standard_normal((1, 1, 262, 64)).astype("float32")
    got = relax.VirtualMachine(build_untuned(prepared, HOST), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    expected = direct_in_float64(x, weight, padding)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-5 * np.abs(expected).max())


@pytest.mark.parametrize(
    "case, size, channels, stride, groups, expected",
    [
        ("64 -> 64 channels, 32 x 32: 64 tiles", 32, (64, 64), 1, 1, 1),
        ("a 3-channel stem", 32, (3, 64), 1, 1, 0),
        ("fewer than 16 output channels", 32, (64, 8), 1, 1, 0),
        ("stride 2", 32, (64, 64), 2, 1, 0),
        ("depthwise", 32, (64, 64), 1, 64, 0),
        ("a small image: 9 tiles", 12, (64, 64), 1, 1, 0),
    ],
)
def test_only_convolutions_winograd_pays_on_are_rewritten(case, size, channels, stride, groups, expected):
    mod, _ = convolution(1, (size, size), channels, (1, 1, 1, 1), stride, groups)
    assert rewritten(prepare(mod, HOST)) == expected, case


def vgg_block(tmp_path) -> Model:
    """conv 3x3 (3->64, stride 1) + ReLU, conv 3x3 (64->64) + bias + ReLU on 32 x 32: the second
    is Winograd's."""
    rng = np.random.default_rng(2)
    weights = [
        numpy_helper.from_array(rng.standard_normal((64, 3, 3, 3)).astype("float32") * 0.3, "w1"),
        numpy_helper.from_array(rng.standard_normal((64, 64, 3, 3)).astype("float32") * 0.05, "w2"),
        numpy_helper.from_array(rng.standard_normal(64).astype("float32") * 0.1, "b2"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["out"]),
    ]
    path = save(
        tmp_path / "vgg.onnx",
        nodes,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 64, 32, 32])],
        weights,
    )
    return Model("vgg", (ModelInput("image", (1, 3, 32, 32)),), onnx=path, layout="auto")


def test_the_36_products_are_one_task_of_the_convolution_rule_and_the_tuned_model_answers_like_onnxruntime(tmp_path):
    model = vgg_block(tmp_path)
    imported = import_model(model)
    assert imported.layout.line == (
        "NHWC: the NHWC micro-kernel rules take 2 of 2 convolutions (2 k x k), 100% of "
        "their FLOPs; 1 of them by Winograd's minimal filtering"
    )
    prepared = prepare(imported.mod, HOST)
    assert rewritten(prepared) == 1
    tasks = extract_tasks(prepared, HOST)
    products = [t for t in tasks if RULE in t.dispatched[0].script() and t.weight == 36]
    assert len(products) == 1  # the stem is the rule's too, called once
    assert_answers_like_onnxruntime(model, prepared, tune_briefly(products, HOST, tmp_path), HOST)
