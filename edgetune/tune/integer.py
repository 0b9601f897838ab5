"""Integer pointwise convolutions for quantized models (`models[].quantized_weights: integer`).

A quantized (QDQ) ONNX model, as onnxruntime's quantizer writes it, computes each convolution
on `DequantizeLinear` outputs: x = sx * (xq - zx) of a uint8 tensor xq (one scale sx and zero
point zx per tensor), w = sw[o] * wq of int8 weights (a scale per output channel, zero point 0).
TVM imports it that way and computes the convolution in float32. A 1x1 convolution (groups 1,
stride 1, no padding) is instead

    y[o] = sx * sw[o] * (sum_k xq[k] * wq[o, k] - zx * sum_k wq[o, k])

an integer GEMM of uint8 by int8 into int32 (AVX-512 VNNI's `vpdpbusd` does 64 such products
per instruction, 3.2-3.7x the float32 micro-kernel's rate here: bench/low_precision.py) and a
per-channel correction and scale, which fuse into the kernel's epilogue. Before the layout
conversion, `integer_arithmetic` rewrites every such convolution whose output channels are a
multiple of INTEGER_LANES and input channels of DOT_INPUTS into that form, and writes the
per-tensor quantize / dequantize operators of the activations as the element-wise Relax
operators they compute (TVM 0.27's ConvertLayout has no rule for quantize and dequantize, and
wraps each in a transpose pair: 108 in YOLOv8n's quantized model). The other convolutions keep
float32 arithmetic, their int8 weights widened at build. After the conversion to NHWC,
`pack_integer_pointwise` makes each integer GEMM one kernel whose weight is laid out in the
order the VNNI instruction reads it, (O/16, K/4, 16, 4), as a constant: the schedule rule
edgetune.tune.schedule_rules.integer tiles and tensorizes it.

The arithmetic is exact up to the float32 scale (onnxruntime's QLinearConv computes the same
integer sum); the activations' quantize keeps ONNX's round-half-to-even and saturation.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te

from edgetune.tune.graph import bound_value, is_call, is_constant, rewrite_with, static_shape

INTEGER_LANES = 16  # int32 accumulators per VNNI instruction: output channels come in 16s
DOT_INPUTS = 4  # uint8 x int8 products summed per lane: input channels come in 4s
INTEGER_KERNEL = "integer_pointwise"  # name of the packed kernel (and of its tuning task)


def integer_arithmetic(mod: tvm.IRModule) -> tvm.IRModule:
    """Step 1, on the imported NCHW module: 1x1 convolutions of dequantized uint8 activations
    by dequantized int8 weights as integer GEMMs plus their correction; per-tensor quantize and
    dequantize as element-wise operators."""
    return tvm.transform.Sequential(
        [_integer_convolutions, _element_wise_quantization, relax.transform.DeadCodeElimination()]
    )(mod)


def pack_integer_pointwise(mod: tvm.IRModule) -> tvm.IRModule:
    """Step 2, on the NHWC module: each integer GEMM as one kernel reading its weight packed
    (O/16, K/4, 16, 4)."""
    folded = relax.transform.FoldConstant()(mod)  # the weights' layout transposes, into constants
    return _PackedPointwise(folded).transform()


def _scalar(expr: relax.Expr) -> float | int | None:
    """The one value of a constant of one element, or None."""
    if not is_constant(expr):
        return None
    value = expr.value.numpy()
    return value.reshape(()).item() if value.size == 1 else None


@relax.expr_functor.mutator
class _IntegerConvolutions(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not is_call(call, "relax.nn.conv2d") or not _is_plain_pointwise(call):
            return call
        data, weight = (bound_value(self, arg) for arg in call.args)
        if not (is_call(data, "relax.dequantize") and is_call(weight, "relax.dequantize")):
            return call
        quantized, data_scale, data_zero = data.args
        weights, weight_scale, weight_zero = weight.args
        sx, zx = _scalar(data_scale), _scalar(data_zero)
        if sx is None or zx is None or str(quantized.ty.dtype) != "uint8":
            return call
        if not all(is_constant(e) for e in (weights, weight_scale, weight_zero)):
            return call
        wq, sw, zw = (e.value.numpy() for e in (weights, weight_scale, weight_zero))
        channels_out, channels_in = wq.shape[:2]
        if wq.dtype != np.int8 or np.any(zw != 0) or sw.size not in (1, channels_out):
            return call
        if channels_out % INTEGER_LANES or channels_in % DOT_INPUTS:
            return call
        sums = wq.astype(np.int32).reshape(channels_out, -1).sum(axis=1)
        per_channel = (1, channels_out, 1, 1)
        acc = relax.op.nn.conv2d(quantized, weights, data_layout="NCHW", kernel_layout="OIHW", out_dtype="int32")
        corrected = relax.op.subtract(acc, relax.const((int(zx) * sums).astype(np.int32).reshape(per_channel)))
        scale = (np.float32(sx) * np.broadcast_to(sw.astype(np.float32), (channels_out,))).reshape(per_channel)
        return relax.op.multiply(relax.op.astype(corrected, "float32"), relax.const(scale.astype(np.float32)))


def _is_plain_pointwise(call: relax.Call) -> bool:
    """A 1x1 NCHW convolution with groups 1, stride 1, no padding or dilation, float32 out."""
    attrs = call.attrs
    kernel = static_shape(call.args[1])
    return (
        kernel is not None and kernel[2:] == (1, 1) and int(attrs.groups) == 1
        and str(attrs.data_layout) == "NCHW" and str(attrs.kernel_layout) == "OIHW"
        and [int(s) for s in attrs.strides] == [1, 1] and [int(d) for d in attrs.dilation] == [1, 1]
        and not any(int(p) for p in attrs.padding) and str(call.ty.dtype) == "float32"
    )  # fmt: skip


@relax.expr_functor.mutator
class _ElementWiseQuantization(relax.PyExprMutator):
    """quantize(x, s, z) = saturate(round(x / s) + z) and dequantize(q, s, z) = (q - z) * s,
    for one scale and zero point per tensor, in float32: the operators relax's legalization
    of quantize / dequantize computes, each with a layout rule."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        quantize, dequantize = is_call(call, "relax.quantize"), is_call(call, "relax.dequantize")
        if not (quantize or dequantize):
            return call
        value, scale, zero = call.args
        s, z = _scalar(scale), _scalar(zero)
        if s is None or z is None or is_constant(value) or str(call.attrs.out_dtype) not in ("uint8", "int8", "float32"):
            return call  # per-channel parameters, constant weights: left as they are
        # of shape (1,), not scalars: LegalizeOps writes scalars into kernels as literals, and
        # every layer's scale would make its kernels a tuning task of their own
        s, z = relax.const(np.array([s], np.float32)), relax.const(np.array([z], np.float32))
        if dequantize:
            return relax.op.multiply(relax.op.subtract(relax.op.astype(value, "float32"), z), s)
        info = np.iinfo(str(call.attrs.out_dtype))
        rounded = relax.op.add(relax.op.round(relax.op.divide(value, s)), z)
        saturated = relax.op.clip(rounded, int(info.min), int(info.max))
        return relax.op.astype(saturated, str(call.attrs.out_dtype))


@relax.expr_functor.mutator
class _PackedPointwise(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self._mod = mod

    def transform(self) -> tvm.IRModule:
        for global_var, func in self._mod.functions_items():
            if isinstance(func, relax.Function):
                self.builder_.update_func(global_var, self.visit_expr(func))
        return self.builder_.get()

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not is_call(call, "relax.nn.conv2d") or str(call.attrs.out_dtype) != "int32":
            return call
        data, weight = call.args
        if str(call.attrs.data_layout) != "NHWC" or str(call.attrs.kernel_layout) != "OHWI" or not is_constant(weight):
            return call
        filters = weight.value.numpy()  # O x 1 x 1 x K
        channels_out, channels_in = filters.shape[0], filters.shape[3]
        packed = filters.reshape(channels_out // INTEGER_LANES, INTEGER_LANES, channels_in // DOT_INPUTS, DOT_INPUTS)
        packed = np.ascontiguousarray(packed.transpose(0, 2, 1, 3))
        return self.builder_.call_te(_packed_gemm, data, relax.const(packed), primfunc_name_hint=INTEGER_KERNEL)


def _packed_gemm(data: te.Tensor, packed: te.Tensor) -> te.Tensor:
    """out[n, h, w, o] = sum_k data[n, h, w, k] * W[o, k] in int32, W read packed."""
    channels_in = data.shape[3]
    channels_out = packed.shape[0] * INTEGER_LANES
    k = te.reduce_axis((0, channels_in), "k")
    return te.compute(
        (*data.shape[:3], channels_out),
        lambda n, h, w, o: te.sum(
            data[n, h, w, k].astype("int32")
            * packed[o // INTEGER_LANES, k // DOT_INPUTS, o % INTEGER_LANES, k % DOT_INPUTS].astype("int32"),
            axis=k,
        ),
        name="integer_gemm",
    )


_integer_convolutions = rewrite_with(_IntegerConvolutions, "IntegerConvolutions")
_element_wise_quantization = rewrite_with(_ElementWiseQuantization, "ElementWiseQuantization")
