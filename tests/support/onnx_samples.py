"""Small real ONNX models shared by the tune and artifact tests, built with onnx.helper."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]


def save(path: Path, nodes, inputs, outputs, weights) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, initializer=weights)
    onnx.save(helper.make_model(graph, opset_imports=OPSET), str(path))
    return path


def qdq_model(path: Path, rate_branch: bool = False) -> Path:
    """Two QDQ int8 matmul layers 512 -> 1024 -> 1024 (1.5 MB of int8 weights), as
    onnxruntime's quantizer writes them. With `rate_branch`, a scalar int64 input `sr` picks
    the last step (`If(sr == 16000)`: negate, else sigmoid), as audio models branch on it."""
    rng = np.random.default_rng(0)
    nodes, current, sizes = [], "x", [512, 1024, 1024]
    weights = [
        numpy_helper.from_array(np.array(0.0173, np.float32), "act_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "act_zero"),
    ]
    for layer in range(2):
        w = rng.integers(-127, 128, size=(sizes[layer], sizes[layer + 1])).astype(np.int8)
        weights += [
            numpy_helper.from_array(w, f"w{layer}"),
            numpy_helper.from_array(np.array(0.00731, np.float32), f"w{layer}_scale"),
            numpy_helper.from_array(np.array(0, np.int8), f"w{layer}_zero"),
        ]
        nodes += [
            helper.make_node("QuantizeLinear", [current, "act_scale", "act_zero"], [f"q{layer}"]),
            helper.make_node("DequantizeLinear", [f"q{layer}", "act_scale", "act_zero"], [f"dq{layer}"]),
            helper.make_node("DequantizeLinear", [f"w{layer}", f"w{layer}_scale", f"w{layer}_zero"], [f"wf{layer}"]),
            helper.make_node("MatMul", [f"dq{layer}", f"wf{layer}"], [f"mm{layer}"]),
            helper.make_node("Relu", [f"mm{layer}"], [f"h{layer}"]),
        ]
        current = f"h{layer}"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512])]
    if rate_branch:
        relu = helper.make_graph(
            [helper.make_node("Neg", [current], ["neg"])],
            "rate16k",
            [],
            [helper.make_tensor_value_info("neg", TensorProto.FLOAT, [1, 1024])],
        )
        sigmoid = helper.make_graph(
            [helper.make_node("Sigmoid", [current], ["sigmoid"])],
            "other",
            [],
            [helper.make_tensor_value_info("sigmoid", TensorProto.FLOAT, [1, 1024])],
        )
        nodes += [
            helper.make_node("Equal", ["sr", "rate16k"], ["is16k"]),
            helper.make_node("If", ["is16k"], ["y"], then_branch=relu, else_branch=sigmoid),
        ]
        weights.append(numpy_helper.from_array(np.array(16000, np.int64), "rate16k"))
        inputs.append(helper.make_tensor_value_info("sr", TensorProto.INT64, []))
    else:
        nodes.append(helper.make_node("Identity", [current], ["y"]))
    return save(path, nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1024])], weights)


def write_conv_model(path: Path, batch: int | str = "batch") -> Path:
    """conv 3x3 (3->8) + relu + flatten + matmul (512->10): a real ONNX graph with weights, its
    batch dimension dynamic (named `batch`) or of the size given."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype("float32") * 0.2, "w_conv"),
        numpy_helper.from_array(rng.standard_normal(8).astype("float32") * 0.1, "b_conv"),
        numpy_helper.from_array(rng.standard_normal((512, 10)).astype("float32") * 0.05, "w_fc"),
        numpy_helper.from_array(np.array([1, 512], dtype="int64"), "shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "w_conv", "b_conv"], ["conv"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("Reshape", ["relu", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w_fc"], ["logits"]),
    ]
    return save(
        path,
        nodes,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 10])],
        weights,
    )


def conv_model(path: Path, name: str = "convnet", batch: int | str = "batch"):
    from edgetune.inventory.schema import Model, ModelInput

    return Model(name=name, inputs=(ModelInput("image", (1, 3, 16, 16)),), onnx=write_conv_model(path, batch))


def write_separable_block(path: Path) -> Path:
    """A depthwise-separable block as mobile CNNs have it: conv 3x3 (3->16, stride 2) +
    Clip(0, 6) (ReLU6), depthwise 3x3 + HardSwish + a learnable affine block (a scale and a
    bias of shape (1,), the scale first, as PP-LCNetV3 exports them), pointwise 1x1 (16->32) +
    Clip with only a lower bound, global average pool. Clip and HardSwish are the activations
    the ONNX frontend lowers without a layout rule, and the affine block's constants are what
    TVM's layout rule of binary operators stops at (edgetune.compiler.relax.layout)."""
    rng = np.random.default_rng(1)
    weights = [
        numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype("float32") * 0.3, "w_stem"),
        numpy_helper.from_array(rng.standard_normal((16, 1, 3, 3)).astype("float32") * 0.3, "w_dw"),
        numpy_helper.from_array(rng.standard_normal((32, 16, 1, 1)).astype("float32") * 0.3, "w_pw"),
        numpy_helper.from_array(rng.standard_normal(32).astype("float32") * 0.1, "b_pw"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(6.0, np.float32), "six"),
        numpy_helper.from_array(np.array([1.3], np.float32), "lab_scale"),
        numpy_helper.from_array(np.array([-0.2], np.float32), "lab_bias"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "w_stem"], ["stem"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Clip", ["stem", "zero", "six"], ["relu6"]),
        helper.make_node("Conv", ["relu6", "w_dw"], ["dw"], pads=[1, 1, 1, 1], group=16),
        helper.make_node("HardSwish", ["dw"], ["hswish"]),
        helper.make_node("Mul", ["lab_scale", "hswish"], ["scaled"]),
        helper.make_node("Add", ["scaled", "lab_bias"], ["affine"]),
        helper.make_node("Conv", ["affine", "w_pw", "b_pw"], ["pw"]),
        helper.make_node("Clip", ["pw", "zero"], ["relu"]),
        helper.make_node("GlobalAveragePool", ["relu"], ["pooled"]),
    ]
    return save(
        path,
        nodes,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, 32, 1, 1])],
        weights,
    )


def write_quantized_moves(path: Path) -> Path:
    """A float32 block whose activations mostly move, as detectors' necks move them (conv 3x3
    8 -> 16 + ReLU; max pool 3x3 stride 1; split into two halves; one half resized x2 to the
    nearest pixel and sliced back to 8 x 8; the halves concatenated, transposed, flattened and
    reshaped back; pointwise 16 -> 16) on a 1 x 8 x 8 x 8 image, quantized by onnxruntime's
    static quantizer (QDQ: each move between a dequantize and a quantize of the same scale)."""
    rng = np.random.default_rng(2)
    weights = [
        numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
        for name, shape in (("w1", (16, 8, 3, 3)), ("b1", (16,)), ("w2", (16, 16, 1, 1)))
    ]
    weights += [
        numpy_helper.from_array(np.array(values, np.int64), name)
        for name, values in (
            ("halves", [8, 8]),
            ("starts", [0, 0]),
            ("ends", [16, 16]),
            ("axes", [2, 3]),
            ("steps", [2, 2]),
            ("flat", [1, 16, 64]),
            ("image", [1, 16, 8, 8]),
        )
    ]
    weights.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "twice"))
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["pooled"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Split", ["pooled", "halves"], ["a", "b"], axis=1),
        helper.make_node("Resize", ["a", "", "twice"], ["wide"], mode="nearest"),
        helper.make_node("Slice", ["wide", "starts", "ends", "axes", "steps"], ["narrow"]),
        helper.make_node("Concat", ["narrow", "b"], ["joined"], axis=1),
        helper.make_node("Transpose", ["joined"], ["turned"], perm=[0, 1, 3, 2]),
        helper.make_node("Reshape", ["turned", "flat"], ["rows"]),
        helper.make_node("Reshape", ["rows", "image"], ["back"]),
        helper.make_node("Conv", ["back", "w2"], ["y"]),
    ]
    return _quantized(path, nodes, weights, [1, 8, 8, 8], [1, 16, 8, 8], rng)


def write_quantized_silu(path: Path) -> Path:
    """Two convolutions with SiLU as YOLOv8 has it (conv 3x3 16 -> 16 + bias, x * sigmoid(x);
    pointwise 16 -> 32, x * sigmoid(x)) on a 1 x 16 x 8 x 8 image, quantized by onnxruntime's
    static quantizer (QDQ around the sigmoid and the product too)."""
    rng = np.random.default_rng(3)
    weights = [
        numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
        for name, shape in (("w1", (16, 16, 3, 3)), ("b1", (16,)), ("w2", (32, 16, 1, 1)))
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["g1"]),
        helper.make_node("Mul", ["c1", "g1"], ["s1"]),
        helper.make_node("Conv", ["s1", "w2"], ["c2"]),
        helper.make_node("Sigmoid", ["c2"], ["g2"]),
        helper.make_node("Mul", ["c2", "g2"], ["y"]),
    ]
    return _quantized(path, nodes, weights, [1, 16, 8, 8], [1, 32, 8, 8], rng)


def write_quantized_separable(path: Path, softmax: bool = False) -> Path:
    """A float32 block (3x3 16 -> 32 padded, with bias and ReLU; depthwise 3x3 with ReLU;
    pointwise 32 -> 48; with `softmax`, a softmax over its channels) on a 1 x 16 x 8 x 8 image,
    quantized by onnxruntime's static quantizer as a user would (QDQ, uint8 activations, int8
    weights per channel, calibrated on 8 seeded inputs)."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
        for name, shape in (("w1", (32, 16, 3, 3)), ("b1", (32,)), ("w2", (32, 1, 3, 3)), ("w3", (48, 32, 1, 1)))
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], group=32, pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3"], ["p" if softmax else "y"]),
    ]
    nodes += [helper.make_node("Softmax", ["p"], ["y"], axis=1)] if softmax else []
    return _quantized(path, nodes, weights, [1, 16, 8, 8], [1, 48, 8, 8], rng)


def _quantized(path: Path, nodes, weights, image: list[int], out: list[int], rng) -> Path:
    """The float32 graph quantized by onnxruntime's static quantizer as a user would (QDQ,
    uint8 activations, int8 weights per channel, calibrated on 8 seeded inputs)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    float_path = save(
        path.with_suffix(".float.onnx"),
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, image)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
        weights,
    )

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{"x": rng.random(image, dtype=np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.feeds, None)

    quantize_static(
        str(float_path),
        str(path),
        Calibration(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
    )
    return path
