"""A register-blocked micro-kernel schedule for channels-last convolutions, searched by MetaSchedule.

In NHWC a 1x1 stride-1 convolution is a GEMM: out[n,h,w,co] = sum_ci X[n,h,w,ci] * W[co,0,0,ci],
with M = N*H*W rows, the output channels contiguous and a fused element-wise epilogue (bias,
batch-norm scale and shift, the clip of hard-swish). A KxK convolution with groups 1 (any
stride, padding) is the same with the reduction over (kh, kw, ci) and its input read from the
padded buffer: oneDNN's direct convolution. MetaSchedule's generic multi-level tiling finds a
good kernel for them only after many trials; onnxruntime (MLAS) and oneDNN run a fixed
register-blocked micro-kernel instead. This module gives MetaSchedule that micro-kernel as its
schedule space, so that a handful of trials only chooses among sane kernels:

- register tile: `rows` consecutive output pixels of an image row x `vectors` SIMD vectors of
  output channels, accumulated in registers over the whole reduction (the kh, kw, ci loops
  around the tile); one design space per (rows, vectors) pair that fits the target's vector
  registers. The vectors are the widest of the target's (on AVX-512: 16, 8 or 4 float32
  lanes) that divide the output channels;
- the tiles above it (pixels, channels) are sampled with `sample_perfect_tile`, so the
  evolutionary search mutates them; the stock ParallelizeVectorizeUnroll rule still annotates
  the function, which parallelizes the outer tile loops on multi-core targets; the stock
  RandomComputeLocation rule places the padding block;
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
from tvm.target import codegen

RULE = "edgetune_pointwise_nhwc"
VECTOR_LANES = "edgetune.vector_lanes"  # block annotations the rule reads, set by annotate_pointwise
VECTOR_REGISTERS = "edgetune.vector_registers"
MIN_ROWS, MAX_ROWS, MAX_TILE_CHANNELS = 4, 8, 64
MIN_LANES = 4
# 3-channel stems: stock MetaSchedule was faster (bench/pointwise_kernel.py, YOLOv8n's 320x320 stem)
MIN_CHANNELS_IN = 4


@dataclass(frozen=True)
class VectorUnit:
    """The SIMD registers a float32 micro-kernel can use."""

    lanes: int  # float32 per register
    registers: int


def vector_unit(target: tvm.target.Target) -> VectorUnit | None:
    """The target CPU's float32 SIMD registers, or None for targets the rule is not made for."""
    if target.kind.name != "llvm":
        return None
    triple = str(target.attrs.get("mtriple", "")) or codegen.llvm_get_system_triple()
    if triple.startswith("aarch64"):
        return VectorUnit(lanes=4, registers=32)
    if not triple.startswith("x86_64"):
        return None
    if codegen.llvm_cpu_has_features(["avx512f"], target):
        return VectorUnit(lanes=16, registers=32)
    if codegen.llvm_cpu_has_features(["avx2"], target):
        return VectorUnit(lanes=8, registers=16)
    return VectorUnit(lanes=4, registers=16)


def annotate_pointwise(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """`mod` with the block of every NHWC convolution kernel with groups 1 (one convolution, its
    padding and its element-wise epilogue) marked for the micro-kernel rule. Other kernels,
    NCHW and depthwise ones included, are left as they are."""
    unit = vector_unit(target)
    if unit is None:
        return mod
    annotated = mod
    for global_var, func in mod.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc) or not isinstance(func.body, s_tir.SBlockRealize):
            continue  # not a kernel with a root block: nothing MetaSchedule would schedule
        sch = s_tir.Schedule(func)
        marked = _convolution(sch, unit, list(func.params))
        if marked is None:
            continue
        conv, lanes = marked
        sch.annotate(conv, "schedule_rule", RULE)
        sch.annotate(conv, VECTOR_LANES, lanes)
        sch.annotate(conv, VECTOR_REGISTERS, unit.registers)
        if annotated is mod:
            annotated = mod.clone()
        annotated[global_var] = sch.mod["main"]
    return annotated


def _convolution(sch: s_tir.Schedule, unit: VectorUnit, params: list) -> tuple[s_tir.SBlockRV, int] | None:
    """The function's convolution block and the vector lanes its tiles use, if the function is
    exactly an NHWC convolution (its input's padding or copy at most before it, element-wise
    blocks after it, the last one writing the function's only output)."""
    blocks = _top_blocks(sch)
    reductions = [b for b in blocks if _has_reduction(sch, b)]
    if len(reductions) != 1:
        return None
    conv = reductions[0]
    lanes = _tile_lanes(sch.get(conv), unit)
    if lanes is None:
        return None
    out_shape = _shape(sch.get(conv).writes[0].source)
    producers, consumers = _around(sch, conv)
    if not all(_is_input_padding(sch, b) for b in producers):
        return None
    if not all(_is_elementwise(sch, b, out_shape) for b in consumers):
        return None
    outputs = [b for b in blocks if _writes_parameter(sch, b, params)]
    return (conv, lanes) if len(outputs) == 1 and sch.get(outputs[0]).same_as(sch.get(blocks[-1])) else None


def _tile_lanes(block: tvm.s_tir.SBlock, unit: VectorUnit) -> int | None:
    """For a float32 NHWC convolution with groups 1, OHWI weights (any kernel size, stride and
    padding) and at least MIN_CHANNELS_IN input channels, the widest vector (the unit's, or a half or a quarter of it, at least 4
    lanes) that divides its output channels, if the register tiles also divide its image rows."""
    if len(block.iter_vars) != 7 or len(block.reads) != 2 or len(block.writes) != 1:
        return None
    if [iv.iter_type for iv in block.iter_vars] != [tvm.tirx.IterVar.DataPar] * 4 + [tvm.tirx.IterVar.CommReduce] * 3:
        return None
    output = block.writes[0].source
    out_shape = _shape(output)
    data_shape, weight_shape = (_shape(region.source) for region in block.reads)
    if len(out_shape) != 4 or len(data_shape) != 4 or None in out_shape + data_shape or output.dtype != "float32":
        return None  # the tiles are sized for float32 lanes and static shapes
    batch, _, width, channels_out = out_shape
    channels_in = data_shape[3]
    if data_shape[0] != batch or len(weight_shape) != 4 or (weight_shape[0], weight_shape[3]) != (channels_out, channels_in):
        return None  # not groups 1 (a depthwise weight has 1 input channel per group)
    if channels_in < MIN_CHANNELS_IN or not _row_tiles(width):
        return None
    return next((lanes for lanes in _lane_choices(unit) if channels_out % lanes == 0), None)


def _lane_choices(unit: VectorUnit) -> list[int]:
    """Vector widths a tile may use, widest first: on AVX-512 zmm, ymm and xmm registers."""
    return [lanes for lanes in (unit.lanes, unit.lanes // 2, unit.lanes // 4) if lanes >= MIN_LANES]


def _top_blocks(sch: s_tir.Schedule) -> list[s_tir.SBlockRV]:
    """The blocks right under the function's root block."""
    return sch.get_child_blocks(sch.get_sblock(sch.mod["main"].body.block.name_hint))


def _around(sch: s_tir.Schedule, conv: s_tir.SBlockRV) -> tuple[list[s_tir.SBlockRV], list[s_tir.SBlockRV]]:
    """The top blocks before the convolution and those after it."""
    blocks = _top_blocks(sch)
    position = next(i for i, b in enumerate(blocks) if sch.get(b).same_as(sch.get(conv)))
    return blocks[:position], blocks[position + 1 :]


def _has_reduction(sch: s_tir.Schedule, block: s_tir.SBlockRV) -> bool:
    return any(iv.iter_type == tvm.tirx.IterVar.CommReduce for iv in sch.get(block).iter_vars)


def _is_input_padding(sch: s_tir.Schedule, block: s_tir.SBlockRV) -> bool:
    """A block such as `pad_temp`: one buffer copied, zeros around it or not."""
    b = sch.get(block)
    spatial = all(iv.iter_type == tvm.tirx.IterVar.DataPar for iv in b.iter_vars)
    return spatial and len(b.reads) == 1 and len(b.writes) == 1


def _is_elementwise(sch: s_tir.Schedule, block: s_tir.SBlockRV, shape: tuple[int, ...]) -> bool:
    b = sch.get(block)
    extents = tuple(int(iv.dom.extent) if isinstance(iv.dom.extent, tvm.tirx.IntImm) else None for iv in b.iter_vars)
    spatial = all(iv.iter_type == tvm.tirx.IterVar.DataPar for iv in b.iter_vars)
    return spatial and extents == shape and len(b.writes) == 1 and _shape(b.writes[0].source) == shape


def _writes_parameter(sch: s_tir.Schedule, block: s_tir.SBlockRV, params: list) -> bool:
    written = sch.get(block).writes[0].source
    return any(written.same_as(param) for param in params)


def _shape(buffer: tvm.tirx.Buffer) -> tuple[int | None, ...]:  # a TensorRegion's source is its buffer
    """The buffer's dimensions, None for each symbolic one (dynamic shapes are never matched)."""
    return tuple(int(dim) if isinstance(dim, tvm.tirx.IntImm) else None for dim in buffer.shape)


@dataclass(frozen=True)
class RegisterTile:
    """The accumulators of one micro-kernel step: `rows` pixels x `vectors` SIMD vectors."""

    rows: int
    vectors: int

    def registers(self) -> int:
        return self.rows * self.vectors + self.vectors  # accumulators + the weight vectors of one k


def register_tiles(width: int, channels_out: int, lanes: int, registers: int) -> list[RegisterTile]:
    """The register tiles of `lanes`-wide vectors that divide the image row and the output
    channels and fit the registers, largest first (none smaller than half the largest).
    A tile spans at most MAX_TILE_CHANNELS output channels."""
    rows = _row_tiles(width)
    vectors = [v for v in range(1, MAX_TILE_CHANNELS // lanes + 1) if channels_out % (v * lanes) == 0]
    tiles = [RegisterTile(r, v) for r in rows for v in vectors]
    fitting = [t for t in tiles if t.registers() <= registers]
    largest = max(t.rows * t.vectors for t in fitting)
    return sorted((t for t in fitting if 2 * t.rows * t.vectors >= largest), key=lambda t: -t.rows * t.vectors)


def _row_tiles(width: int) -> list[int]:
    """Pixel counts of a register tile: divisors of the image width from MIN_ROWS to MAX_ROWS.
    Narrower images (the 1x1 maps of squeeze-excitation blocks) are matrix-vector products,
    left to the stock rules."""
    return [rows for rows in range(MIN_ROWS, MAX_ROWS + 1) if width % rows == 0]


@tvm.register_global_func(f"s_tir.meta_schedule.cpu.{RULE}", override=True)
def schedule_pointwise(sch: s_tir.Schedule, conv: s_tir.SBlockRV) -> list[s_tir.Schedule]:
    """ApplyCustomRule's entry: one design space per register tile."""
    block = sch.get(conv)
    lanes, registers = int(block.annotations[VECTOR_LANES]), int(block.annotations[VECTOR_REGISTERS])
    _, _, width, channels_out = _shape(block.writes[0].source)
    spaces = []
    for tile in register_tiles(width, channels_out, lanes, registers):
        space = sch.copy()
        space.seed(sch.fork_seed())
        _micro_kernel(space, conv, tile, lanes)
        spaces.append(space)
    return spaces


def _micro_kernel(sch: s_tir.Schedule, conv: s_tir.SBlockRV, tile: RegisterTile, lanes: int) -> None:
    _inline_input_copy(sch, conv)
    output = _fold_epilogue(sch, conv)
    batch, height, width, channel, kernel_h, kernel_w, reduction = sch.get_loops(conv)
    pixel_blocks, rows = sch.split(width, [None, tile.rows])
    pixel_blocks = sch.fuse(batch, height, pixel_blocks)
    channel_blocks, vectors, lane = sch.split(channel, [None, tile.vectors, lanes])
    m_outer, m_inner = sch.split(pixel_blocks, sch.sample_perfect_tile(pixel_blocks, n=2))
    n_outer, n_inner = sch.split(channel_blocks, sch.sample_perfect_tile(channel_blocks, n=2))
    sch.reorder(m_outer, n_outer, m_inner, n_inner, kernel_h, kernel_w, reduction, rows, vectors, lane)
    sch.unroll(rows)
    sch.unroll(vectors)
    sch.vectorize(lane)
    sch.reverse_compute_at(output, n_inner)
    *_, out_rows, out_channels = sch.get_loops(output)
    out_vectors, out_lane = sch.split(out_channels, [None, lanes])
    sch.unroll(out_rows)
    sch.unroll(out_vectors)
    sch.vectorize(out_lane)


def _inline_input_copy(sch: s_tir.Schedule, conv: s_tir.SBlockRV) -> None:
    """Inline the convolution's input block if it only copies the input. A padding block is
    left where it is: MetaSchedule samples its compute location (inlined into the loads, at a
    tile loop, or whole before the convolution), whichever runs fastest on the board."""
    for producer in sch.get_producers(conv):
        block = sch.get(producer)
        if _shape(block.reads[0].source) == _shape(block.writes[0].source):
            sch.compute_inline(producer)


def _fold_epilogue(sch: s_tir.Schedule, conv: s_tir.SBlockRV) -> s_tir.SBlockRV:
    """Inline the epilogue: one block left after the convolution, which writes the output from
    accumulators in registers (scope "local")."""
    *epilogue, output = _around(sch, conv)[1] or [None]
    for block in epilogue:
        sch.compute_inline(block)
    if output is None:
        return sch.cache_write(conv, 0, "local")
    sch.set_scope(conv, 0, "local")
    return output
