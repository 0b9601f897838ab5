"""Convolutions whose output channels no full vector of the target divides, computed over zero
filters up to the next multiple of its vector, the extra outputs sliced off in the same kernel.

`pad_output_channels(target)` is a pass of the `prepare` pipeline; `padded_channels` says which
convolutions it pads and to how many channels. docs/compiler.md says when padding pays.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from edgetune.compiler.relax.graph import bound_value, constant_weight, is_call, rewrite_with, static_shape
from edgetune.compiler.tir.common import channel_lanes, datapath_lanes, row_tiles, vector_unit


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
