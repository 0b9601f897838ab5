"""The micro-kernel schedule rule of integer convolutions (edgetune.compiler.relax.integer): the
float rule's register tile over int32 accumulators, its innermost 16 outputs x 4 inputs one
AVX-512 VNNI `vpdpbusd` (edgetune.compiler.intrinsics.VNNI_DOT).

`annotate_integer_convolutions(target)` is the pipeline's pass that marks the kernels (VNNI
targets only) and keeps their packed weight as it is; `design_spaces` is the rule's function
(edgetune.compiler.tir.rules registers it).
"""

from __future__ import annotations

import tvm
from tvm import s_tir
from tvm.target import codegen

from edgetune.compiler.intrinsics import VNNI_DOT
from edgetune.compiler.relax.integer import DOT_INPUTS, INTEGER_LANES
from edgetune.compiler.tir.common import (
    VectorUnit,
    fold_into_tile,
    lone_convolution,
    mark_kernels,
    row_tiles,
    rule_design_spaces,
    shape,
    target_pass,
    write_from_tile,
)
from edgetune.compiler.tir.convolution import is_input_padding, register_tiles
from edgetune.compiler.tir.prepack import LAYOUT_FREE

RULE = "edgetune_conv_vnni"


def annotate_integer_convolutions(target: tvm.target.Target) -> tvm.transform.Pass:
    """The pass that marks the reduction block of every integer convolution kernel for the VNNI
    rule and takes its packed weight out of the layout-free buffers, on targets with AVX-512
    VNNI; other targets and kernels are left as they are (stock MetaSchedule schedules them there)."""
    return target_pass(_annotate_integer_convolutions, target, "AnnotateIntegerConvolutions")


def _annotate_integer_convolutions(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    if not codegen.llvm_cpu_has_features(["avx512vnni"], target):
        return mod
    marked = mark_kernels(mod, target, RULE, _integer_conv)
    for global_var, func in marked.functions_items():
        if not func.same_as(mod[global_var]) and func.attrs is not None and LAYOUT_FREE in func.attrs:
            marked[global_var] = func.without_attr(LAYOUT_FREE)  # a kernel mark_kernels marked
    return marked


def _integer_conv(sch: s_tir.Schedule, unit: VectorUnit, params: list) -> s_tir.SBlockRV | None:
    """The kernel's reduction block if the kernel is one uint8 x packed int8 -> int32
    convolution (edgetune.compiler.relax.integer), its zero-point padding at most before it and
    element-wise blocks after it, on image rows the tiles divide."""
    conv = lone_convolution(sch, params, is_input_padding)
    if conv is None:
        return None
    block = sch.get(conv)
    spatial, reduce = tvm.tirx.IterVar.DataPar, tvm.tirx.IterVar.CommReduce
    if [iv.iter_type for iv in block.iter_vars] != [spatial] * 4 + [reduce] * 3 or len(block.reads) != 2:
        return None
    data, weight = (region.source for region in block.reads)
    out = block.writes[0].source
    if (str(data.dtype), str(weight.dtype), str(out.dtype)) != ("uint8", "int8", "int32"):
        return None
    if shape(weight)[-2:] != (INTEGER_LANES, DOT_INPUTS) or None in shape(out):
        return None
    return conv if row_tiles(shape(out)[2]) and unit.lanes == INTEGER_LANES else None


def _micro_kernel(sch: s_tir.Schedule, conv: s_tir.SBlockRV, tile, lanes: int) -> None:
    output = fold_into_tile(sch, conv, inline_padding=False, accumulator_scope="global")  # the intrinsic's scope
    batch, height, width, channel, kernel_h, kernel_w, reduction = sch.get_loops(conv)
    pixel_blocks, rows = sch.split(width, [None, tile.rows])
    channel_blocks, vectors, lane = sch.split(channel, [None, tile.vectors, lanes])
    m_outer, m_inner = sch.split(pixel_blocks, sch.sample_perfect_tile(pixel_blocks, n=2))
    n_outer, n_inner = sch.split(channel_blocks, sch.sample_perfect_tile(channel_blocks, n=2))
    reduction, unit_reduction, dot = sch.split(reduction, [None, 1, DOT_INPUTS])
    # As in the float32 rule, a unit reduction loop right above the instruction's loops: else
    # RewriteParallelVectorizeUnroll tries to vectorize the vectors loop around it, and fails.
    # (Batch, rows and pixel tiles stay apart: fused, the block's bindings cannot be blockized.)
    sch.reorder(
        batch,
        height,
        m_outer,
        n_outer,
        m_inner,
        n_inner,
        kernel_h,
        kernel_w,
        reduction,
        rows,
        vectors,
        unit_reduction,
        lane,
        dot,
    )
    sch.unroll(rows)
    sch.unroll(vectors)
    write_from_tile(sch, output, n_inner, lanes)
    # The 16 x 4 products as one block that MetaSchedule's postprocs tensorize (RewriteTensorize)
    # once RewriteReductionBlock has split off its init: tensorizing here, before the
    # postprocs, leaves an init block that RewriteParallelVectorizeUnroll cannot parallelize.
    dot_block = sch.blockize(lane)
    sch.annotate(dot_block, "meta_schedule.auto_tensorize", VNNI_DOT)


design_spaces = rule_design_spaces(register_tiles, _micro_kernel)  # ApplyCustomRule's entry: one design space per tile
