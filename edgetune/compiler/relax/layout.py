"""The layout a model's convolutions are compiled in (`models[].layout`: NCHW, NHWC or auto).

`convert_model_layout("NHWC")`, a pass of the import pipeline, puts the convolutions in NHWC
(OHWI weights, one transpose at each end of the model), first rewriting what TVM's ConvertLayout
would wrap in transpose pairs or stop at (clips, ONNX Max/Min, constants of lower rank), dense
layers as pointwise convolutions and 1-d convolutions as rows, so that the micro-kernel rules
(edgetune.compiler.tir) take them, and after it carrying the moves back to the model's shapes
below the element-wise operators and reductions that follow them (`relax/moves_last.py`).
`choose_layout` resolves `auto` from the imported graph alone. docs/compiler.md has the design.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from edgetune.compiler.relax.graph import (
    bound_value,
    is_call,
    is_constant,
    rewrite_calls,
    rewrite_with,
    static_shape,
)
from edgetune.compiler.relax.moves_last import moves_last
from edgetune.compiler.relax.winograd import pays as winograd_pays
from edgetune.compiler.tir.common import MIN_LANES, row_tiles
from edgetune.inventory.schema import Model

PADDED_CHANNELS = 16  # float32 lanes of an AVX-512 register: the widest the rules tile
MODEL_LAYOUTS = ("NCHW", "NHWC")  # what `choose_layout` resolves a model's layout to
# Transposed convolutions stay NCHW: Relax legalizes them in no other layout (TVM 0.27).
NHWC_CONVOLUTIONS = {"relax.nn.conv2d": ["NHWC", "OHWI"], "relax.nn.conv2d_transpose": ["NCHW", "IOHW"]}


RULES_SHARE = 0.5  # NHWC when the layers the rules take carry at least this share of the FLOPs


@dataclass(frozen=True)
class LayoutChoice:
    """The layout a model's convolutions are compiled in (NCHW or NHWC) and why."""

    layout: str
    reason: str

    @property
    def line(self) -> str:
        """What `edgetune plan`, `tune --dry-run` and `build` print: 'NHWC: <reason>'."""
        return f"{self.layout}: {self.reason}"


def choose_layout(model: Model, imported: Callable[[], tvm.IRModule]) -> LayoutChoice:
    """The layout of `model`: its `layout` if fleet.yaml sets NCHW or NHWC, else (auto) NHWC
    for integer arithmetic and otherwise by what the graph holds (`imported()`: the model as
    imported, NCHW; called only then)."""
    if model.layout != "auto":
        return LayoutChoice(model.layout, "set in fleet.yaml")
    if model.quantized_weights == "integer":
        return LayoutChoice("NHWC", "quantized_weights: integer computes convolutions in NHWC micro-kernels")
    return _by_contents(_layers(_rows_along_width(imported())))


@dataclass(frozen=True)
class _Layer:
    """A convolution or dense layer whose layout NHWC changes."""

    kind: str  # depthwise, pointwise, k x k, one-dimensional, grouped, transposed, 3-d, dense
    flops: int
    scheduled: bool  # an NHWC micro-kernel rule takes its kernel
    winograd: bool = False  # computed by Winograd's algorithm in NHWC (edgetune.compiler.relax.winograd)

    @property
    def label(self) -> str:
        unfit = not self.scheduled and self.kind in _RULE_KINDS
        return f"{self.kind} of a shape the rules do not take" if unfit else self.kind


def _by_contents(layers: list[_Layer]) -> LayoutChoice:
    if not layers:
        return LayoutChoice("NCHW", "no convolutions and no dense layers that NHWC would change")
    scheduled = [layer for layer in layers if layer.scheduled]
    total = sum(layer.flops for layer in layers)
    share = sum(layer.flops for layer in scheduled) / total if total else 0.0
    dense = {layer.kind == "dense" for layer in layers}
    nouns = (
        "dense layers" if dense == {True} else "convolutions" if dense == {False} else "convolutions and dense layers"
    )
    counted = f"{len(scheduled)} of {len(layers)} {nouns}"
    if share >= RULES_SHARE:
        winograd = sum(layer.winograd for layer in layers)
        by_winograd = f"; {winograd} of them by Winograd's minimal filtering" if winograd else ""
        return LayoutChoice(
            "NHWC",
            f"the NHWC micro-kernel rules take {counted} ({_kinds(scheduled)}), "
            f"{share:.0%} of their FLOPs{by_winograd}",
        )
    left = [layer for layer in layers if not layer.scheduled]
    return LayoutChoice(
        "NCHW",
        f"the NHWC micro-kernel rules would take only {counted} ({share:.0%} of their "
        f"FLOPs); the rest ({_kinds(left)}) gain nothing from NHWC",
    )


def _kinds(layers: list[_Layer]) -> str:
    """'3 depthwise, 3 pointwise, 1 k x k': the layers counted by kind, most first."""
    return ", ".join(f"{n} {label}" for label, n in Counter(layer.label for layer in layers).most_common())


_RULE_KINDS = ("depthwise", "pointwise", "k x k", "one-dimensional", "dense")
_OTHER_CONVOLUTIONS = {
    "relax.nn.conv2d_transpose": "transposed",
    "relax.nn.conv1d_transpose": "transposed",
    "relax.nn.conv1d": "one-dimensional",
    "relax.nn.conv3d": "3-d",
}


def _layers(mod: tvm.IRModule) -> list[_Layer]:
    """The model's layers whose layout NHWC changes, in graph order."""
    layers: list[_Layer] = []

    def visit(expr: relax.Expr) -> None:
        layer = _layer(expr) if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) else None
        if layer is not None:
            layers.append(layer)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return layers


def _layer(call: relax.Call) -> _Layer | None:
    if call.op.name == "relax.nn.conv2d":
        return _convolution(call)
    if call.op.name in _OTHER_CONVOLUTIONS:
        out, data, weight = static_shape(call), static_shape(call.args[0]), static_shape(call.args[1])
        transposed = _OTHER_CONVOLUTIONS[call.op.name] == "transposed"
        image = data if transposed else out  # a transposed convolution's multiply-adds go by its input
        flops = 2 * math.prod(image) * math.prod(weight[1:]) if image and weight else 0
        return _Layer(_OTHER_CONVOLUTIONS[call.op.name], flops, scheduled=False)
    dense = _dense_layer(call)
    if dense is None:
        return None
    rows, matrix = dense
    return _Layer("dense", 2 * rows * matrix.size, scheduled=True)


def _convolution(call: relax.Call) -> _Layer:
    """A 2-d convolution by kind, its FLOPs and whether a rule takes it in NHWC."""
    attrs = call.attrs
    out, data, weight = static_shape(call), static_shape(call.args[0]), static_shape(call.args[1])
    if out is None or data is None or weight is None:
        return _Layer("k x k", 0, scheduled=False)  # a dynamic shape: no rule takes it
    out_dims = dict(zip(str(attrs.out_layout or attrs.data_layout), out))
    kernel = dict(zip(str(attrs.kernel_layout), weight))
    channels_in = dict(zip(str(attrs.data_layout), data))["C"]
    groups = int(attrs.groups)
    if groups == 1 and kernel["H"] == out_dims["H"] == 1 < kernel["W"]:
        kind = "one-dimensional"  # as _rows_along_width writes them
    elif groups == 1:
        kind = "pointwise" if kernel["H"] == kernel["W"] == 1 else "k x k"
    elif groups == channels_in == out_dims["C"] and kernel["I"] == 1:
        kind = "depthwise"
    else:
        kind = "grouped"
    tiles = row_tiles(out_dims["W"], tail=kind != "depthwise")  # the depthwise rule takes divisors only
    fits = kind != "grouped" and str(call.ty.dtype) == "float32" and bool(tiles) and out_dims["C"] % MIN_LANES == 0
    out_nhwc = tuple(out_dims[d] for d in "NHWC")
    winograd = winograd_pays(attrs, str(call.ty.dtype), out_nhwc, kernel["I"], (kernel["H"], kernel["W"]))
    return _Layer(kind, 2 * math.prod(out) * kernel["I"] * kernel["H"] * kernel["W"], fits, winograd)


def convert_model_layout(layout: str) -> tvm.transform.Sequential:
    """The pass `ConvertModelLayout` that puts a module's convolutions in `layout` (NCHW or NHWC:
    `choose_layout` resolves auto); for NCHW it has no steps and leaves the module as it is."""
    if layout not in MODEL_LAYOUTS:
        raise ValueError(f"convert_model_layout: layout {layout!r} is not one of {', '.join(MODEL_LAYOUTS)}")
    nhwc = [
        _to_relax_min_max,
        relax.transform.DeadCodeElimination(),  # the stacks left unused
        _constants_layout_can_follow,
        _dense_layers_as_pointwise,
        _rows_along_width,
        relax.transform.ConvertLayout(NHWC_CONVOLUTIONS),
        relax.transform.CanonicalizeBindings(),
        moves_last(),
    ]
    return tvm.transform.Sequential(nhwc if layout == "NHWC" else [], name="ConvertModelLayout")


@relax.expr_functor.mutator
class _MinMaxOperators(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call, relax.Call):
            return call
        if call.op == tvm.ir.Op.get("relax.clip"):
            return self._clip(call)
        if call.op == tvm.ir.Op.get("relax.call_tir"):
            return self._tir_bound(call)
        if isinstance(call.op, tvm.ir.Op) and call.op in _STACKED_EXTREMES:
            return self._stacked_extreme(call)
        return call

    @staticmethod
    def _clip(call: relax.Call) -> relax.Expr:
        value, low, high = call.args
        low, high = _constant(low), _constant(high)
        if low is None or high is None:
            return call
        dtype = value.ty.dtype
        return relax.op.minimum(relax.op.maximum(value, relax.const(low, dtype)), relax.const(high, dtype))

    def _tir_bound(self, call: relax.Call) -> relax.Expr:
        """`call_tir(maximum|minimum, (x, bound))` with a scalar bound, as the ONNX frontend
        emits Clip: the same Relax operator."""
        callee, args = call.args[0], call.args[1]
        kernel = _TIR_BOUNDS.match(callee.name_hint)
        if kernel is None or not isinstance(args, relax.Tuple) or len(args.fields) != 2:
            return call
        value, bound = args.fields
        if _rank(bound) != 0 or bound.ty.dtype != value.ty.dtype:
            return call
        operator = relax.op.maximum if kernel.group(1) == "maximum" else relax.op.minimum
        return operator(value, bound)

    def _stacked_extreme(self, call: relax.Call) -> relax.Expr:
        """`max|min(stack((broadcast_to(a), broadcast_to(b), ...)), axis=0)`, as the ONNX
        frontend emits Max and Min: `maximum|minimum(maximum|minimum(a, b), ...)`."""
        stacked = bound_value(self, call.args[0])
        axes = [int(a) for a in call.attrs.axis] if call.attrs.axis is not None else None
        if axes != [0] or call.attrs.keepdims or not is_call(stacked, "relax.stack") or int(stacked.attrs.axis) != 0:
            return call
        tensors = bound_value(self, stacked.args[0])
        if not isinstance(tensors, relax.Tuple):
            return call
        inputs = []
        for field in tensors.fields:
            value = bound_value(self, field)
            inputs.append(value.args[0] if is_call(value, "relax.broadcast_to") else field)
        return functools.reduce(_STACKED_EXTREMES[call.op], inputs)


_TIR_BOUNDS = re.compile(r"(maximum|minimum)\d*$")
_STACKED_EXTREMES = {tvm.ir.Op.get("relax.max"): relax.op.maximum, tvm.ir.Op.get("relax.min"): relax.op.minimum}


def _constant(bound: relax.Expr) -> float | None:
    """A clip bound's value, or None when it is not a constant."""
    value = getattr(bound, "value", None)
    value = getattr(value, "value", value)
    return float(value) if isinstance(value, (int, float)) else None


# binary element-wise operators whose layout rule permutes both operands (TVM 0.27 binary.cc)
_COMMUTATIVE = ("add", "multiply", "maximum", "minimum")
_BROADCASTING = {
    tvm.ir.Op.get(f"relax.{name}"): name in _COMMUTATIVE
    for name in ("add", "subtract", "multiply", "divide", "power", *_COMMUTATIVE)
}


@relax.expr_functor.mutator
class _ConstantsLayoutCanFollow(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        commutative = (
            _BROADCASTING.get(call.op) if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) else None
        )
        if commutative is None:
            return call
        left, right = call.args
        if is_constant(left) == is_constant(right):
            return call  # two tensors (ConvertLayout's own case), or constants only
        if is_constant(left) and commutative:
            left, right = right, left
        if is_constant(left):
            left = _as_scalar(left, _rank(right))
        else:
            right = _full_rank(right, _rank(left))
        if left.same_as(call.args[0]) and right.same_as(call.args[1]):
            return call
        return relax.Call(call.op, [left, right], call.attrs)


def _rank(expr: relax.Expr) -> int | None:
    shape = getattr(expr.ty, "shape", None)
    return len(shape) if shape is not None else None


def _full_rank(constant: relax.Expr, rank: int | None) -> relax.Expr:
    """The constant with leading dimensions of 1 up to `rank` (the same broadcast values)."""
    value = constant.value.numpy()
    if rank is None or not 0 < value.ndim < rank:
        return constant
    return relax.const(value.reshape((1,) * (rank - value.ndim) + value.shape))


def _as_scalar(constant: relax.Expr, rank: int | None) -> relax.Expr:
    """The constant as a scalar if it holds one value and broadcasts to `rank` dimensions. (Scalar
    constants are written into the kernels as literals, which makes kernels that differ only in
    them separate tuning tasks: only the constants that must stay first become scalars.)"""
    value = constant.value.numpy()
    if rank is None or value.ndim == 0 or value.ndim > rank or value.size != 1:
        return constant
    return relax.const(value.reshape(()))


def _dense_as_pointwise(call: relax.Call) -> relax.Expr | None:
    dense = _dense_layer(call)
    if dense is None:
        return None
    data = call.args[0]
    leading = static_shape(data)[:-1]
    rows, matrix = dense
    channels_in, channels_out = matrix.shape
    padded = channels_out if channels_out % MIN_LANES == 0 else -(-channels_out // PADDED_CHANNELS) * PADDED_CHANNELS
    filters = np.zeros((padded, 1, 1, channels_in), matrix.dtype)
    filters[:channels_out, 0, 0, :] = matrix.T
    image = relax.op.reshape(data, (1, 1, rows, channels_in))
    out = relax.op.nn.conv2d(image, relax.const(filters), data_layout="NHWC", kernel_layout="OHWI")
    if padded != channels_out:
        out = relax.op.strided_slice(out, axes=[3], begin=[0], end=[channels_out])
    return relax.op.reshape(out, (*leading, channels_out))


def _dense_layer(call: relax.Expr) -> tuple[int, np.ndarray] | None:
    """(rows, weight matrix) of a dense layer NHWC writes as a pointwise convolution: a float32
    matmul of a constant K x N weight whose rows (the product of the data's leading dimensions)
    a register tile of the rule divides; None for any other expression."""
    if not is_call(call, "relax.matmul"):
        return None
    data, weight = call.args
    leading = (static_shape(data) or ())[:-1]  # () also for a vector or a dynamic shape
    matrix = weight.value.numpy() if is_constant(weight) else None
    if not leading or matrix is None or matrix.ndim != 2:
        return None
    if {str(data.ty.dtype), str(matrix.dtype)} != {"float32"}:
        return None  # the micro-kernel rules are float32 only
    rows = math.prod(leading)
    return (rows, matrix) if row_tiles(rows, tail=True) else None  # else not a kernel the rule would take


def _row_along_width(call: relax.Call) -> relax.Expr | None:
    row = _one_dimensional(call)
    if row is None:
        return None
    data, weight = call.args
    (n, c, length), (o, i, k) = row.data, row.kernel
    filters = (
        relax.const(weight.value.numpy().reshape(o, i, 1, k))
        if is_constant(weight)
        else relax.op.reshape(weight, (o, i, 1, k))
    )
    out = relax.op.nn.conv2d(
        relax.op.reshape(data, (n, c, 1, length)),
        filters,  # the same memory: a dimension of 1 added or moved
        strides=(1, row.stride),
        padding=(0, row.padding[0], 0, row.padding[1]),
        dilation=(1, row.dilation),
        data_layout="NCHW",
        kernel_layout="OIHW",
        out_dtype=str(call.ty.dtype),
    )
    return relax.op.reshape(out, static_shape(call))


@dataclass(frozen=True)
class _Row:
    """A convolution over one dimension: (N, C, length) data, (O, I, k) kernel, its stride,
    (before, after) padding and dilation along it."""

    data: tuple[int, int, int]
    kernel: tuple[int, int, int]
    stride: int
    padding: tuple[int, int]
    dilation: int


def _one_dimensional(call: relax.Expr) -> _Row | None:
    """A convolution with groups 1 over one dimension as `_rows_along_width` writes it along an
    image row: a 1-d one (NCW), or an NCHW 2-d one whose input, kernel and output are one pixel
    wide with no padding across (as jax2tf exports a 1-d convolution); None for any other."""
    op = call.op.name if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) else None
    if op not in ("relax.nn.conv1d", "relax.nn.conv2d") or int(call.attrs.groups) != 1:
        return None
    attrs = call.attrs
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout or attrs.data_layout))
    data, weight, out = static_shape(call.args[0]), static_shape(call.args[1]), static_shape(call)
    if data is None or weight is None or out is None or str(call.ty.dtype) != "float32":
        return None
    padding = tuple(int(p) for p in attrs.padding)
    if op == "relax.nn.conv1d":
        if layouts != ("NCW", "OIW", "NCW"):
            return None
        return _Row(data, weight, int(attrs.strides[0]), padding, int(attrs.dilation[0]))
    (n, c, h, w), (o, i, kh, kw), (_, _, out_h, out_w) = data, weight, out
    top, left, bottom, right = padding
    if layouts != ("NCHW", "OIHW", "NCHW") or not (w == kw == out_w == 1 and left == right == 0 and out_h > 1):
        return None
    return _Row((n, c, h), (o, i, kh), int(attrs.strides[0]), (top, bottom), int(attrs.dilation[0]))


_to_relax_min_max = rewrite_with(_MinMaxOperators, "ToRelaxMinMax")
_constants_layout_can_follow = rewrite_with(_ConstantsLayoutCanFollow, "ConstantsLayoutCanFollow")
_dense_layers_as_pointwise = rewrite_calls(_dense_as_pointwise, "DenseAsPointwise")
_rows_along_width = rewrite_calls(_row_along_width, "RowsAlongWidth")
