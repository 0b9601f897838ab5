"""The micro-kernel schedule rule of NHWC depthwise convolutions: a register tile of pixels x
SIMD vectors of channels accumulated over all the taps, the padding inlined into the loads.

`annotate_depthwise(target)` is the pipeline's pass that marks the kernels; `design_spaces` is
the rule's function (edgetune.compiler.tir.rules registers it). docs/compiler.md has the design.
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
    shape,
    write_from_tile,
)

RULE = "edgetune_depthwise_nhwc"
MAX_VECTORS = 2  # channel vectors per tile; the reuse is across pixels (one weight vector per tap serves them)


def annotate_depthwise(target: tvm.target.Target) -> tvm.transform.Pass:
    """`mod` with the block of every NHWC depthwise convolution kernel (its padding, the
    convolution and its element-wise epilogue) marked for the depthwise rule. Other kernels,
    NCHW ones and kernels already marked by another rule included, are left as they are."""
    return marking_pass(target, RULE, _depthwise_convolution, "AnnotateDepthwise")


def _depthwise_convolution(sch: s_tir.Schedule, unit: VectorUnit, params: list) -> s_tir.SBlockRV | None:
    """The function's convolution block if the function is exactly an NHWC depthwise
    convolution (its input padding at most before it, element-wise blocks after it, the last
    one writing the function's only output)."""
    conv = lone_convolution(sch, params, _is_padding)
    return conv if conv is not None and _is_depthwise(sch.get(conv), unit) else None


def _is_depthwise(block: tvm.s_tir.SBlock, unit: VectorUnit) -> bool:
    """A float32 NHWC convolution with OHWI weights of one input channel per output channel, as
    many output channels as input channels (groups == channels, no channel multiplier), and
    image rows and channels that the register tiles divide (channels in vectors of the
    register's width, or of a half or a quarter of it)."""
    shapes = convolution_shapes(block)
    if shapes is None:
        return False
    out_shape, data_shape, weight_shape = shapes
    batch, _, width, channels = out_shape
    return (
        data_shape[0] == batch
        and data_shape[3] == channels
        and weight_shape[0] == channels
        and weight_shape[3] == 1
        and channel_lanes(channels, unit.lanes) is not None
        and bool(row_tiles(width))
    )


def _is_padding(sch: s_tir.Schedule, block: s_tir.SBlockRV) -> bool:
    """A block such as `pad_temp`: one 4-d buffer copied into one at least as large, with the
    same batch and channels."""
    b = sch.get(block)
    if len(b.reads) != 1 or len(b.writes) != 1:
        return False
    source, padded = shape(b.reads[0].source), shape(b.writes[0].source)
    if len(source) != 4 or len(padded) != 4 or None in source + padded:
        return False
    return source[0] == padded[0] and source[3] == padded[3] and all(p >= s for p, s in zip(padded, source))


@dataclass(frozen=True)
class PixelTile:
    """The accumulators of one micro-kernel step: `pixels` x `vectors` SIMD vectors."""

    pixels: int
    vectors: int

    def registers(self) -> int:
        return self.pixels * self.vectors + self.vectors + 1  # accumulators, a tap's weights, an input


def pixel_tiles(width: int, channels: int, unit: VectorUnit) -> list[PixelTile]:
    """The register tiles that divide the output row and the channels and fit the registers."""
    lanes = channel_lanes(channels, unit.lanes)
    vectors = [v for v in range(1, MAX_VECTORS + 1) if channels % (v * lanes) == 0]
    tiles = [PixelTile(p, v) for p in row_tiles(width) for v in vectors]
    return [t for t in tiles if t.registers() <= unit.registers]


def _micro_kernel(sch: s_tir.Schedule, conv: s_tir.SBlockRV, tile: PixelTile, lanes: int) -> None:
    output = fold_into_tile(sch, conv)
    batch, height, width, channel, kernel_h, kernel_w, unit_channel = sch.get_loops(conv)
    pixel_blocks, pixels = sch.split(width, [None, tile.pixels])
    channel_blocks, vectors, lane = sch.split(channel, [None, tile.vectors, lanes])
    c_outer, c_inner = sch.split(channel_blocks, sch.sample_perfect_tile(channel_blocks, n=2))
    rows = sch.fuse(batch, height)
    # The unit reduction loop right above the lanes stops RewriteParallelVectorizeUnroll from
    # fusing the pixels into one wide vector, whose lanes would each test the image borders.
    sch.reorder(c_outer, rows, pixel_blocks, c_inner, kernel_h, kernel_w, pixels, vectors, unit_channel, lane)
    for loop in (kernel_h, kernel_w, pixels, vectors):
        sch.unroll(loop)
    sch.vectorize(lane)
    write_from_tile(sch, output, c_inner, lanes)


design_spaces = rule_design_spaces(pixel_tiles, _micro_kernel)  # ApplyCustomRule's entry: one design space per tile
