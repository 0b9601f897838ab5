"""The micro-kernel schedule of integer convolutions (edgetune.compiler.integer), with AVX-512 VNNI.

The kernel is a convolution of uint8 activations (NHWC, padded with their zero point) by int8
weights packed (O/16, KH, KW, K/4, 16, 4) into int32, then its element-wise epilogue
(zero-point correction, scale, bias, the next layer's quantize). The schedule is the float
rule's (edgetune.compiler.schedule_rules.convolution): a register tile of `rows` pixels x
`vectors` vectors of 16 int32 accumulators over the whole reduction (kh, kw, input channels),
the tiles above it sampled by MetaSchedule, the padding placed by its stock rule, the epilogue
computed from the accumulators right after the tile. The reduction steps 4 input channels at a
time, and the innermost 16 outputs x 4 inputs are one `vpdpbusd` (the tensor intrinsic
edgetune.compiler.intrinsics.VNNI_DOT). The packed weight is read as it is: it is taken out of the
kernel's layout-free buffers, so MetaSchedule's RewriteLayout leaves the order the instruction
needs.
"""

from __future__ import annotations

import tvm
from tvm import s_tir
from tvm.target import codegen

from edgetune.compiler.integer import DOT_INPUTS, INTEGER_LANES
from edgetune.compiler.intrinsics import VNNI_DOT
from edgetune.compiler.schedule_rules.common import (
    VectorUnit,
    fold_into_tile,
    lone_convolution,
    mark_kernels,
    register_rule,
    row_tiles,
    shape,
    write_from_tile,
)
from edgetune.compiler.schedule_rules.convolution import (
    is_input_padding,
    register_tiles,
)

RULE = "edgetune_conv_vnni"
LAYOUT_FREE = "layout_free_buffers"


def annotate_integer_convolutions(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """`mod` with the reduction block of every integer convolution kernel marked for the VNNI
    rule and its packed weight no longer layout-free, on targets with AVX-512 VNNI; other
    targets and kernels are left as they are (stock MetaSchedule schedules them there)."""
    if not codegen.llvm_cpu_has_features(["avx512vnni"], target):
        return mod
    marked = mark_kernels(mod, target, RULE, _integer_conv)
    for global_var, func in marked.functions_items():
        if not func.same_as(mod[global_var]) and func.attrs is not None and LAYOUT_FREE in func.attrs:
            marked[global_var] = func.without_attr(LAYOUT_FREE)  # a kernel mark_kernels marked
    return marked


def _integer_conv(sch: s_tir.Schedule, unit: VectorUnit, params: list) -> s_tir.SBlockRV | None:
    """The kernel's reduction block if the kernel is one uint8 x packed int8 -> int32
    convolution (edgetune.compiler.integer), its zero-point padding at most before it and
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
    sch.reorder(batch, height, m_outer, n_outer, m_inner, n_inner, kernel_h, kernel_w, reduction,
                rows, vectors, unit_reduction, lane, dot)  # fmt: skip
    sch.unroll(rows)
    sch.unroll(vectors)
    write_from_tile(sch, output, n_inner, lanes)
    # The 16 x 4 products as one block that MetaSchedule's postprocs tensorize (RewriteTensorize)
    # once RewriteReductionBlock has split off its init: tensorizing here, before the
    # postprocs, leaves an init block that RewriteParallelVectorizeUnroll cannot parallelize.
    dot_block = sch.blockize(lane)
    sch.annotate(dot_block, "meta_schedule.auto_tensorize", VNNI_DOT)


register_rule(RULE, register_tiles, _micro_kernel)  # ApplyCustomRule's entry: one design space per tile
