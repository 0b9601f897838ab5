"""The micro-kernel schedule rule of NHWC convolutions with groups 1 (pointwise and k x k):
a register tile of image-row pixels x SIMD vectors of output channels accumulated over the
whole reduction, one design space per tile that fits the target's registers, the tiles above
it left for MetaSchedule to sample.

`annotate_convolutions(target)` is the pipeline's pass that marks the kernels; `design_spaces`
is the rule's function (edgetune.compiler.tir.rules registers it). docs/compiler.md has the design.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir

from edgetune.compiler.tir.common import (
    VectorUnit,
    channel_lanes,
    convolution_shapes,
    fold_into_tile,
    lone_convolution,
    marking_pass,
    row_tiles,
    rule_design_spaces,
    write_from_tile,
)

RULE = "edgetune_pointwise_nhwc"  # its first name (1x1 only), kept: the mark is part of tuned workloads
MAX_TILE_CHANNELS = 64
# Below this many input channels (3-channel stems) the kw and ci loops around the tile are
# unrolled: left as loops of 3 iterations, their overhead outweighs the FMAs.
UNROLL_BELOW_CHANNELS_IN = 4


def annotate_convolutions(target: tvm.target.Target) -> tvm.transform.Pass:
    """`mod` with the block of every NHWC convolution kernel with groups 1 (one convolution, its
    padding and its element-wise epilogue) marked for the micro-kernel rule. Other kernels,
    NCHW and depthwise ones included, are left as they are."""
    return marking_pass(target, RULE, _convolution, "AnnotateConvolutions")


def _convolution(sch: s_tir.Schedule, unit: VectorUnit, params: list) -> s_tir.SBlockRV | None:
    """The function's convolution block if the function is exactly an NHWC convolution with
    groups 1 (its input's padding or copy at most before it, element-wise blocks after it, the
    last one writing the function's only output) that the register tiles fit."""
    conv = lone_convolution(sch, params, is_input_padding)
    return conv if conv is not None and _fits_tiles(sch.get(conv), unit) else None


def _fits_tiles(block: tvm.s_tir.SBlock, unit: VectorUnit) -> bool:
    """A float32 NHWC convolution with groups 1, OHWI weights (any kernel size, stride and
    padding), whose output channels a vector of the unit's width (or a half or a quarter of it)
    divides and whose image rows the tiles fit (the last one under a predicate where none divides
    them: `row_tiles`)."""
    shapes = convolution_shapes(block)
    if shapes is None:
        return False
    out_shape, data_shape, weight_shape = shapes
    batch, _, width, channels_out = out_shape
    if data_shape[0] != batch or (weight_shape[0], weight_shape[3]) != (channels_out, data_shape[3]):
        return False  # not groups 1 (a depthwise weight has 1 input channel per group)
    return bool(row_tiles(width, tail=True)) and channel_lanes(channels_out, unit.lanes) is not None


def is_input_padding(sch: s_tir.Schedule, block: s_tir.SBlockRV) -> bool:
    """A block such as `pad_temp`: one buffer copied, zeros around it or not."""
    b = sch.get(block)
    spatial = all(iv.iter_type == tvm.tirx.IterVar.DataPar for iv in b.iter_vars)
    return spatial and len(b.reads) == 1 and len(b.writes) == 1


@dataclass(frozen=True)
class RegisterTile:
    """The accumulators of one micro-kernel step: `rows` pixels x `vectors` SIMD vectors."""

    rows: int
    vectors: int

    def registers(self) -> int:
        return self.rows * self.vectors + self.vectors  # accumulators + the weight vectors of one k


def register_tiles(width: int, channels_out: int, unit: VectorUnit) -> list[RegisterTile]:
    """The register tiles of the widest vectors that divide the output channels
    (`channel_lanes`) that tile the image row (`row_tiles`) and divide the output channels and fit the registers,
    largest first (none smaller than half the largest). A tile spans at most MAX_TILE_CHANNELS
    output channels."""
    lanes = channel_lanes(channels_out, unit.lanes)
    vectors = [v for v in range(1, MAX_TILE_CHANNELS // lanes + 1) if channels_out % (v * lanes) == 0]
    tiles = [RegisterTile(r, v) for r in row_tiles(width, tail=True) for v in vectors]
    fitting = [t for t in tiles if t.registers() <= unit.registers]
    largest = max(t.rows * t.vectors for t in fitting)
    return sorted((t for t in fitting if 2 * t.rows * t.vectors >= largest), key=lambda t: -t.rows * t.vectors)


def _micro_kernel(sch: s_tir.Schedule, conv: s_tir.SBlockRV, tile: RegisterTile, lanes: int) -> None:
    output = fold_into_tile(sch, conv, inline_padding=False)
    batch, height, width, channel, kernel_h, kernel_w, reduction = sch.get_loops(conv)
    pixel_blocks, rows = sch.split(width, [None, tile.rows])
    pixel_blocks = sch.fuse(batch, height, pixel_blocks)
    channel_blocks, vectors, lane = sch.split(channel, [None, tile.vectors, lanes])
    m_outer, m_inner = sch.split(pixel_blocks, sch.sample_perfect_tile(pixel_blocks, n=2))
    n_outer, n_inner = sch.split(channel_blocks, sch.sample_perfect_tile(channel_blocks, n=2))
    reduction, unit_reduction = sch.split(reduction, [None, 1])
    # The unit reduction loop right above the lanes stops RewriteParallelVectorizeUnroll from
    # fusing the vectors into one wide vector: 3 x 16 lanes became one 48-lane vector that LLVM
    # rebuilt lane by lane from the stack every step (ppocr-det's 48-channel 1x1 at 2 % of peak).
    sch.reorder(m_outer, n_outer, m_inner, n_inner, kernel_h, kernel_w, reduction, rows, vectors, unit_reduction, lane)
    if int(sch.get(reduction).extent) < UNROLL_BELOW_CHANNELS_IN:
        sch.unroll(kernel_w)
        sch.unroll(reduction)
    sch.unroll(rows)
    sch.unroll(vectors)
    sch.vectorize(lane)
    write_from_tile(sch, output, n_inner, lanes)


design_spaces = rule_design_spaces(register_tiles, _micro_kernel)  # ApplyCustomRule's entry: one design space per tile
