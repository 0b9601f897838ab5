"""Floating-point operations of an ONNX graph with known shapes, to say how close a build runs
to the machine's peak (GFLOP/s, % of a measured GEMM peak): the roofline column of
side_by_side.py.

Only the multiply-accumulate operators are counted (Conv, ConvTranspose, MatMul, Gemm), one
multiply-add as 2 FLOPs; element-wise operators, pooling and normalisation are not (they are
memory-bound and a small share of a CNN's arithmetic). Shapes must be known: pass the graph
after `onnx.shape_inference.infer_shapes` with frozen input dims (what `preprocess` returns).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx

from edgetune.errors import TuneError

COUNTED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")


@dataclass(frozen=True)
class NodeFlops:
    name: str
    op_type: str
    flops: int


def node_flops(proto: onnx.ModelProto) -> list[NodeFlops]:
    """FLOPs of every counted node, in graph order."""
    shapes = _known_shapes(proto.graph)
    out = []
    for index, node in enumerate(proto.graph.node):
        if node.op_type not in COUNTED_OPS:
            continue
        counter = _COUNTERS[node.op_type]
        out.append(NodeFlops(node.name or f"{node.op_type}_{index}", node.op_type, counter(node, shapes)))
    return out


def total_flops(proto: onnx.ModelProto) -> int:
    return sum(n.flops for n in node_flops(proto))


def _known_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    shapes = {init.name: tuple(init.dims) for init in graph.initializer}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        dims = info.type.tensor_type.shape.dim
        if info.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            shapes[info.name] = tuple(d.dim_value for d in dims)
    return shapes


def _shape(shapes: dict[str, tuple[int, ...]], node: onnx.NodeProto, name: str) -> tuple[int, ...]:
    if name not in shapes:
        raise TuneError(
            f"FLOP count: the shape of {name!r} (used by {node.op_type} {node.name!r}) is unknown; "
            "infer shapes with the input dims frozen first"
        )
    return shapes[name]


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for attribute in node.attribute:
        if attribute.name == name:
            return onnx.helper.get_attribute_value(attribute)
    return default


def _conv(node: onnx.NodeProto, shapes) -> int:
    out = _shape(shapes, node, node.output[0])  # N, Cout, spatial...
    weight = _shape(shapes, node, node.input[1])  # Cout, Cin/group, kernel...
    return 2 * math.prod(out) * math.prod(weight[1:])


def _conv_transpose(node: onnx.NodeProto, shapes) -> int:
    inp = _shape(shapes, node, node.input[0])  # N, Cin, spatial...
    weight = _shape(shapes, node, node.input[1])  # Cin, Cout/group, kernel...
    return 2 * math.prod(inp) * math.prod(weight[1:])


def _matmul(node: onnx.NodeProto, shapes) -> int:
    a = _shape(shapes, node, node.input[0])
    out = _shape(shapes, node, node.output[0])
    return 2 * math.prod(out) * a[-1]


def _gemm(node: onnx.NodeProto, shapes) -> int:
    a = _shape(shapes, node, node.input[0])
    out = _shape(shapes, node, node.output[0])
    inner = a[0] if _attr(node, "transA", 0) else a[1]
    return 2 * math.prod(out) * inner


_COUNTERS = {"Conv": _conv, "ConvTranspose": _conv_transpose, "MatMul": _matmul, "Gemm": _gemm}
