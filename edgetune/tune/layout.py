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
the same values.
"""

from __future__ import annotations

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
        [_clip_to_min_max, relax.transform.ConvertLayout(NHWC_CONVOLUTIONS), relax.transform.CanonicalizeBindings()]
    )(mod)


@relax.expr_functor.mutator
class _ClipToMinMax(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call, relax.Call):
            return call
        if call.op == tvm.ir.Op.get("relax.clip"):
            return self._clip(call)
        if call.op == tvm.ir.Op.get("relax.call_tir"):
            return self._tir_bound(call)
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


_TIR_BOUNDS = re.compile(r"(maximum|minimum)\d*$")


def _constant(bound: relax.Expr) -> float | None:
    """A clip bound's value, or None when it is not a constant."""
    value = getattr(bound, "value", None)
    value = getattr(value, "value", value)
    return float(value) if isinstance(value, (int, float)) else None


@tvm.transform.module_pass(opt_level=0, name="ClipToMinMax")
def _clip_to_min_max(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    rewritten = mod.clone()
    for global_var, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewritten[global_var] = _ClipToMinMax().visit_expr(func)
    return rewritten
