"""A register-tiled schedule for channels-last depthwise convolutions, searched by MetaSchedule.

In NHWC a depthwise convolution (groups == channels, one filter per channel) is
out[n,y,x,c] = sum_{ry,rx} pad[n, y*s + ry, x*s + rx, c] * W[c,ry,rx,0]: no reduction over
channels, so the channels are the SIMD lanes, and the input vectors are contiguous loads.
It is bound by loads, not by FMAs: one input vector per tap and pixel. The rule's schedule
space is a register-tiled micro-kernel:

- register tile: `pixels` consecutive output pixels of an image row x `vectors` SIMD vectors of
  channels, accumulated in registers over all the taps (the kh x kw loops inside the tile,
  unrolled with it into straight-line code); one design space per tile that fits the
  target's vector registers. The vectors are as wide as the registers, or half or a quarter
  as wide when the channel count needs it (24 channels: 3 vectors of 8 on AVX-512);
- the channel blocks are split in two with `sample_perfect_tile` (the evolutionary search
  mutates it): the outer part runs over the whole image, the inner part inside each tile of
  pixels, so the search picks between walking the image once per channel block and walking
  it once;
- the epilogue (bias, batch-norm scale and shift, clip, hard-swish) is inlined into one block
  computed right after the tile's taps, from the accumulators, vectorized over channels;
- the weights are read in the tile's order (channel block, tap, vector): RewriteLayout
  pre-packs them, so the weight vectors of a tap are contiguous;
- the padding is inlined into the convolution: each input vector load tests the image borders
  (one scalar test per vector: the borders do not depend on the channel). On PP-LCNet's nine
  depthwise kernels that was 1.4-3.5x faster than materializing the padded input before the
  convolution (a buffer allocated and written at each call), and 1.1-1.9x faster than padding
  each tile's input window inside the tile loop (bench/README.md, "rule_kernels.py --kind depthwise").

`annotate_depthwise` marks the convolution blocks; MetaSchedule's ApplyCustomRule then calls
the function registered below. The tuned record is a trace: building needs no rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir

from edgetune.compiler.schedule_rules.common import (
    VectorUnit,
    channel_lanes,
    convolution_shapes,
    fold_into_tile,
    lone_convolution,
    mark_kernels,
    register_rule,
    row_tiles,
    shape,
    write_from_tile,
)

RULE = "edgetune_depthwise_nhwc"
MAX_VECTORS = 2  # channel vectors per tile; the reuse is across pixels (one weight vector per tap serves them)


def annotate_depthwise(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """`mod` with the block of every NHWC depthwise convolution kernel (its padding, the
    convolution and its element-wise epilogue) marked for the depthwise rule. Other kernels,
    NCHW ones and kernels already marked by another rule included, are left as they are."""
    return mark_kernels(mod, target, RULE, _depthwise_convolution)


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
    return (data_shape[0] == batch and data_shape[3] == channels and weight_shape[0] == channels
            and weight_shape[3] == 1 and channel_lanes(channels, unit.lanes) is not None
            and bool(row_tiles(width)))  # fmt: skip


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


register_rule(RULE, pixel_tiles, _micro_kernel)  # ApplyCustomRule's entry: one design space per tile
