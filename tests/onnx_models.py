"""A small real ONNX model (with weights) for the tests that import or build an ONNX file."""

from __future__ import annotations

from pathlib import Path


def write_conv_model(path: Path) -> Path:
    """conv 3x3 (3->8) + relu + flatten + matmul (512->10): a real ONNX graph with weights."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

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
    graph = helper.make_graph(
        nodes, "conv_relu_matmul",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        initializer=weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


def conv_model(path: Path, name: str = "convnet"):
    from edgetune.inventory.schema import Model, ModelInput

    return Model(name=name, inputs=(ModelInput("image", (1, 3, 16, 16)),), onnx=write_conv_model(path))
