"""Convolutions of a single pixel (squeeze-and-excitation), scheduled when the model is prepared.

`schedule_single_pixel_convolutions(target)` is a pass of the `prepare` pipeline: the weight
stored input-channel-major (folded into the constant by the build), the product one vector of
all output channels, the gate's element-wise work once per channel, the gated map a vector of
channels per pixel; the kernel is marked scheduled (no tuning task). docs/compiler.md says why.
"""

from __future__ import annotations

import itertools

import tvm
from tvm import s_tir

from edgetune.compiler.tir.common import (
    SCHEDULED,
    convolution_shapes,
    has_reduction,
    is_elementwise,
    scheduling_pass,
    shape,
    top_blocks,
    writes_parameter,
)
from edgetune.compiler.tir.prepack import LAYOUT_FREE

LAYOUT_REWRITE = "meta_schedule.layout_rewrite_preproc"  # what the build folds into the weight
MAX_CHANNELS = 1024  # one vector of the output channels: LLVM splits it into registers
WEIGHT = 1  # the convolution block's reads: the data, then the weight


def schedule_single_pixel_convolutions(target: tvm.target.Target) -> tvm.transform.Pass:
    """The pass that schedules every float32 NHWC 1x1 convolution of a one-pixel map
    (`_scheduled`); other kernels, and every kernel on a target without a vector unit, are
    left as they are."""
    return scheduling_pass(target, "ScheduleSinglePixelConvolutions", lambda func, _unit: _scheduled(func))


def _scheduled(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc | None:
    """`func` scheduled as the module docstring says; None unless it is input copies, one
    convolution of a pixel with a layout-free weight, element-wise blocks over that pixel, then
    optionally a map of the same channels (the gate's multiply) and element-wise blocks over
    it, the last block writing the function's only output."""
    if not isinstance(func.body, s_tir.SBlockRealize):
        return None
    sch = s_tir.Schedule(func)
    blocks = top_blocks(sch)
    reductions = [i for i, b in enumerate(blocks) if has_reduction(sch, b)]
    if len(reductions) != 1 or not writes_parameter(sch, blocks[-1], list(func.params)):
        return None
    position = reductions[0]
    conv = blocks[position]
    if not _is_pixel_convolution(func, sch.get(conv)):
        return None
    pixel = shape(sch.get(conv).writes[0].source)
    epilogue = blocks[position + 1 :]
    gate = list(itertools.takewhile(lambda b: is_elementwise(sch, b, pixel), epilogue))
    rest = epilogue[len(gate) :]
    gated = shape(sch.get(rest[-1]).writes[0].source) if rest else pixel
    if gated[-1] != pixel[-1] or not all(is_elementwise(sch, b, gated) for b in rest[1:]):
        return None  # not a map of the same channels, element-wise after the gate's multiply
    try:
        for block in blocks[:position] + gate[:-1] + rest[:-1]:
            sch.compute_inline(block)
        _product(sch, conv)
        for block in gate[-1:] + rest[-1:]:
            _vector_of_channels(sch, block)
    except s_tir.ScheduleError:
        return None
    return sch.mod["main"].with_attr(SCHEDULED, True)


def _is_pixel_convolution(func: tvm.tirx.PrimFunc, conv: tvm.s_tir.SBlock) -> bool:
    """Whether the block is a float32 1x1 convolution (groups 1) from one pixel of at most
    MAX_CHANNELS channels to one of at most MAX_CHANNELS, NHWC with an OHWI weight that the
    build may store in another order (layout-free)."""
    shapes = convolution_shapes(conv)
    if shapes is None:
        return False
    (n, h, w, out_channels), data, weight = shapes
    in_channels = data[-1]
    if (n, h, w) != (1, 1, 1) or data != (1, 1, 1, in_channels) or weight != (out_channels, 1, 1, in_channels):
        return False
    if max(in_channels, out_channels) > MAX_CHANNELS or func.attrs is None or LAYOUT_FREE not in func.attrs:
        return False
    layout_free = [func.params[int(i)] for i in func.attrs[LAYOUT_FREE]]
    return any(conv.reads[WEIGHT].source.same_as(p) for p in layout_free)


def _product(sch: s_tir.Schedule, conv: s_tir.SBlockRV) -> None:
    """The convolution as `out[:] += pixel[i] * weight[i, :]` over the input channels i, the
    output channels one vector, the weight stored input-channel-major (folded by the build)."""
    rewrite = sch.cache_read(conv, WEIGHT, "global")
    sch.annotate(rewrite, LAYOUT_REWRITE, 1)
    sch.transform_layout(conv, ("read", WEIGHT), lambda o, h, w, i: (i, o))
    *pixel_loops, channels, kh, kw, inputs = sch.get_loops(conv)
    sch.reorder(*pixel_loops, kh, kw, inputs, channels)
    sch.vectorize(channels)
    init = sch.decompose_reduction(conv, pixel_loops[0])
    sch.vectorize(sch.get_loops(init)[-1])


def _vector_of_channels(sch: s_tir.Schedule, block: s_tir.SBlockRV) -> None:
    """The block's channels one vector; its pixels, if more than one, a parallel loop."""
    *pixels, channels = sch.get_loops(block)
    fused = sch.fuse(*pixels)
    if int(sch.get(fused).extent) > 1:
        sch.parallel(fused)
    sch.vectorize(channels)
