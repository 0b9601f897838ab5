"""Kernels that concatenate along their innermost axis, scheduled when the model is prepared.

`schedule_concatenations(target)` is a pass of the `prepare` pipeline: it inlines such a fused
kernel into one block, partitions its channel loop where the concatenation changes input,
vectorizes each part, and marks the kernel scheduled (no tuning task; the same build with or
without a database). docs/compiler.md says why.
"""

from __future__ import annotations

import tvm
from tvm import s_tir

from edgetune.compiler.tir.common import (
    SCHEDULED,
    has_reduction,
    is_elementwise,
    scheduling_pass,
    shape,
    top_blocks,
    writes_parameter,
)

REGISTERS_PER_PART = 4  # the widest vector a part computes at once, in float32 registers


def schedule_concatenations(target: tvm.target.Target) -> tvm.transform.Pass:
    """The pass that schedules every fused kernel that concatenates along its output's innermost
    axis (`_partitioned`); other kernels, and every kernel on a target without a vector unit,
    are left as they are."""
    return scheduling_pass(
        target, "ScheduleConcatenations", lambda func, unit: _partitioned(func, unit.lanes * REGISTERS_PER_PART)
    )


def _partitioned(func: tvm.tirx.PrimFunc, max_lanes: int) -> tvm.tirx.PrimFunc | None:
    """`func` as one block over its output, the loops above the innermost fused and parallel,
    the innermost partitioned at the concatenation's boundaries and each part vectorized; None
    unless `func` is spatial blocks, one of them a concatenation along the innermost axis, the
    blocks after it element-wise over its shape, the last writing the only output, and the
    blocks before it can be inlined."""
    if not isinstance(func.body, s_tir.SBlockRealize):
        return None
    sch = s_tir.Schedule(func)
    blocks = top_blocks(sch)
    if any(has_reduction(sch, b) for b in blocks) or not writes_parameter(sch, blocks[-1], list(func.params)):
        return None
    concatenations = [(i, cuts) for i, b in enumerate(blocks) if (cuts := _cuts(sch.get(b)))]
    if len(concatenations) != 1:
        return None
    position, cuts = concatenations[0]
    concatenated = shape(sch.get(blocks[position]).writes[0].source)
    if None in concatenated or not all(is_elementwise(sch, b, concatenated) for b in blocks[position + 1 :]):
        return None
    output = blocks[-1]
    try:
        for block in reversed(blocks[:-1]):
            sch.compute_inline(block)
    except s_tir.ScheduleError:
        return None
    *outer, inner = sch.get_loops(output)
    if outer:
        sch.parallel(sch.fuse(*outer))
    sizes = _part_sizes(cuts, concatenated[-1], max_lanes)
    parts = sch.loop_partition(inner, [*sizes[:-1], None]) if len(sizes) > 1 else [inner]
    for part in parts:
        sch.vectorize(part)
    return sch.mod["main"].with_attr(SCHEDULED, True)


def _cuts(block: tvm.s_tir.SBlock) -> list[int]:
    """Where a concatenation along the block's innermost axis changes from one input to the
    next: the block stores an if_then_else chain whose conditions compare its last iterator
    with constants (as Relax's concatenate writes it); [] for any other block."""
    if not isinstance(block.body, tvm.tirx.BufferStore) or not block.iter_vars:
        return []
    last = block.iter_vars[-1]
    if not isinstance(last.dom.extent, tvm.tirx.IntImm):
        return []
    if_then_else = tvm.ir.Op.get("prim.if_then_else")
    cuts: set[int] = set()
    pending = [block.body.value]
    while pending:
        value = pending.pop()
        if not (isinstance(value, tvm.ir.expr.Call) and value.op.same_as(if_then_else)):
            continue
        cut = _cut(value.args[0], last.var)
        if cut is None:
            return []
        cuts.add(cut)
        pending += value.args[1:]
    return sorted(c for c in cuts if 0 < c < int(last.dom.extent))


# comparison -> {side of the constant: how far past the constant the comparison changes}
_COMPARISONS = {
    tvm.tirx.LE: {0: 0, 1: 1},
    tvm.tirx.LT: {0: 1, 1: 0},
    tvm.tirx.GE: {0: 1, 1: 0},
    tvm.tirx.GT: {0: 0, 1: 1},
}


def _cut(condition, iterator: tvm.tirx.Var) -> int | None:
    """c where `condition`, a comparison of `iterator` with a constant (c <= i, i < c, ...),
    differs for i = c - 1 and i = c; None for any other condition."""
    shifts = _COMPARISONS.get(type(condition))
    if shifts is None:
        return None
    for side, (constant, variable) in enumerate(((condition.a, condition.b), (condition.b, condition.a))):
        if isinstance(constant, tvm.tirx.IntImm) and variable.same_as(iterator):
            return int(constant.value) + shifts[side]
    return None


def _part_sizes(cuts: list[int], extent: int, max_lanes: int) -> list[int]:
    """The innermost loop's parts: the stretches between cuts, each in vectors of at most
    `max_lanes` (a partitioned loop no longer starts at 0, and cannot be split)."""
    sizes = []
    for start, stop in zip([0, *cuts], [*cuts, extent]):
        whole, rest = divmod(stop - start, max_lanes)
        sizes += [max_lanes] * whole + ([rest] if rest else [])
    return sizes
