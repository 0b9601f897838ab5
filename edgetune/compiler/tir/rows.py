"""Kernels that reduce along rows (softmax and its kin), scheduled when the model is prepared.

`schedule_row_reductions(target)` is a pass of the `prepare` pipeline: a fused kernel whose
blocks all run over the same rows, each reducing or mapping along the innermost axis, is
computed one row at a time in parallel over the rows, each reduction accumulated in a vector of
partial results and each element-wise step vectorized; the kernel is marked scheduled (no
tuning task). docs/compiler.md says why.
"""

from __future__ import annotations

import tvm
from tvm import s_tir

from edgetune.compiler.tir.common import (
    MIN_LANES,
    SCHEDULED,
    has_reduction,
    scheduling_pass,
    top_blocks,
    writes_parameter,
)


def schedule_row_reductions(target: tvm.target.Target) -> tvm.transform.Pass:
    """The pass that schedules every fused kernel of row reductions (`_by_rows`); other kernels,
    and every kernel on a target without a vector unit, are left as they are."""
    return scheduling_pass(target, "ScheduleRowReductions", lambda func, unit: _by_rows(func, unit.lanes))


def _by_rows(func: tvm.tirx.PrimFunc, register_lanes: int) -> tvm.tirx.PrimFunc | None:
    """`func` computed row by row, or None unless it is a kernel of row reductions: every block
    runs over the rows (and the row's axis, innermost), reads and writes each buffer in that
    order (no transpose), reduces nothing but the row's axis, at least one block reduces, and an
    element-wise result over the row is read by two later steps (MetaSchedule keeps that
    result as a whole tensor, written and read back; row by row it stays in the cache)."""
    if not isinstance(func.body, s_tir.SBlockRealize):
        return None
    sch = s_tir.Schedule(func)
    blocks = top_blocks(sch)
    if not blocks or not writes_parameter(sch, blocks[-1], list(func.params)):
        return None
    rows = _rows(sch, blocks)
    if rows is None or not any(has_reduction(sch, b) for b in blocks):
        return None
    length, along_row = rows
    if not all(_along_rows(sch.get(b), row) for b, row in zip(blocks, along_row, strict=True)):
        return None
    if not any(_shared_row(sch, b) for b, row in zip(blocks[:-1], along_row, strict=False) if row):
        return None
    lanes = _row_lanes(length, register_lanes)
    if lanes is None:
        return None
    try:
        _schedule(sch, blocks, lanes, output_along_row=along_row[-1])
    except s_tir.ScheduleError:
        return None
    return sch.mod["main"].with_attr(SCHEDULED, True)


def _rows(sch: s_tir.Schedule, blocks: list[s_tir.SBlockRV]) -> tuple[int, list[bool]] | None:
    """The row's length and, per block, whether it runs along the row (over the rows and the
    row's axis, innermost) or once per row; None if a block does neither. Axes of one (a
    reduction's `keepdims`) do not count."""
    nests = []
    for block in blocks:
        extents = [sch.get(loop).extent for loop in sch.get_loops(block)]
        if not extents or not all(isinstance(e, tvm.tirx.IntImm) for e in extents):
            return None
        nests.append(tuple(int(e) for e in extents))
    squeezed = [tuple(e for e in nest if e != 1) for nest in nests]
    full = max(squeezed, key=len)
    if not full:
        return None
    along_row = [s == full and nest[-1] == full[-1] for s, nest in zip(squeezed, nests, strict=True)]
    if any(not row and s != full[:-1] for s, row in zip(squeezed, along_row, strict=True)):
        return None
    return full[-1], along_row


def _schedule(sch: s_tir.Schedule, blocks: list[s_tir.SBlockRV], lanes: int, output_along_row: bool) -> None:
    """Element-wise steps with one consumer inlined into it; each reduction split into a vector of
    `lanes` partial results (`rfactor`) and their sum; every step computed under the parallel
    loop over rows, its innermost loop vectorized."""
    output = blocks[-1]
    for block in reversed(blocks[:-1]):
        if not has_reduction(sch, block) and len(sch.get_consumers(block)) == 1:
            sch.compute_inline(block)
    partials = []
    for block in top_blocks(sch):
        if has_reduction(sch, block):
            partials.append(sch.rfactor(sch.split(sch.get_loops(block)[-1], [None, lanes])[1], 0))
    steps = top_blocks(sch)
    output_loops = sch.get_loops(output)
    rows = sch.fuse(*(output_loops[:-1] if output_along_row else output_loops))
    for block in reversed(steps[:-1]):
        sch.compute_at(block, rows)
    sch.parallel(rows)
    partial_blocks = [sch.get(p) for p in partials]
    for block in steps:
        if any(sch.get(block).same_as(p) for p in partial_blocks):
            vector, *steps_of_row = sch.get_loops(block)[1:]  # compute_at keeps the block's order
            if steps_of_row:  # none where the row is one vector long
                sch.reorder(*steps_of_row, vector)
            sch.vectorize(vector)
        elif not has_reduction(sch, block) and len(loops := sch.get_loops(block)) > 1:
            sch.vectorize(sch.split(loops[-1], [None, lanes])[1])
        # the sums of the partial results, and the steps once per row, stay serial


def _shared_row(sch: s_tir.Schedule, block: s_tir.SBlockRV) -> bool:
    """An element-wise step over the row that two later steps read (softmax's exponentials)."""
    return not has_reduction(sch, block) and len(sch.get_consumers(block)) > 1


def _along_rows(block: tvm.s_tir.SBlock, row_axis: bool) -> bool:
    """Every buffer indexed by the block's iteration variables in their order (or by constants,
    for broadcast axes); the row's axis (the last, where the block has it) only in a buffer's last
    dimension and the only one reduced; a reduction writes one buffer."""
    axes = [iv.var for iv in block.iter_vars]
    kinds = [iv.iter_type for iv in block.iter_vars]
    rows = kinds[:-1] if row_axis else kinds
    if any(kind != tvm.tirx.IterVar.DataPar for kind in rows):
        return False
    if kinds[-1] == tvm.tirx.IterVar.CommReduce and len(block.writes) != 1:
        return False
    return all(_in_row_order(region, axes, row_axis) for region in [*block.reads, *block.writes])


def _in_row_order(region: tvm.tirx.BufferRegion, axes: list[tvm.tirx.Var], row_axis: bool) -> bool:
    positions = []
    for dim in region.region:
        if not (isinstance(dim.extent, tvm.tirx.IntImm) and int(dim.extent) == 1):
            return False
        if isinstance(dim.min, tvm.tirx.IntImm):
            continue
        found = [i for i, axis in enumerate(axes) if dim.min.same_as(axis)]
        if not found:
            return False
        positions.append(found[0])
    if positions != sorted(set(positions)):
        return False
    last = len(axes) - 1
    return not row_axis or last not in positions or region.region[-1].min.same_as(axes[last])


def _row_lanes(length: int, register_lanes: int) -> int | None:
    """The widest vector, a register down to MIN_LANES, that divides the row."""
    lanes = register_lanes
    while lanes >= MIN_LANES:
        if length % lanes == 0:
            return lanes
        lanes //= 2
    return None
