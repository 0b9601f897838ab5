"""The layout a model's convolutions are compiled in (`models[].layout`): NCHW as ONNX graphs
have it, or NHWC.

In NHWC the channels are innermost: a pointwise convolution becomes a GEMM whose output
channels are contiguous, so its micro-kernel vectorizes over them, and a depthwise convolution
vectorizes across channels instead of across a short image row. The model keeps its inputs
and outputs as declared: one transpose at each end (bench/README.md has the measurements).
`prepare` then hands the pointwise kernels to a GEMM micro-kernel schedule rule
(edgetune.tune.schedule_rules.convolution) and the depthwise ones to a register-tiled one
(edgetune.tune.schedule_rules.depthwise).

Relax's ConvertLayout moves every operator that has a layout rule. Clips have none in TVM
0.27: `relax.clip`, and the ONNX frontend's Clip, which it emits as calls of TIR `maximum` and
`minimum` kernels with a scalar bound. Left so, each would be wrapped in a transpose pair,
which also splits each convolution from its activation when kernels are fused. So they are
first rewritten to the Relax operators `maximum` and `minimum`, which have rules and compute
the same values. So is the frontend's Max and Min of several tensors (ONNX Max, Min), which it
emits as a `max`/`min` reduction over a `stack` of the inputs broadcast to one shape: that
stack of rank 5 makes ConvertLayout fail outright (TVM 0.27: "Invalid SLayout").

A constant of lower rank than the tensor it is broadcast against, such as the scalar scale and
bias of shape (1,) of PP-LCNetV3's learnable affine blocks, stops ConvertLayout too: TVM 0.27's
layout rule of binary operators gives up on it and wraps the operator in a transpose pair
(ppocr-rec had 35 such pairs; the nine of one shape took 2.6 ms of its 20 ms). Such constants
are first given the tensor's rank by leading dimensions of 1, which broadcasts the same values,
so the rule permutes them. The rule also takes the layout of the first operand, so a constant
first (PP-LCNetV3's `Mul(scale, x)`) is moved second where the operator commutes, or else
becomes a scalar if it holds one value; a subtraction or division from a constant of several
values is left in its transpose pair.

A matrix product with a constant weight (a dense layer: `MatMul(x, W)` with W of K x N) is
the same GEMM as a 1x1 convolution of a 1 x 1 x M image of K channels, M the product of x's
leading dimensions; in NHWC it is written as one, so that the pointwise micro-kernel rule
schedules it. Stock MetaSchedule ran ppocr-rec's 40 x 120 x 6625 classifier at 35 % of the
fp32 peak. When no vector of MIN_LANES or more divides N (6625 = 5^3 x 53), the weight gets
zero output channels up to a multiple of PADDED_CHANNELS and the extra outputs are sliced off.
Only dense layers whose M the rule's row tiles divide are rewritten: stock MetaSchedule, given
such a padded and sliced kernel of one row (a classifier head), computed the convolution under
the slice's loop, and RewriteLayout then pre-packed the weight with the index map `o % 10` of
the 10 outputs kept: the 6 zero filters overwrote real ones and the tuned model answered wrong
(TVM 0.27; the toy cnn of bench/ in run-u).
"""

from __future__ import annotations

import functools
import math
import re

import numpy as np
import tvm
from tvm import relax

from edgetune.tune.graph import bound_value, is_call, is_constant, rewrite_with, static_shape
from edgetune.tune.schedule_rules.common import MIN_LANES, row_tiles

PADDED_CHANNELS = 16  # float32 lanes of an AVX-512 register: the widest the rules tile
# Transposed convolutions stay NCHW: Relax legalizes them in no other layout (TVM 0.27).
NHWC_CONVOLUTIONS = {"relax.nn.conv2d": ["NHWC", "OHWI"], "relax.nn.conv2d_transpose": ["NCHW", "IOHW"]}


def convert_layout(mod: tvm.IRModule, layout: str) -> tvm.IRModule:
    """`mod` with its convolutions in `layout` (one of schema.LAYOUTS); NCHW leaves it as it is."""
    if layout == "NCHW":
        return mod
    return tvm.transform.Sequential(
        [
            _to_relax_min_max,
            relax.transform.DeadCodeElimination(),  # the stacks left unused
            _constants_layout_can_follow,
            _dense_as_pointwise,
            relax.transform.ConvertLayout(NHWC_CONVOLUTIONS),
            relax.transform.CanonicalizeBindings(),
        ]
    )(mod)


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
_BROADCASTING = {tvm.ir.Op.get(f"relax.{name}"): name in _COMMUTATIVE
                 for name in ("add", "subtract", "multiply", "divide", "power", *_COMMUTATIVE)}  # fmt: skip


@relax.expr_functor.mutator
class _ConstantsLayoutCanFollow(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        commutative = _BROADCASTING.get(call.op) if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) else None
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


@relax.expr_functor.mutator
class _DenseAsPointwise(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not is_call(call, "relax.matmul"):
            return call
        data, weight = call.args
        leading = (static_shape(data) or ())[:-1]  # () also for a vector or a dynamic shape
        matrix = weight.value.numpy() if is_constant(weight) else None
        if not leading or matrix is None or matrix.ndim != 2:
            return call
        if {str(data.ty.dtype), str(matrix.dtype)} != {"float32"}:
            return call  # the micro-kernel rules are float32 only
        rows = math.prod(leading)
        if not row_tiles(rows):
            return call  # not a kernel the rule would take
        channels_in, channels_out = matrix.shape
        padded = channels_out if channels_out % MIN_LANES == 0 else -(-channels_out // PADDED_CHANNELS) * PADDED_CHANNELS
        filters = np.zeros((padded, 1, 1, channels_in), matrix.dtype)
        filters[:channels_out, 0, 0, :] = matrix.T
        image = relax.op.reshape(data, (1, 1, rows, channels_in))
        out = relax.op.nn.conv2d(image, relax.const(filters), data_layout="NHWC", kernel_layout="OHWI")
        if padded != channels_out:
            out = relax.op.strided_slice(out, axes=[3], begin=[0], end=[channels_out])
        return relax.op.reshape(out, (*leading, channels_out))


_to_relax_min_max = rewrite_with(_MinMaxOperators, "ToRelaxMinMax")
_constants_layout_can_follow = rewrite_with(_ConstantsLayoutCanFollow, "ConstantsLayoutCanFollow")
_dense_as_pointwise = rewrite_with(_DenseAsPointwise, "DenseAsPointwise")
