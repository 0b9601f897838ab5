"""What the Relax graph rewrites share: reading Relax expressions (calls, constants, static
shapes, the value a variable is bound to), turning an expression mutator or a function of a
call into a module pass, and `fold_constants_with_numpy`, the pipeline's pass that computes the
transposes, reshapes, concatenations and dequantizes of constants with NumPy.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax


def is_call(expr: relax.Expr, op: str) -> bool:
    return isinstance(expr, relax.Call) and expr.op.same_as(tvm.ir.Op.get(op))


def is_constant(expr: relax.Expr) -> bool:
    return isinstance(expr, tvm.ir.GenericConst)


def constant_weight(weight: relax.Expr) -> np.ndarray | None:
    """The values of a weight the pipeline folds to a constant: a constant, or a constant's
    permuted dimensions (what ConvertLayout makes of an OIHW weight); None for any other."""
    if is_constant(weight):
        return weight.value.numpy()
    if is_call(weight, "relax.permute_dims") and is_constant(weight.args[0]):
        return np.transpose(weight.args[0].value.numpy(), [int(a) for a in weight.attrs.axes])
    return None


def static_shape(expr: relax.Expr) -> tuple[int, ...] | None:
    """The tensor's dimensions if all of them are known integers."""
    shape = getattr(expr.ty, "shape", None)
    values = getattr(shape, "values", None)
    if values is None or not all(isinstance(dim, tvm.tirx.IntImm) for dim in values):
        return None
    return tuple(int(dim) for dim in values)


def bound_value(mutator: relax.PyExprMutator, expr: relax.Expr) -> relax.Expr:
    """The value a variable is bound to in the function being rewritten (the expression itself
    otherwise)."""
    value = mutator.lookup_binding(expr) if isinstance(expr, relax.Var) else None
    return expr if value is None else value


def rewrite_with(mutator: type[relax.PyExprMutator], name: str) -> tvm.transform.Pass:
    """A module pass named `name` that rewrites every Relax function of a module with a fresh
    `mutator` each, as a Relax function pass would."""
    return rewrite_functions(lambda _func: mutator(), name)


def rewrite_functions(mutator_for: Callable[[relax.Function], relax.PyExprMutator], name: str) -> tvm.transform.Pass:
    """A module pass named `name` that rewrites every Relax function of a module with the
    mutator `mutator_for(function)` makes for it."""

    def rewrite(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        rewritten = mod.clone()
        for global_var, func in mod.functions_items():
            if isinstance(func, relax.Function):
                rewritten[global_var] = mutator_for(func).visit_expr(func)
        return rewritten

    return tvm.transform.module_pass(rewrite, opt_level=0, name=name)


def rewrite_module(mutator: relax.PyExprMutator, mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every Relax function rewritten by `mutator` (made on `mod`), the functions the
    mutator added through its builder included, the bindings it left unused removed."""
    for global_var, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(global_var, mutator.visit_expr(func))
    return relax.transform.DeadCodeElimination()(mutator.builder_.get())


def rewrite_module_with(mutator: type[relax.PyExprMutator], name: str) -> tvm.transform.Pass:
    """A module pass named `name` that rewrites a module with `rewrite_module`, `mutator` made on
    the module (so that it may add functions through its builder)."""
    return tvm.transform.module_pass(lambda mod, _ctx: rewrite_module(mutator(mod), mod), opt_level=0, name=name)


def rewrite_calls(rewrite: Callable[[relax.Call], relax.Expr | None], name: str) -> tvm.transform.Pass:
    """A pass that replaces each call, its arguments rewritten first, with what `rewrite` makes
    of it (None: the call stays)."""

    @relax.expr_functor.mutator
    class _EachCall(relax.PyExprMutator):
        def visit_call_(self, call: relax.Call) -> relax.Expr:
            call = super().visit_call_(call)
            replaced = rewrite(call) if isinstance(call, relax.Call) else None
            return call if replaced is None else replaced

    return rewrite_with(_EachCall, name)


@relax.expr_functor.mutator
class _NumpyConstants(relax.PyExprMutator):
    """A constant's transpose or reshape, constants concatenated (ConvertLayout's and
    Winograd's weights, channel padding's zero filters, the importer's biases), and a constant's
    dequantize (a quantized model's int8 weights, where they are widened), as the constant each
    gives, computed with NumPy; through variables bound to constants, so chains fold."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        folded = self._folded(call) if isinstance(call, relax.Call) and call.args else None
        return call if folded is None else folded

    def _constant(self, expr: relax.Expr) -> np.ndarray | None:
        value = bound_value(self, expr)
        return value.value.numpy() if is_constant(value) else None

    def _folded(self, call: relax.Call) -> relax.Expr | None:
        if is_call(call, "relax.concat"):
            parts = bound_value(self, call.args[0])
            values = [self._constant(f) for f in parts.fields] if isinstance(parts, relax.Tuple) else [None]
            return (
                None
                if any(v is None for v in values)
                else relax.const(np.concatenate(values, axis=int(call.attrs.axis)))
            )
        if is_call(call, "relax.dequantize"):
            return self._dequantized(call)
        value = self._constant(call.args[0])
        if value is None:
            return None
        if is_call(call, "relax.permute_dims"):
            axes = call.attrs.axes
            return relax.const(np.transpose(value, None if axes is None else [int(a) for a in axes]))
        shape = static_shape(call) if is_call(call, "relax.reshape") else None
        return None if shape is None else relax.const(value.reshape(shape))

    def _dequantized(self, call: relax.Call) -> relax.Expr | None:
        """dequantize(q, scale, zero point) of integer constants into float32 as TVM 0.27's
        legalization computes it: q - zero point in int32, then times the scale in float32 (one
        scale and zero point, or one per index of `axis`)."""
        q, scale, zero = (self._constant(a) for a in call.args)
        if (
            q is None
            or scale is None
            or zero is None
            or q.dtype.kind not in "iu"
            or str(call.attrs.out_dtype) != "float32"
        ):
            return None
        if q.ndim == 0 and max(scale.size, zero.size) > 1:
            return None
        axis = int(call.attrs.axis) % max(q.ndim, 1)

        def along_axis(parameter: np.ndarray) -> np.ndarray:
            return (
                parameter.reshape(())
                if parameter.size == 1
                else parameter.reshape([-1 if i == axis else 1 for i in range(q.ndim)])
            )

        shifted = q.astype(np.int32) - along_axis(zero).astype(np.int32)
        return relax.const(shifted.astype(np.float32) * along_axis(scale).astype(np.float32))


# Relax's FoldConstant folds these too, but by compiling and running a kernel for each.
fold_constants_with_numpy = rewrite_with(_NumpyConstants, "FoldConstantsWithNumpy")
