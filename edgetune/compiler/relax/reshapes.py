"""Reshapes moved below the element-wise operators that follow them, so that a dense layer's
bias and activation fuse into its convolution.

A dense layer written as a pointwise convolution (`relax/layout.py`) is followed by reshapes back
to the model's shape, and the model's bias, GELU or residual come after them; Relax fuses no
element-wise operator across a reshape into the convolution, and the reshapes inlined into an
element-wise kernel index it with divisions that keep it from vectorizing. `reshapes_last`
rewrites op(reshape(x)) as reshape(op(x)) wherever that computes the same, then merges the
reshapes that meet and drops those that change nothing.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tvm
from tvm import relax

from edgetune.compiler.relax.graph import bound_value, is_call, is_constant, rewrite_with, static_shape

# Operators that compute each value from the value at the same position alone.
UNARY = frozenset(
    f"relax.{name}"
    for name in ("abs", "erf", "exp", "negative", "sigmoid", "sqrt", "rsqrt", "tanh", "nn.relu", "nn.gelu", "nn.silu")
)
BINARY = frozenset(f"relax.{name}" for name in ("add", "subtract", "multiply", "divide", "maximum", "minimum"))


class _Reshape(NamedTuple):
    source: relax.Expr  # what the reshape (or the first of a chain of them) reshapes
    source_shape: tuple[int, ...]
    shape: tuple[int, ...]


@relax.expr_functor.mutator
class _ReshapesLast(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
            return call
        if call.op.name in UNARY and len(call.args) == 1:
            return self._unary(call)
        if call.op.name in BINARY and len(call.args) == 2:
            return self._binary(call)
        return call

    def _reshaped(self, expr: relax.Expr) -> _Reshape | None:
        """The static reshape `expr` is bound to, its source the first of a chain of reshapes."""
        value = bound_value(self, expr)
        if not is_call(value, "relax.reshape"):
            return None
        source = value.args[0]
        while is_call(bound_value(self, source), "relax.reshape"):
            source = bound_value(self, source).args[0]
        source_shape, shape = static_shape(source), static_shape(value)
        return None if source_shape is None or shape is None else _Reshape(source, source_shape, shape)

    def _unary(self, call: relax.Call) -> relax.Expr:
        reshape = self._reshaped(call.args[0])
        if reshape is None:
            return call
        return self._reshape_of(relax.Call(call.op, [reshape.source], call.attrs), reshape.shape)

    def _binary(self, call: relax.Call) -> relax.Expr:
        left, right = (self._reshaped(arg) for arg in call.args)
        if left is not None and right is not None:
            if left.source_shape != right.source_shape or left.shape != right.shape:
                return call
            return self._reshape_of(relax.Call(call.op, [left.source, right.source], call.attrs), left.shape)
        reshape, position = (left, 0) if left is not None else (right, 1)
        if reshape is None:
            return call
        other = _constant_for(bound_value(self, call.args[1 - position]), reshape.source_shape, reshape.shape)
        if other is None:
            return call
        sources = [reshape.source, other] if position == 0 else [other, reshape.source]
        return self._reshape_of(relax.Call(call.op, sources, call.attrs), reshape.shape)

    def _reshape_of(self, call: relax.Call, shape: tuple[int, ...]) -> relax.Expr:
        """`call` bound to a variable of its own (so that the next operator reads its shape), reshaped."""
        return relax.op.reshape(self.builder_.emit(call), shape)


def _constant_for(constant: relax.Expr, source: tuple[int, ...], reshaped: tuple[int, ...]) -> relax.Expr | None:
    """`constant` as broadcast against `source` the way it broadcasts against `reshaped`: a
    single value as it is; a vector along the last axis, where the reshape keeps that axis, at
    `source`'s rank; None for any other."""
    if not is_constant(constant):
        return None
    value = constant.value.numpy()
    if value.size == 1 or value.ndim == 0:
        return constant
    length = value.shape[-1]
    if value.size != length or value.ndim > len(reshaped) or not source[-1] == reshaped[-1] == length:
        return None
    return relax.const(np.ascontiguousarray(value.reshape((1,) * (len(source) - 1) + (length,))))


_reshapes_last = rewrite_with(_ReshapesLast, "ReshapesLast")


def reshapes_last() -> tvm.transform.Sequential:
    """The pass `ReshapesLast`: reshapes below the element-wise operators after them, then the
    reshapes that meet merged, those to the shape they have dropped, and the unused removed."""
    return tvm.transform.Sequential(
        [
            _reshapes_last,
            relax.transform.RemoveRedundantReshape(),
            relax.transform.DeadCodeElimination(),
            relax.transform.CanonicalizeBindings(),
        ],
        name="ReshapesLast",
    )
