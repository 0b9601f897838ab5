"""Kernels that only move values (reshapes, transposes, expands), scheduled when the model is
prepared.

`schedule_moves(target)` is a pass of the `prepare` pipeline: it inlines such a fused kernel
into one block over its output, parallelizes the loops above the innermost and vectorizes the
innermost in vectors of one register, and marks the kernel scheduled (no tuning task).
docs/compiler.md says why.
"""

from __future__ import annotations

import tvm
from tvm import s_tir

from edgetune.compiler.tir.common import (
    SCHEDULED,
    has_reduction,
    scheduling_pass,
    top_blocks,
    writes_parameter,
)


def schedule_moves(target: tvm.target.Target) -> tvm.transform.Pass:
    """The pass that schedules every fused kernel whose blocks only copy values (`_moved`);
    other kernels, and every kernel on a target without a vector unit, are left as they are."""
    return scheduling_pass(target, "ScheduleMoves", lambda func, unit: _moved(func, unit.lanes))


def _moved(func: tvm.tirx.PrimFunc, lanes: int) -> tvm.tirx.PrimFunc | None:
    """`func` as one block over its output, the loops above the innermost fused and parallel,
    the innermost vectorized in `lanes` (split so where they divide it); None unless every
    block of `func` stores a value it loads, the last writing the only output, and the blocks
    before it can be inlined."""
    if not isinstance(func.body, s_tir.SBlockRealize):
        return None
    sch = s_tir.Schedule(func)
    blocks = top_blocks(sch)
    if not blocks or any(has_reduction(sch, b) or not _only_moves(sch.get(b)) for b in blocks):
        return None
    output = blocks[-1]
    if not writes_parameter(sch, output, list(func.params)):
        return None
    try:
        for block in reversed(blocks[:-1]):
            sch.compute_inline(block)
    except s_tir.ScheduleError:
        return None
    *outer, inner = sch.get_loops(output)
    extent = sch.get(inner).extent
    if not isinstance(extent, tvm.tirx.IntImm):
        return None
    if outer:
        sch.parallel(sch.fuse(*outer))
    if int(extent) > lanes and int(extent) % lanes == 0:
        inner = sch.split(inner, [None, lanes])[1]
    sch.vectorize(inner)
    return sch.mod["main"].with_attr(SCHEDULED, True)


def _only_moves(block: tvm.s_tir.SBlock) -> bool:
    """The block stores a value it loads from the one buffer it reads (not a gather, which also
    reads the indices: those stay tasks, measured with the inputs they index by)."""
    body = block.body
    return (
        isinstance(body, tvm.tirx.BufferStore)
        and isinstance(body.value, tvm.ir.expr.TensorLoad)
        and len(block.reads) == 1
    )
