"""Moves (reshapes, transposes, squeezes, expands) carried below the element-wise operators and
reductions that follow them, so that those operators fuse into the convolution before the moves.

A dense layer written as a pointwise convolution, or a 1-d convolution written as a row
(`relax/layout.py`), is followed by moves back to the model's shape, and the model's bias,
activation, residual or pooling come after them. Relax fuses no element-wise operator across a
move into the convolution; a reshape inlined into an element-wise kernel indexes it with
divisions that keep it from vectorizing, and a transpose is a kernel of its own over the
convolution's whole output. `moves_last` rewrites op(move(x)) as move(op(x)), and a reduction of
moved values as a reduction of x then a reshape, wherever that computes the same values, then
merges the reshapes that meet and drops those that change nothing. docs/compiler.md says more.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import tvm
from tvm import relax

from edgetune.compiler.relax.graph import bound_value, is_constant, rewrite_functions, static_shape

# Operators that compute each value from the value at the same position alone.
UNARY = frozenset(
    f"relax.{name}"
    for name in ("abs", "erf", "exp", "negative", "sigmoid", "sqrt", "rsqrt", "tanh", "nn.relu", "nn.gelu", "nn.silu")
)
BINARY = frozenset(f"relax.{name}" for name in ("add", "subtract", "multiply", "divide", "maximum", "minimum"))
REDUCE = {"relax.max": relax.op.max, "relax.min": relax.op.min, "relax.sum": relax.op.sum, "relax.mean": relax.op.mean}
REDUCTIONS = frozenset(REDUCE)
# Operators that move values without changing them (a strided slice of everything included).
ORDER_KEEPING = frozenset({"relax.reshape", "relax.squeeze", "relax.expand_dims", "relax.strided_slice"})
MOVES = ORDER_KEEPING | {"relax.permute_dims"}
# Moves are followed value by value (NumPy index arrays) up to this many values; beyond it, only
# moves that keep the values' order are carried.
TRACED_VALUES = 1 << 22


class _Moves(NamedTuple):
    source: relax.Expr  # the value the first move moves
    source_shape: tuple[int, ...]
    calls: tuple[relax.Call, ...]  # the moves, first to last, each moving the one before
    shape: tuple[int, ...]

    @property
    def keeps_order(self) -> bool:
        return all(call.op.name in ORDER_KEEPING for call in self.calls)

    def positions(self) -> np.ndarray | None:
        """For each value after the moves (in order), its position in the source; None beyond
        TRACED_VALUES."""
        size = math.prod(self.source_shape)
        if self.keeps_order:
            return np.arange(size) if size <= TRACED_VALUES else None
        if size > TRACED_VALUES:
            return None
        values = np.arange(size).reshape(self.source_shape)
        for call in self.calls:
            if call.op.name == "relax.permute_dims":
                axes = call.attrs.axes
                values = np.transpose(values, None if axes is None else [int(a) for a in axes])
            else:
                values = values.reshape(static_shape(call))
        return values.reshape(-1)


@relax.expr_functor.mutator
class _MovesLast(relax.PyExprMutator):
    def __init__(self, users: dict[relax.Var, list[relax.Expr]]):
        super().__init__()
        self.users = users  # each variable of the function rewritten -> the values that use it

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
            return call
        name = call.op.name
        if name in UNARY and len(call.args) == 1:
            return self._unary(call)
        if name in BINARY and len(call.args) == 2:
            return self._binary(call)
        if name in REDUCTIONS and len(call.args) == 1:
            return self._reduction(call)
        return call

    def _moves(self, expr: relax.Expr) -> _Moves | None:
        """The moves `expr` is bound to, back to the first value that is no move; None where
        there are none, a shape is not static, or carrying a transpose would leave a copy of it
        for another user."""
        calls = []
        value = bound_value(self, expr)
        while isinstance(value, relax.Call) and _is_move(value):
            calls.append(value)
            value = bound_value(self, value.args[0])
        if not calls:
            return None
        source = calls[-1].args[0]
        source_shape, shape = static_shape(source), static_shape(calls[0])
        if source_shape is None or shape is None:
            return None
        moves = _Moves(source, source_shape, tuple(reversed(calls)), shape)
        return moves if moves.keeps_order or self._carried_whole(expr, calls) else None

    def _carried_whole(self, expr: relax.Expr, calls: list[relax.Call]) -> bool:
        """No value but the next move uses a move before the last, and only operators this pass
        rewrites use the last (a transpose left for another user would be computed twice)."""
        inner = [call.args[0] for call in calls[:-1]]
        if any(len(self.users.get(var, [None])) > 1 for var in inner if isinstance(var, relax.Var)):
            return False
        return all(
            isinstance(user, relax.Call)
            and isinstance(user.op, tvm.ir.Op)
            and user.op.name in UNARY | BINARY | REDUCTIONS
            for user in self.users.get(expr, [None])
        )

    def _unary(self, call: relax.Call) -> relax.Expr:
        moves = self._moves(call.args[0])
        if moves is None:
            return call
        return self._replay(moves, relax.Call(call.op, [moves.source], call.attrs))

    def _binary(self, call: relax.Call) -> relax.Expr:
        left, right = (self._moves(arg) for arg in call.args)
        if left is not None and right is not None:
            if not _same_moves(left, right):
                return call
            return self._replay(left, relax.Call(call.op, [left.source, right.source], call.attrs))
        moves, position = (left, 0) if left is not None else (right, 1)
        if moves is None:
            return call
        other = _constant_for(bound_value(self, call.args[1 - position]), moves)
        if other is None:
            return call
        sources = [moves.source, other] if position == 0 else [other, moves.source]
        return self._replay(moves, relax.Call(call.op, sources, call.attrs))

    def _reduction(self, call: relax.Call) -> relax.Expr:
        moves = self._moves(call.args[0])
        out_shape = static_shape(call)
        if moves is None or out_shape is None:
            return call
        axes = _source_axes(moves, call.attrs.axis)
        if axes is None:
            return call
        reduced = self.builder_.emit(REDUCE[call.op.name](moves.source, axis=axes, keepdims=True))
        return relax.op.reshape(reduced, out_shape)

    def _replay(self, moves: _Moves, computed: relax.Call) -> relax.Expr:
        """`computed` (an operator applied to the moves' source) bound to a variable, then the
        same moves applied to it, the last returned to take the operator's place."""
        value: relax.Expr = self.builder_.emit(computed)
        for position, move in enumerate(moves.calls):
            value = relax.Call(move.op, [value, *move.args[1:]], move.attrs)
            if position < len(moves.calls) - 1:
                value = self.builder_.emit(value)
        return value


def _is_move(call: relax.Call) -> bool:
    if not isinstance(call.op, tvm.ir.Op) or call.op.name not in MOVES:
        return False
    if call.op.name != "relax.strided_slice":
        return True
    shape = static_shape(call)  # a slice of everything: the same shape, every stride 1
    strides = call.args[4] if len(call.args) > 4 else None
    whole = shape is not None and shape == static_shape(call.args[0])
    return whole and strides is not None and all(_int(stride) == 1 for stride in strides)


def _int(value: relax.Expr) -> int | None:
    value = getattr(value, "value", value)
    return int(value) if isinstance(value, (int, tvm.tirx.IntImm)) else None


def _same_moves(left: _Moves, right: _Moves) -> bool:
    if left.source_shape != right.source_shape or left.shape != right.shape:
        return False
    if left.keeps_order and right.keeps_order:
        return True
    ours, theirs = left.positions(), right.positions()
    return ours is not None and theirs is not None and np.array_equal(ours, theirs)


def _constant_for(constant: relax.Expr, moves: _Moves) -> relax.Expr | None:
    """`constant` as it meets the source's values where it meets the moved ones: a single value
    as it is; other constants placed back through the moves (each axis along which it does not
    change kept of size 1); None where that would be a larger constant, or it does not
    broadcast to the moved values' shape."""
    if not is_constant(constant):
        return None
    value = constant.value.numpy()
    if value.size == 1:
        return constant
    try:
        if np.broadcast_shapes(value.shape, moves.shape) != moves.shape:
            return None  # the operator's result would be larger than the moved values
    except ValueError:
        return None
    positions = moves.positions()
    if positions is None:
        return None
    placed = np.empty(math.prod(moves.source_shape), value.dtype)
    placed[positions] = np.broadcast_to(value, moves.shape).reshape(-1)
    placed = placed.reshape(moves.source_shape)
    for axis in range(placed.ndim):
        first = np.take(placed, [0], axis=axis)
        if np.array_equal(placed, np.broadcast_to(first, placed.shape)):
            placed = first
    return relax.const(np.ascontiguousarray(placed)) if placed.size <= value.size else None


def _source_axes(moves: _Moves, axis: Any) -> list[int] | None:
    """The source's axes to reduce so that a reduction of the moved values over `axis` is that
    reduction reshaped: the axes along which one group of reduced values lies in the source,
    where the groups and their order are the same; None otherwise."""
    positions = moves.positions()
    if positions is None:
        return None
    rank = len(moves.shape)
    reduced = set(range(rank)) if axis is None else {int(a) % rank for a in axis}
    kept = [a for a in range(rank) if a not in reduced]
    coordinates = np.unravel_index(np.arange(positions.size), moves.shape)
    group = _flat_index([coordinates[a] for a in kept], [moves.shape[a] for a in kept], positions.size)
    source_coordinates = np.unravel_index(positions, moves.source_shape)
    in_first = group == 0
    axes = [a for a, c in enumerate(source_coordinates) if np.unique(c[in_first]).size > 1]
    source_kept = [a for a in range(len(moves.source_shape)) if a not in axes]
    source_group = _flat_index(
        [source_coordinates[a] for a in source_kept], [moves.source_shape[a] for a in source_kept], positions.size
    )
    return axes if axes and np.array_equal(group, source_group) else None


def _flat_index(coordinates: list[np.ndarray], dims: list[int], size: int) -> np.ndarray:
    return np.ravel_multi_index(coordinates, dims) if coordinates else np.zeros(size, np.int64)


def _users(func: relax.Function) -> dict[relax.Var, list[relax.Expr]]:
    """Each variable bound in `func`'s dataflow blocks -> the values of the bindings that use it
    (None for the function's result)."""
    if not isinstance(func.body, relax.SeqExpr):
        return {}
    values = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    users: dict[relax.Var, list[relax.Expr]] = {}
    for block in func.body.blocks:
        if isinstance(block, relax.DataflowBlock):
            for var, uses in relax.analysis.udchain(block).items():
                users[var] = [values.get(use) for use in uses]
    for var in relax.analysis.free_vars(func.body.body):
        users.setdefault(var, []).append(None)
    return users


def moves_last() -> tvm.transform.Sequential:
    """The pass `MovesLast`: moves carried below the element-wise operators and reductions
    after them, then the reshapes that meet merged, those to the shape they have dropped, and
    the unused removed."""
    return tvm.transform.Sequential(
        [
            rewrite_functions(lambda func: _MovesLast(_users(func)), "CarryMoves"),
            relax.transform.RemoveRedundantReshape(),
            relax.transform.DeadCodeElimination(),
            relax.transform.CanonicalizeBindings(),
        ],
        name="MovesLast",
    )
