"""Functions of `exp` legalized to code the CPU runs in SIMD registers.

LLVM has no vector `exp` on these targets (TVM links no vector math library), so a vectorized
`exp` becomes one scalar libm `expf` call per lane. Every sigmoid computes one, and SiLU
(x * sigmoid(x)) follows every convolution of YOLO-family detectors: in a tuned YOLOv8n
kernel the `expf` calls took about 30 % of the kernel's time, and its one softmax (the box
head's distribution over 16 bins) took 6.1 ms of the model's 28 ms against onnxruntime's 1.2 ms.
`prepare` therefore legalizes float32 `relax.sigmoid` as 1 / (1 + fast_exp(-x)) and float32
`relax.nn.softmax` as TVM's `topi.nn.fast_softmax`, both with TVM's own polynomial `fast_exp`
(`topi.fast_exp`, inputs clamped to float32's exp range), which stays in vector registers.
Measured against float64 NumPy on 2M points of [-88, 88]: absolute error <= 8.9e-8, as libm's;
relative error <= 3.9e-7 with FMA (icelake-server) and <= 4.1e-6 without (x86-64-v2), the
largest where the sigmoid is below 1e-30 (libm: 1.5e-7); Hypothesis found 5.1e-6 on a softmax
output of 4.8e-30 without FMA. Softmax over 1x16x4x2100 normal
inputs (x5): relative error 1.3e-6, as with libm's exp (float32 rounding of the sum). YOLOv8n's
softmax kernel, tuned alone on the host: 0.16 ms after 16 trials, where the 8 trials tuned with
libm's exp had measured 5-30 ms; the whole model went from 25.3 to 19.7 ms (bench run-j).
onnxruntime's CPU kernels approximate exp and the logistic
function too.
"""

from __future__ import annotations

import tvm
from tvm import relax, topi


def _fast_sigmoid(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    if call.args[0].ty.dtype != "float32":  # fast_exp's polynomial is for float32 only
        return _usual(bb, call)
    return bb.call_te(
        lambda x: topi.divide(1.0, topi.add(1.0, topi.fast_exp(topi.negative(x)))), call.args[0],
        primfunc_name_hint="sigmoid",
    )


def _fast_softmax(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    if call.args[0].ty.dtype != "float32":
        return _usual(bb, call)
    return bb.call_te(topi.nn.fast_softmax, call.args[0], call.attrs.axis, primfunc_name_hint="softmax")


def _usual(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """The operator's registered legalization."""
    return call.op.get_attr("FLegalize")(bb, call)


FAST_LEGALIZATIONS = {"relax.sigmoid": _fast_sigmoid, "relax.nn.softmax": _fast_softmax}


def legalize_fast_math() -> tvm.transform.Pass:
    """Legalize the operators of FAST_LEGALIZATIONS their fast way (and every other the usual way)."""
    return relax.transform.LegalizeOps(customize_legalize_map=FAST_LEGALIZATIONS)
