"""Element-wise math functions legalized to code the CPU runs in SIMD registers.

`legalize_fast_math()` is the pipeline's LegalizeOps with the float32 operators of
FAST_LEGALIZATIONS (sigmoid, softmax, exp, erf, GELU, tanh, log) computed by approximations made
only of vectorizable operations (multiply-adds, one division, floor, min/select, bit
reinterpretation); `exp_element`, `erf_element`, `tanh_element` and `log_element` are those
approximations for one value. docs/compiler.md has their method and accuracy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tvm
from tvm import relax, te, tirx, topi

FLOAT32 = "float32"

# The polynomials below are least-squares fits in float64 on 4000 Chebyshev nodes of their
# interval (bench/vector_math.py --fit prints them again), lowest degree first.
# erf(x) / x as a polynomial in x*x on [0, 1]: relative error of the fit 1.6e-9.
ERF_NEAR_ZERO = (
    1.1283791665931535,
    -0.37612629877675247,
    0.11283625725080641,
    -0.026855399451923938,
    0.005191218377152957,
    -0.0008034846648109572,
    7.933493880476785e-05,
)
# erfc(x) on [1, 4] as a polynomial in u = (x - 2.5) / 1.5: absolute error of the fit 1.0e-8
# (erf = 1 - erfc there; no exp, no division).
ERFC_TAIL = (
    0.0004069523677220567,
    -0.003267276918907241,
    0.012252799467988866,
    -0.028187222659510118,
    0.04365193425714466,
    -0.04639105123457271,
    0.03186589637011229,
    -0.009574278361970728,
    -0.006630969919702621,
    0.010403472540548778,
    -0.004676661940057579,
    -0.0015362171722322273,
    0.0020395178243097253,
    -9.703090104029841e-05,
    -0.0002598570787264126,
)
# (tanh(x) / x - 1) / (x*x) as a polynomial in x*x on [0, 0.625]: relative error of the fit 1.6e-7
# (of a term that is at most 12 % of tanh(x)).
TANH_NEAR_ZERO = (
    -0.33333331408508776,
    0.1333289074500668,
    -0.053863926634108966,
    0.021045719495215238,
    -0.006155235444199493,
)
# (log1p(f) - f + f*f/2) / f**3 as a polynomial in f on [sqrt(1/2) - 1, sqrt(2) - 1]:
# relative error of the fit 7.2e-8 (of a term that is at most 6 % of log1p(f)).
LOG1P_CUBIC_TERM = (
    0.33333331157957125,
    -0.2499998905997379,
    0.200007103338201,
    -0.16668480481942854,
    0.1424987154971764,
    -0.12411021389048826,
    0.11662002792586368,
    -0.11571514180892868,
    0.0714893299192142,
)
# Cephes expf (S. L. Moshier): exp(r) = 1 + r + r*r * polynomial(r) on |r| <= ln(2)/2,
# and ln(2) split in a part exact in float32 and the rest.
EXP_SQUARED_TERM = (
    5.0000001201e-1,
    1.6666665459e-1,
    4.1665795894e-2,
    8.3334519073e-3,
    1.3981999507e-3,
    1.9875691500e-4,
)
LN2_HIGH, LN2_LOW = 0.693359375, -2.12194440e-4

# Beyond these |x|, erf and tanh round to +-1 in float32 (1 - erf(4) = 1.5e-8 and
# 1 - tanh(10) = 4.1e-9, both below half an ulp of 1, 3.0e-8).
ERF_SATURATES, TANH_SATURATES = 4.0, 10.0


def _f32(value: float) -> tirx.PrimExpr:
    return tirx.const(value, FLOAT32)


def _polynomial(t: tirx.PrimExpr, coefficients: Sequence[float]) -> tirx.PrimExpr:
    """Horner's rule, coefficients lowest degree first."""
    result = _f32(coefficients[-1])
    for coefficient in reversed(coefficients[:-1]):
        result = result * t + _f32(coefficient)
    return result


def _power_of_two(n: tirx.PrimExpr) -> tirx.PrimExpr:
    """2**n for a whole float32 n in [-126, 127], built from its exponent bits."""
    return tirx.reinterpret(FLOAT32, (tirx.Cast("int32", n) + 127) << 23)


def exp_element(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """exp of a float32 scalar: Cephes expf's reduction x = n ln(2) + r and polynomial, scaled
    by 2**n in two halves so that results overflow to inf and underflow through the subnormals
    as float32 rounding has them (x is clamped where exp is inf or 0 anyway)."""
    clamped = tirx.min(tirx.max(x, _f32(-104.0)), _f32(89.0))
    n = tirx.floor(clamped * _f32(1.4426950408889634) + _f32(0.5))  # in [-150, 128]
    r = clamped - n * _f32(LN2_HIGH) - n * _f32(LN2_LOW)
    half_n = tirx.floor(n * _f32(0.5))
    scaled = (_f32(1.0) + r + r * r * _polynomial(r, EXP_SQUARED_TERM)) * _power_of_two(half_n)
    return tirx.Select(tirx.isnan(x), x, scaled * _power_of_two(n - half_n))


def erf_element(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """erf of a float32 scalar: x * P(x*x) below |x| = 1, 1 - Q((|x| - 2.5) / 1.5) above."""
    magnitude = tirx.abs(x)
    near_zero = x * _polynomial(x * x, ERF_NEAR_ZERO)
    tail_u = (tirx.min(magnitude, _f32(ERF_SATURATES)) - _f32(2.5)) * _f32(1.0 / 1.5)
    tail = _f32(1.0) - _polynomial(tail_u, ERFC_TAIL)
    # NaN fails the comparison and stays NaN through near_zero; copysign keeps erf(-0) = -0
    return tirx.copysign(tirx.Select(magnitude >= _f32(1.0), tail, near_zero), x)


def tanh_element(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """tanh of a float32 scalar: x + x**3 * P(x*x) below |x| = 0.625, 1 - 2 / (exp(2|x|) + 1) above."""
    magnitude, square = tirx.abs(x), x * x
    near_zero = x + x * square * _polynomial(square, TANH_NEAR_ZERO)
    growth = exp_element(_f32(2.0) * tirx.min(magnitude, _f32(TANH_SATURATES)))
    tail = _f32(1.0) - _f32(2.0) / (growth + _f32(1.0))
    return tirx.copysign(tirx.Select(magnitude >= _f32(0.625), tail, near_zero), x)


def log_element(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """Natural log of a float32 scalar: x = m * 2**e with m in [sqrt(1/2), sqrt(2)), read from
    the bits (subnormals scaled by 2**23 first), then e * ln(2) + log1p(m - 1)."""
    subnormal = x < _f32(1.1754943508222875e-38)
    normal_x = tirx.Select(subnormal, x * _f32(8388608.0), x)
    bits = tirx.reinterpret("int32", normal_x)
    exponent = (bits >> 23) - 127 - tirx.Select(subnormal, tirx.const(23, "int32"), tirx.const(0, "int32"))
    mantissa = tirx.reinterpret(FLOAT32, (bits & 0x007FFFFF) | 0x3F800000)  # in [1, 2)
    above_sqrt2 = mantissa > _f32(1.4142135623730951)
    f = tirx.Select(above_sqrt2, mantissa * _f32(0.5), mantissa) - _f32(1.0)
    e = tirx.Cast(FLOAT32, exponent + tirx.Select(above_sqrt2, tirx.const(1, "int32"), tirx.const(0, "int32")))
    square = f * f
    log1p = f - _f32(0.5) * square + square * f * _polynomial(f, LOG1P_CUBIC_TERM)
    finite_positive = e * _f32(LN2_LOW) + log1p + e * _f32(LN2_HIGH)
    special = tirx.Select(x == _f32(0.0), _f32(-float("inf")), tirx.Select(x > _f32(0.0), x, _f32(float("nan"))))
    return tirx.Select(tirx.And(x > _f32(0.0), x < _f32(float("inf"))), finite_positive, special)


def _gelu_element(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """x * Phi(x), as TVM's own legalization of relax.nn.gelu writes it."""
    return x * (_f32(0.5) + _f32(0.5) * erf_element(x * _f32(0.5**0.5)))


def _gelu_tanh_element(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """GELU's tanh approximation, as TVM's own legalization of relax.nn.gelu_tanh writes it."""
    inner = _f32((2.0 / 3.141592653589793) ** 0.5) * x * (_f32(1.0) + _f32(0.044715) * x * x)
    return _f32(0.5) * x * (_f32(1.0) + tanh_element(inner))


def _usual(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """The operator's registered legalization."""
    return call.op.get_attr("FLegalize")(bb, call)


def _float32_elementwise(
    element: Callable[[tirx.PrimExpr], tirx.PrimExpr], name: str
) -> Callable[[relax.BlockBuilder, relax.Call], relax.Expr]:
    """A legalization computing `element` per value of a float32 tensor (others the usual way)."""

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        if call.args[0].ty.dtype != FLOAT32:  # the approximations are fitted for float32 only
            return _usual(bb, call)
        return bb.call_te(
            lambda x: te.compute(x.shape, lambda *index: element(x(*index)), name=name),
            call.args[0],
            primfunc_name_hint=name,
        )

    return legalize


def _fast_sigmoid(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    if call.args[0].ty.dtype != FLOAT32:  # fast_exp's polynomial is for float32 only
        return _usual(bb, call)
    return bb.call_te(
        lambda x: topi.divide(1.0, topi.add(1.0, topi.fast_exp(topi.negative(x)))),
        call.args[0],
        primfunc_name_hint="sigmoid",
    )


def _fast_softmax(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    if call.args[0].ty.dtype != FLOAT32:
        return _usual(bb, call)
    return bb.call_te(topi.nn.fast_softmax, call.args[0], call.attrs.axis, primfunc_name_hint="softmax")


FAST_LEGALIZATIONS = {
    "relax.sigmoid": _fast_sigmoid,
    "relax.nn.softmax": _fast_softmax,
    "relax.exp": _float32_elementwise(exp_element, "tir_exp"),
    "relax.erf": _float32_elementwise(erf_element, "erf"),
    "relax.nn.gelu": _float32_elementwise(_gelu_element, "gelu"),
    "relax.tanh": _float32_elementwise(tanh_element, "tir_tanh"),
    "relax.nn.gelu_tanh": _float32_elementwise(_gelu_tanh_element, "gelu_tanh"),
    "relax.log": _float32_elementwise(log_element, "tir_log"),
}


def legalize_fast_math() -> tvm.transform.Pass:
    """Legalize the operators of FAST_LEGALIZATIONS their fast way (and every other the usual way)."""
    return relax.transform.LegalizeOps(customize_legalize_map=FAST_LEGALIZATIONS)
