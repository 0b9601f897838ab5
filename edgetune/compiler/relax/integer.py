"""Integer arithmetic for quantized models (`models[].quantized_weights: integer`), as passes of
the import pipeline (edgetune.compiler.models.import_pipeline).

Before the layout conversion, `quantized_moves` moves the integers themselves where a quantized
tensor only moves and `element_wise_quantization` writes the per-tensor quantize / dequantize of
activations as the element-wise operators they compute. After the conversion to NHWC,
`integer_convolutions` computes each QDQ convolution with groups 1 as one uint8 x int8 -> int32
kernel, its weight packed for AVX-512 VNNI (edgetune.compiler.tir.integer schedules it), then
its zero-point correction and scale, and `byte_tables` looks a byte computed from one byte up
in a table. docs/compiler.md has the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, te

from edgetune.compiler.relax.graph import (
    bound_value,
    constant_weight,
    is_call,
    is_constant,
    rewrite_module_with,
    rewrite_with,
    static_shape,
)

INTEGER_LANES = 16  # int32 accumulators per VNNI instruction: output channels come in 16s
DOT_INPUTS = 4  # uint8 x int8 products summed per lane: input channels come in 4s
INTEGER_KERNEL = "integer_conv"  # name of the packed kernel (and of its tuning task)
_TO_NHWC = [0, 2, 3, 1]  # ConvertLayout's transpose of NCHW data and OIHW weights


def _scalar(expr: relax.Expr) -> float | int | None:
    """The one value of a constant of one element (or of its transpose, as ConvertLayout
    leaves the constants it permutes), or None."""
    value = constant_weight(expr)
    return value.reshape(()).item() if value is not None and value.size == 1 else None


# Operators whose every output value is one of their input values: on integers they compute
# what they compute on the dequantized values (resize only picking the nearest pixel).
_MOVES = frozenset(
    {
        "relax.reshape",
        "relax.permute_dims",
        "relax.expand_dims",
        "relax.squeeze",
        "relax.strided_slice",
        "relax.split",
        "relax.concat",
        "relax.nn.max_pool2d",
        "relax.image.resize2d",
    }
)


@relax.expr_functor.mutator
class _QuantizedMoves(relax.PyExprMutator):
    """quantize(move(dequantize(q, s, z)), s, z) -> move(q), through chains of moves and the
    fields of a split; concatenation when every part has the same s and z."""

    def __init__(self, mod: tvm.IRModule | None = None):
        super().__init__(mod)
        self._integer_splits: dict[
            tuple, relax.Var | None
        ] = {}  # (float split, parameters) -> the split of its integers

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not is_call(call, "relax.quantize"):
            return call
        parameters = _per_tensor(call)
        moved = self._quantized(call.args[0], parameters) if parameters else None
        return call if moved is None else moved

    def _quantized(self, expr: relax.Expr, parameters: tuple) -> relax.Expr | None:
        """The integers that quantize `expr` with `parameters`, computed by moving integers; None
        when `expr` is not dequantized integers moved."""
        value = bound_value(self, expr)
        if is_call(value, "relax.dequantize"):
            return value.args[0] if _per_tensor(value) == parameters else None
        if isinstance(value, relax.TupleGetItem):
            split = self._integer_split(value.tuple_value, parameters)
            return None if split is None else relax.TupleGetItem(split, value.index)
        if isinstance(value, relax.Call) and any(is_call(value, op) for op in _MOVES - {"relax.split"}):
            moved = self._moved(value, parameters)
            return None if moved is None else self.builder_.emit(moved)
        return None

    def _integer_split(self, parts: relax.Expr, parameters: tuple) -> relax.Var | None:
        """The split of the integers `parts` splits dequantized, emitted once for all its fields."""
        key = (parts, parameters)
        if key not in self._integer_splits:
            source = bound_value(self, parts)
            split = self._moved(source, parameters) if is_call(source, "relax.split") else None
            self._integer_splits[key] = None if split is None else self.builder_.emit(split)
        return self._integer_splits[key]

    def _moved(self, move: relax.Call, parameters: tuple) -> relax.Call | None:
        """`move` on the integers of its data, or None."""
        if is_call(move, "relax.image.resize2d") and (
            move.attrs.method != "nearest_neighbor" or move.attrs.out_dtype not in (None, "void")
        ):
            return None
        data = move.args[0]
        if is_call(move, "relax.concat"):
            parts = bound_value(self, data)
            fields = (
                [self._quantized(f, parameters) for f in parts.fields] if isinstance(parts, relax.Tuple) else [None]
            )
            quantized = None if any(f is None for f in fields) else relax.Tuple(fields)
        else:
            quantized = self._quantized(data, parameters)
        return None if quantized is None else relax.Call(move.op, [quantized, *move.args[1:]], move.attrs, move.ty_args)


def _per_tensor(call: relax.Call) -> tuple | None:
    """(scale, zero point, integer type) of a quantize or dequantize with one scale and zero
    point per tensor, or None."""
    _, scale, zero = call.args
    s, z = _scalar(scale), _scalar(zero)
    integers = call.attrs.out_dtype if is_call(call, "relax.quantize") else call.args[0].ty.dtype
    return None if s is None or z is None else (s, z, str(integers))


@relax.expr_functor.mutator
class _ElementWiseQuantization(relax.PyExprMutator):
    """quantize(x, s, z) = saturate(round(x * (1 / s)) + z) and dequantize(q, s, z) = (q - z) * s,
    for one scale and zero point per tensor, in float32: the operators relax's legalization
    of quantize / dequantize computes, each with a layout rule, but for the division: by the
    float32 reciprocal of s, a multiply in place of a far slower vector division. The product
    differs from the quotient by at most an ulp, so the integer differs only where the quotient
    lies within an ulp of a rounding tie, as onnxruntime's own int8 kernels requantize by
    multiplying with a combined scale."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        quantize, dequantize = is_call(call, "relax.quantize"), is_call(call, "relax.dequantize")
        if not (quantize or dequantize):
            return call
        value, parameters, out_dtype = call.args[0], _per_tensor(call), str(call.attrs.out_dtype)
        if (
            parameters is None
            or is_constant(value)
            or out_dtype not in (("uint8", "int8") if quantize else ("float32",))
        ):
            return call  # per-channel parameters, constant weights, other types: left as they are
        s, z, _ = parameters
        # of shape (1,), not scalars: LegalizeOps writes scalars into kernels as literals, and
        # every layer's scale would make its kernels a tuning task of their own
        zero_point = relax.const(np.array([z], np.float32))
        if dequantize:
            return relax.op.multiply(
                relax.op.subtract(relax.op.astype(value, "float32"), zero_point), relax.const(np.array([s], np.float32))
            )
        info = np.iinfo(out_dtype)
        reciprocal = relax.const(np.array([1], np.float32) / np.float32(s))
        rounded = relax.op.add(relax.op.round(relax.op.multiply(value, reciprocal)), zero_point)
        saturated = relax.op.clip(rounded, int(info.min), int(info.max))
        return relax.op.astype(saturated, out_dtype)


@relax.expr_functor.mutator
class _IntegerConvolutions(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not is_call(call, "relax.nn.conv2d") or not _is_plain_nhwc(call):
            return call
        activations = self._dequantized_activations(call.args[0])
        weights = self._dequantized_weights(call.args[1])
        if activations is None or weights is None:
            return call
        quantized, sx, zx = activations
        wq, sw = weights  # O x KH x KW x K, O scales
        channels_out, channels_in = wq.shape[0], wq.shape[3]
        if channels_out % INTEGER_LANES or channels_in % DOT_INPUTS:
            return call
        packed = wq.reshape(
            channels_out // INTEGER_LANES, INTEGER_LANES, *wq.shape[1:3], channels_in // DOT_INPUTS, DOT_INPUTS
        )
        packed = np.ascontiguousarray(packed.transpose(0, 2, 3, 4, 1, 5))
        attrs = call.attrs
        geometry = _Geometry(tuple(int(p) for p in attrs.padding), tuple(int(s) for s in attrs.strides), int(zx))
        acc = self.builder_.call_te(geometry.kernel, quantized, relax.const(packed), primfunc_name_hint=INTEGER_KERNEL)
        per_channel = (1, 1, 1, channels_out)
        sums = wq.astype(np.int32).reshape(channels_out, -1).sum(axis=1)
        corrected = relax.op.subtract(acc, relax.const((int(zx) * sums).astype(np.int32).reshape(per_channel)))
        scale = (np.float32(sx) * sw).astype(np.float32).reshape(per_channel)
        return relax.op.multiply(relax.op.astype(corrected, "float32"), relax.const(scale))

    def _dequantized_activations(self, data: relax.Expr):
        """(xq, sx, zx) if `data` is `(astype(xq, float32) - zx) * sx` of a uint8 tensor xq with one
        scale and zero point (the element-wise dequantize above), or its NCHW -> NHWC transpose
        (a model's input: then xq is transposed, in uint8), else None."""
        scaled = bound_value(self, data)
        if is_call(scaled, "relax.permute_dims") and [int(a) for a in scaled.attrs.axes] == _TO_NHWC:
            found = self._dequantized_activations(scaled.args[0])
            return (
                None if found is None else (self.builder_.emit(relax.op.permute_dims(found[0], _TO_NHWC)), *found[1:])
            )
        if not is_call(scaled, "relax.multiply"):
            return None
        shifted, sx = bound_value(self, scaled.args[0]), _scalar(bound_value(self, scaled.args[1]))
        if not is_call(shifted, "relax.subtract") or sx is None:
            return None
        widened, zx = bound_value(self, shifted.args[0]), _scalar(bound_value(self, shifted.args[1]))
        if not is_call(widened, "relax.astype") or zx is None or str(widened.args[0].ty.dtype) != "uint8":
            return None
        return widened.args[0], sx, zx

    def _dequantized_weights(self, weight: relax.Expr):
        """(wq as O x KH x KW x K int8, its O scales) if `weight` is the OIHW -> OHWI transpose
        of `dequantize` of constant int8 weights with zero points 0, else None."""
        transposed = bound_value(self, weight)
        if not is_call(transposed, "relax.permute_dims") or [int(a) for a in transposed.attrs.axes] != _TO_NHWC:
            return None
        dequantized = bound_value(self, transposed.args[0])
        if not is_call(dequantized, "relax.dequantize") or not all(is_constant(a) for a in dequantized.args):
            return None
        wq, sw, zw = (a.value.numpy() for a in dequantized.args)
        if wq.dtype != np.int8 or wq.ndim != 4 or np.any(zw != 0) or sw.size not in (1, wq.shape[0]):
            return None
        if sw.size > 1 and int(dequantized.attrs.axis) != 0:
            return None
        return wq.transpose(0, 2, 3, 1), np.broadcast_to(sw.astype(np.float32).reshape(-1), (wq.shape[0],))


TABLE_KERNEL = "byte_table"  # name of the lookup kernels
BROADCAST = 1  # relax OpPatternKind kBroadcast (its analysis would call a lookup opaque, which fuses with nothing)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) is inf below -88: the sigmoid is 0 there
        return np.float32(1) / (np.float32(1) + np.exp(-x))


# Element-wise operators a byte's table computes (float32, as NumPy has them); True: costlier per
# element than a lookup, so that a function with one of them becomes a table.
_TABLE_UNARY = {
    "relax.sigmoid": (_sigmoid, True),
    "relax.tanh": (np.tanh, True),
    "relax.exp": (np.exp, True),
    "relax.round": (np.round, False),
}
_TABLE_BINARY = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.divide": np.divide,
    "relax.maximum": np.maximum,
    "relax.minimum": np.minimum,
}


@dataclass(frozen=True)
class _OfOneByte:
    """A float32 value that is an element-wise function of one 8-bit tensor: its value for each
    of the 256 the tensor can hold (from its type's minimum up), and whether computing it costs
    more than looking it up."""

    source: relax.Expr
    values: np.ndarray
    costly: bool


@relax.expr_functor.mutator
class _ByteTables(relax.PyExprMutator):
    """A byte computed from one other byte q through a sigmoid, tanh or exp (SiLU as a QDQ graph
    writes it: dequantize, sigmoid, quantize, dequantize, multiply by the dequantized input,
    quantize) is a function of q alone: a lookup in a table of 256 bytes, computed here with
    NumPy from the element-wise operators the quantize and dequantize became, as onnxruntime's
    QLinearSigmoid looks it up. After the layout conversion, which has no rule for a
    lookup; a kernel of its own, marked broadcast so that element-wise operators after it fuse
    into it (TVM 0.27's analysis calls a lookup opaque, and fuses only element-wise operators
    into the convolution making q)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not is_call(call, "relax.astype") or str(call.attrs.dtype) not in ("uint8", "int8"):
            return call
        found = self._of_one_byte(call.args[0])
        if found is None or not found.costly or static_shape(found.source) is None:
            return call
        table = relax.const(found.values.astype(str(call.attrs.dtype)))
        lookup = self.builder_.call_te(_look_up, table, found.source, primfunc_name_hint=TABLE_KERNEL)
        kernel = lookup.args[0]
        self.builder_.update_func(kernel, self.builder_.get()[kernel].with_attr("op_pattern", BROADCAST))
        return lookup

    def _of_one_byte(self, expr: relax.Expr) -> _OfOneByte | None:
        value = bound_value(self, expr)
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None
        name = value.op.name
        if name == "relax.astype" and str(value.attrs.dtype) == "float32":
            return self._widened(value.args[0])
        if name in _TABLE_UNARY:
            inner = self._of_one_byte(value.args[0])
            function, costly = _TABLE_UNARY[name]
            return (
                None
                if inner is None
                else _OfOneByte(inner.source, function(inner.values).astype(np.float32), inner.costly or costly)
            )
        if name in _TABLE_BINARY:
            return self._binary(_TABLE_BINARY[name], value.args[0], value.args[1])
        return None

    def _widened(self, byte: relax.Expr) -> _OfOneByte | None:
        """An 8-bit tensor widened to float32: its values; through a table made here before."""
        dtype = str(byte.ty.dtype)
        if dtype not in ("uint8", "int8"):
            return None
        looked_up = bound_value(self, byte)
        if is_call(looked_up, "relax.call_tir") and looked_up.args[0].name_hint.startswith(TABLE_KERNEL):
            table, source = looked_up.args[1].fields
            return _OfOneByte(source, table.value.numpy().astype(np.float32), True)
        info = np.iinfo(dtype)
        return _OfOneByte(byte, np.arange(info.min, info.max + 1, dtype=np.float32), False)

    def _binary(self, operation, left: relax.Expr, right: relax.Expr) -> _OfOneByte | None:
        """Two functions of the same byte, or one and a float32 constant of one element."""
        sides = []
        for operand in (left, right):
            found = self._of_one_byte(operand)
            if found is None:
                constant = bound_value(self, operand)
                scalar = _scalar(constant)
                if scalar is None or str(constant.ty.dtype) != "float32":
                    return None
                found = np.float32(scalar)
            sides.append(found)
        functions = [side for side in sides if isinstance(side, _OfOneByte)]
        if not functions or not all(f.source.same_as(functions[0].source) for f in functions):
            return None
        values = [side.values if isinstance(side, _OfOneByte) else side for side in sides]
        return _OfOneByte(functions[0].source, operation(*values).astype(np.float32), any(f.costly for f in functions))


def _look_up(table: te.Tensor, q: te.Tensor) -> te.Tensor:
    """out[i] = table[q[i] - the byte type's minimum]."""
    offset = -int(np.iinfo(str(q.dtype)).min)
    return te.compute(q.shape, lambda *i: table[q(*i).astype("int32") + offset], name=TABLE_KERNEL)


def _is_plain_nhwc(call: relax.Call) -> bool:
    """An NHWC / OHWI convolution with groups 1, no dilation, float32 out, static shapes."""
    attrs = call.attrs
    return (
        str(attrs.data_layout) == "NHWC"
        and str(attrs.kernel_layout) == "OHWI"
        and str(attrs.out_layout) == "NHWC"
        and int(attrs.groups) == 1
        and [int(d) for d in attrs.dilation] == [1, 1]
        and str(call.ty.dtype) == "float32"
        and static_shape(call.args[0]) is not None
        and static_shape(call.args[1]) is not None
    )


@dataclass(frozen=True)
class _Geometry:
    """A convolution's padding (top, left, bottom, right), strides and the zero point it pads with."""

    padding: tuple[int, ...]
    strides: tuple[int, ...]
    zero_point: int

    def kernel(self, data: te.Tensor, packed: te.Tensor) -> te.Tensor:
        """out[n, h, w, o] = sum_(kh, kw, k) padded[n, h*sh + kh, w*sw + kw, k] * W[o, kh, kw, k]
        in int32, the input padded with the zero point, W read packed."""
        batch, height, width, channels_in = (int(d) for d in data.shape)
        blocks, kernel_h, kernel_w = (int(d) for d in packed.shape[:3])
        top, left, bottom, right = self.padding
        stride_h, stride_w = self.strides
        out_h = (height + top + bottom - kernel_h) // stride_h + 1
        out_w = (width + left + right - kernel_w) // stride_w + 1
        source = data
        if any(self.padding):
            zero = tvm.tirx.const(self.zero_point, "uint8")
            source = te.compute(
                (batch, height + top + bottom, width + left + right, channels_in),
                lambda n, h, w, k: te.if_then_else(
                    te.all(h >= top, h < height + top, w >= left, w < width + left), data[n, h - top, w - left, k], zero
                ),
                name="pad_temp",
            )
        kh, kw, k = (
            te.reduce_axis((0, kernel_h), "kh"),
            te.reduce_axis((0, kernel_w), "kw"),
            te.reduce_axis((0, channels_in), "k"),
        )
        return te.compute(
            (batch, out_h, out_w, blocks * INTEGER_LANES),
            lambda n, h, w, o: te.sum(
                source[n, h * stride_h + kh, w * stride_w + kw, k].astype("int32")
                * packed[o // INTEGER_LANES, kh, kw, k // DOT_INPUTS, o % INTEGER_LANES, k % DOT_INPUTS].astype(
                    "int32"
                ),
                axis=[kh, kw, k],
            ),
            name="integer_conv",
        )


# Before the layout conversion: integers moved where a quantized tensor only moves, then the
# per-tensor quantize and dequantize of activations as element-wise operators.
quantized_moves = rewrite_module_with(_QuantizedMoves, "QuantizedMoves")
element_wise_quantization = rewrite_with(_ElementWiseQuantization, "ElementWiseQuantization")
# After the conversion to NHWC: each convolution of dequantized uint8 activations by dequantized
# int8 weights (groups 1) as one integer kernel, its correction and its scale; then each costly
# function of one byte as a table.
integer_convolutions = rewrite_module_with(_IntegerConvolutions, "IntegerConvolutions")
byte_tables = rewrite_module_with(_ByteTables, "ByteTables")
