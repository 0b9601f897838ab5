"""FLOP counting of an ONNX graph (the roofline column of bench/side_by_side.py), checked
against counts done by hand."""

import numpy as np
import onnx
import pytest
from flops import node_flops, total_flops
from onnx import TensorProto, helper, numpy_helper

from edgetune.errors import TuneError


def graph_model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "flops", inputs, outputs, initializer=inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return onnx.shape_inference.infer_shapes(proto)


def zeros(name, *shape):
    return numpy_helper.from_array(np.zeros(shape, np.float32), name)


def test_conv_depthwise_transpose_gemm_and_matmul_match_hand_counts():
    nodes = [
        # 3x3 conv 8->16, stride 2, pad 1: out 1x16x16x16; MACs 16*16*16 * 8*9
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
        # depthwise 3x3 on 16 channels, pad 1: out 1x16x16x16; MACs 16*16*16 * 1*9
        helper.make_node("Conv", ["c1", "w2"], ["c2"], name="dw", kernel_shape=[3, 3], pads=[1] * 4, group=16),
        helper.make_node("Relu", ["c2"], ["r"], name="relu"),  # not counted
        # transposed 2x2 stride 2, 16->4: MACs = input 16*16*16 * 4*2*2
        helper.make_node("ConvTranspose", ["r", "w3"], ["t"], name="up", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["t"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"], axis=1),  # 1x4
        # Gemm 1x4 @ (10x4)^T: MACs 10*4
        helper.make_node("Gemm", ["f", "w4"], ["g"], name="fc", transB=1),
        # batched MatMul 2x5x10 @ 10x3: MACs 2*5*3*10
        helper.make_node("MatMul", ["m", "w5"], ["y2"], name="mm"),
    ]
    model = graph_model(
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32, 32]),
            helper.make_tensor_value_info("m", TensorProto.FLOAT, [2, 5, 10]),
        ],
        [
            helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 10]),
            helper.make_tensor_value_info("y2", TensorProto.FLOAT, [2, 5, 3]),
        ],
        [
            zeros("w1", 16, 8, 3, 3),
            zeros("w2", 16, 1, 3, 3),
            zeros("w3", 16, 4, 2, 2),
            zeros("w4", 10, 4),
            zeros("w5", 10, 3),
        ],
    )
    hand = {
        "conv": 2 * 16 * 16 * 16 * 8 * 9,
        "dw": 2 * 16 * 16 * 16 * 9,
        "up": 2 * 16 * 16 * 16 * 4 * 4,
        "fc": 2 * 10 * 4,
        "mm": 2 * 2 * 5 * 3 * 10,
    }
    assert {n.name: n.flops for n in node_flops(model)} == hand
    assert total_flops(model) == sum(hand.values())


def test_unknown_shape_is_a_clear_error():
    nodes = [helper.make_node("MatMul", ["a", "w"], ["y"], name="mm")]
    model = graph_model(
        nodes,
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [zeros("w", 4, 2)],
    )
    with pytest.raises(TuneError, match="shape of 'a'.*unknown"):
        total_flops(model)
