"""Convolutions whose output channels no full vector of the target divides, computed over zero
filters up to the next multiple of its vector, the extra outputs sliced off.

The convolution rule tiles output channels in the widest vectors that divide them
(`schedule_rules.common.channel_lanes`): on AVX-512, 24 channels run as 3 vectors of 8 float32
lanes, 3 multiply-adds per pixel and input channel where 32 would take 2. ddddocr-det's
24-channel convolutions ran at 95-120 GFLOP/s against 190-250 for its others; with their filters
padded to 32 and the slice back inside the same kernel (the rule writes the tile's first 24
channels under a predicate) they were 1.12-1.31x faster, PP-OCR's layers of 24, 60, 104, 120 and
360 channels 1.14-3.56x (bench/channel_padding.py, bench/README.md). A convolution is padded when
its padded channels take fewer of the CPU's vector operations than its own channels do, and only
where the rule takes its kernel (its rows fit a register tile): stock MetaSchedule, given a
padded and sliced kernel, pre-packed its weight wrongly once (edgetune.compiler.layout). A CPU
whose 512-bit operation is two 256-bit ones (`common.datapath_lanes`: AMD Zen 4) computes 24
channels in 3 operations either way, 32 padded ones in 4: there, the seven layers measured that
pad 8-lane vectors to 16-lane ones ran 0.75-0.96x as fast padded, and only channels that 4-lane
vectors divide are padded.

Runs in `prepare`, which tuning and building share, so both see the same kernels. The zero
filters are a concatenation onto the constant weight, folded into it before fusion.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from edgetune.compiler.graph import bound_value, constant_weight, is_call, rewrite_with, static_shape
from edgetune.compiler.schedule_rules.common import channel_lanes, datapath_lanes, row_tiles, vector_unit


def pad_output_channels(target: tvm.target.Target) -> tvm.transform.Pass:
    """The pass that pads the output channels of `target`'s narrow-vector convolutions."""
    unit = vector_unit(target)
    lanes, datapath = (unit.lanes, datapath_lanes(target, unit)) if unit is not None else (None, None)

    @relax.expr_functor.mutator
    class _PadChannels(relax.PyExprMutator):
        def visit_call_(self, call: relax.Call) -> relax.Expr:
            call = super().visit_call_(call)
            padded = padded_channels(call, lanes, datapath) if lanes and is_call(call, "relax.nn.conv2d") else None
            if padded is None or constant_weight(bound_value(self, call.args[1])) is None:
                return call
            data, weight = call.args
            channels = static_shape(call)[3]
            _, kernel_h, kernel_w, channels_in = static_shape(weight)
            zeros = relax.const(np.zeros((padded - channels, kernel_h, kernel_w, channels_in), "float32"))
            wide = relax.Call(call.op, [data, relax.op.concat([weight, zeros], axis=0)], call.attrs)
            return relax.op.strided_slice(wide, axes=[3], begin=[0], end=[channels])

    return rewrite_with(_PadChannels, "PadOutputChannels")


def padded_channels(call: relax.Call, lanes: int, datapath: int) -> int | None:
    """The output channels a float32 NHWC convolution (groups 1, OHWI weight, static shapes) is
    computed over on a CPU of `lanes` float32 lanes per register and `datapath` per operation,
    where padding to full registers takes fewer operations than its channels take in the
    narrower vectors that divide them; None where it is left as it is."""
    attrs = call.attrs
    out, weight = static_shape(call), static_shape(call.args[1])
    if out is None or weight is None or str(call.ty.dtype) != "float32":
        return None
    if (str(attrs.data_layout), str(attrs.kernel_layout), int(attrs.groups)) != ("NHWC", "OHWI", 1):
        return None
    if str(attrs.out_layout or attrs.data_layout) != "NHWC" or not row_tiles(out[2], tail=True):
        return None
    channels = out[3]
    narrow = channel_lanes(channels, lanes)
    padded = -(-channels // lanes) * lanes
    if narrow is None:
        return None
    return padded if _operations(padded, lanes, datapath) < _operations(channels, narrow, datapath) else None


def _operations(channels: int, lanes: int, datapath: int) -> int:
    """The vector operations that compute `channels` in vectors of `lanes` on a `datapath`."""
    return channels // lanes * -(-lanes // datapath)
