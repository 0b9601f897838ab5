"""A GEMM micro-kernel schedule for channels-last pointwise convolutions, searched by MetaSchedule.

In NHWC a 1x1 stride-1 convolution is a GEMM: out[n,h,w,co] = sum_ci X[n,h,w,ci] * W[co,0,0,ci],
with M = N*H*W rows, the output channels contiguous and a fused element-wise epilogue (bias,
batch-norm scale and shift, the clip of hard-swish). MetaSchedule's generic multi-level tiling
finds a good kernel for it only after many trials; onnxruntime (MLAS) and oneDNN run a fixed
register-blocked micro-kernel instead. This module gives MetaSchedule that micro-kernel as its
schedule space, so that a handful of trials only chooses among sane kernels:

- register tile: `rows` consecutive pixels of an image row x `vectors` SIMD vectors of output
  channels, accumulated in registers over the whole reduction (the K loop around the tile);
  one design space per (rows, vectors) pair that fits the target's vector registers;
- the tiles above it (pixels, channels) are sampled with `sample_perfect_tile`, so the
  evolutionary search mutates them; the stock ParallelizeVectorizeUnroll rule still annotates
  the function, which parallelizes the outer tile loops on multi-core targets;
- the epilogue is inlined into one block computed right after the tile's reduction, from the
  accumulators, vectorized over the output channels;
- the weights are read in the tile's order: MetaSchedule's RewriteLayout pre-packs them.

`annotate_pointwise` marks the convolution blocks with `schedule_rule`; MetaSchedule's
ApplyCustomRule then calls the function registered below (and no other rule touches the block).
The tuned record is a trace, replayed when the database is applied: building needs no rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir

from edgetune.tune.schedule_rules.common import (
    VectorUnit,
    fold_into_tile,
    lone_convolution,
    mark_kernels,
    register_rule,
    row_tiles,
    shape,
    write_from_tile,
)

RULE = "edgetune_pointwise_nhwc"
MAX_VECTORS = 4


def annotate_pointwise(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """`mod` with the block of every NHWC 1x1 stride-1 convolution kernel (one convolution and
    its element-wise epilogue) marked for the micro-kernel rule. Other kernels, NCHW ones
    included, are left as they are."""
    return mark_kernels(mod, target, RULE, _pointwise_convolution)


def _pointwise_convolution(sch: s_tir.Schedule, unit: VectorUnit, params: list) -> s_tir.SBlockRV | None:
    """The function's convolution block if the function is exactly an NHWC pointwise
    convolution (a copy of its input at most before it, element-wise blocks after it, the
    last one writing the function's only output)."""
    conv = lone_convolution(sch, params, _is_plain_copy)
    return conv if conv is not None and _is_pointwise(sch.get(conv), unit) else None


def _is_pointwise(block: tvm.s_tir.SBlock, unit: VectorUnit) -> bool:
    """A float32 NHWC convolution with OHWI 1x1 weights whose output has its input's size (stride
    1, no padding), with image rows and output channels that the register tiles divide."""
    if len(block.iter_vars) != 7 or len(block.reads) != 2 or len(block.writes) != 1:
        return False
    output = block.writes[0].source
    out_shape = shape(output)
    data_shape, weight_shape = (shape(region.source) for region in block.reads)
    if len(out_shape) != 4 or len(data_shape) != 4 or None in out_shape + data_shape or output.dtype != "float32":
        return False  # the tiles are sized for float32 lanes and static shapes
    batch, height, width, channels_out = out_shape
    channels_in = data_shape[3]
    return (data_shape == (batch, height, width, channels_in) and weight_shape == (channels_out, 1, 1, channels_in)
            and channels_out % unit.lanes == 0 and bool(row_tiles(width)))  # fmt: skip


def _is_plain_copy(sch: s_tir.Schedule, block: s_tir.SBlockRV) -> bool:
    """A block such as `pad_temp` without padding: one same-shaped buffer copied."""
    b = sch.get(block)
    return len(b.reads) == 1 and len(b.writes) == 1 and shape(b.reads[0].source) == shape(b.writes[0].source)


@dataclass(frozen=True)
class RegisterTile:
    """The accumulators of one micro-kernel step: `rows` pixels x `vectors` SIMD vectors."""

    rows: int
    vectors: int

    def registers(self) -> int:
        return self.rows * self.vectors + self.vectors  # accumulators + the weight vectors of one k


def register_tiles(width: int, channels_out: int, unit: VectorUnit) -> list[RegisterTile]:
    """The register tiles that divide the image row and the output channels and fit the
    registers, largest first (none smaller than half the largest)."""
    rows = row_tiles(width)
    vectors = [v for v in range(1, MAX_VECTORS + 1) if channels_out % (v * unit.lanes) == 0]
    tiles = [RegisterTile(r, v) for r in rows for v in vectors]
    fitting = [t for t in tiles if t.registers() <= unit.registers]
    largest = max(t.rows * t.vectors for t in fitting)
    return sorted((t for t in fitting if 2 * t.rows * t.vectors >= largest), key=lambda t: -t.rows * t.vectors)


def _micro_kernel(sch: s_tir.Schedule, conv: s_tir.SBlockRV, tile: RegisterTile, lanes: int) -> None:
    output = fold_into_tile(sch, conv)
    batch, height, width, channel, kernel_h, kernel_w, reduction = sch.get_loops(conv)
    k = sch.fuse(kernel_h, kernel_w, reduction)
    pixel_blocks, rows = sch.split(width, [None, tile.rows])
    pixel_blocks = sch.fuse(batch, height, pixel_blocks)
    channel_blocks, vectors, lane = sch.split(channel, [None, tile.vectors, lanes])
    m_outer, m_inner = sch.split(pixel_blocks, sch.sample_perfect_tile(pixel_blocks, n=2))
    n_outer, n_inner = sch.split(channel_blocks, sch.sample_perfect_tile(channel_blocks, n=2))
    sch.reorder(m_outer, n_outer, m_inner, n_inner, k, rows, vectors, lane)
    sch.unroll(rows)
    sch.unroll(vectors)
    sch.vectorize(lane)
    write_from_tile(sch, output, n_inner, lanes)


register_rule(RULE, register_tiles, _micro_kernel)  # ApplyCustomRule's entry: one design space per tile
