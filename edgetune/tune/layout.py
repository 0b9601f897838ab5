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
(ppocr-rec had 35 such pairs; the nine of one shape took 2.6 ms of its 20 ms). Such constants are first given the tensor's
rank by leading dimensions of 1 (a scalar if they hold one value), which broadcasts the same
values, so the rule permutes them. The rule also takes the layout of the first operand, so a
constant first (PP-LCNetV3's `Mul(scale, x)`) is moved second where the operator commutes; a
subtraction or division from a constant of several values is left in its transpose pair.
"""

from __future__ import annotations

import functools
import re

import tvm
from tvm import relax

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
        if len(bound.ty.shape) != 0 or bound.ty.dtype != value.ty.dtype:
            return call
        operator = relax.op.maximum if kernel.group(1) == "maximum" else relax.op.minimum
        return operator(value, bound)

    def _stacked_extreme(self, call: relax.Call) -> relax.Expr:
        """`max|min(stack((broadcast_to(a), broadcast_to(b), ...)), axis=0)`, as the ONNX
        frontend emits Max and Min: `maximum|minimum(maximum|minimum(a, b), ...)`."""
        stacked = self._bound(call.args[0])
        axes = [int(a) for a in call.attrs.axis] if call.attrs.axis is not None else None
        if axes != [0] or call.attrs.keepdims or not _is_call(stacked, "relax.stack") or int(stacked.attrs.axis) != 0:
            return call
        tensors = self._bound(stacked.args[0])
        if not isinstance(tensors, relax.Tuple):
            return call
        inputs = []
        for field in tensors.fields:
            value = self._bound(field)
            inputs.append(value.args[0] if _is_call(value, "relax.broadcast_to") else field)
        return functools.reduce(_STACKED_EXTREMES[call.op], inputs)

    def _bound(self, expr: relax.Expr) -> relax.Expr:
        """The value a variable is bound to in the function (the expression itself otherwise)."""
        value = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        return expr if value is None else value


_TIR_BOUNDS = re.compile(r"(maximum|minimum)\d*$")
_STACKED_EXTREMES = {tvm.ir.Op.get("relax.max"): relax.op.maximum, tvm.ir.Op.get("relax.min"): relax.op.minimum}


def _is_call(expr: relax.Expr, op: str) -> bool:
    return isinstance(expr, relax.Call) and expr.op.same_as(tvm.ir.Op.get(op))


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
        if _is_constant(left) == _is_constant(right):
            return call  # two tensors (ConvertLayout's own case), or constants only
        operands = [_reshaped(left, _rank(right)), _reshaped(right, _rank(left))]
        if commutative and _is_constant(left) and _rank(operands[0]) != 0:
            operands.reverse()
        if all(new.same_as(old) for new, old in zip(operands, call.args)):
            return call
        return relax.Call(call.op, operands, call.attrs)


def _is_constant(expr: relax.Expr) -> bool:
    return isinstance(expr, tvm.ir.GenericConst)


def _rank(expr: relax.Expr) -> int | None:
    shape = getattr(expr.ty, "shape", None)
    return len(shape) if shape is not None else None


def _reshaped(operand: relax.Expr, rank: int | None) -> relax.Expr:
    """`operand` if it is not a constant of lower or equal rank than `rank`, else the same
    broadcast values as a scalar (one value) or with leading dimensions of 1 up to `rank`."""
    if not _is_constant(operand) or rank is None:
        return operand
    value = operand.value.numpy()
    if value.ndim == 0 or value.ndim > rank or (value.ndim == rank and value.size > 1):
        return operand
    if value.size == 1:
        return relax.const(value.reshape(()))
    return relax.const(value.reshape((1,) * (rank - value.ndim) + value.shape))


def _rewrite_with(mutator: type[relax.PyExprMutator], name: str) -> tvm.transform.Pass:
    """A pass that rewrites every Relax function of a module with `mutator`."""
    return relax.transform.function_pass(lambda func, _mod, _ctx: mutator().visit_expr(func), opt_level=0, name=name)


_to_relax_min_max = _rewrite_with(_MinMaxOperators, "ToRelaxMinMax")
_constants_layout_can_follow = _rewrite_with(_ConstantsLayoutCanFollow, "ConstantsLayoutCanFollow")
