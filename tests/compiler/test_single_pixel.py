"""The 1x1 convolutions of one pixel (squeeze-and-excitation), scheduled by `prepare`
(edgetune.compiler.tir.single_pixel): which kernels, that they are no tuning task and run on
pre-packed weights, and that the model answers what NumPy computes, whatever the channels."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from edgetune.compiler.prepare import apply_database, build_untuned, extract_tasks, prepare
from edgetune.compiler.tir.common import is_scheduled

pytestmark = pytest.mark.tvm

HOST = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})


def squeeze_excitation(
    size: tuple[int, int], channels: int, squeezed: int, residual: bool, weights: dict[str, np.ndarray]
) -> tvm.IRModule:
    """A Relax module of an NHWC squeeze-and-excitation block: the map averaged to one pixel,
    a 1x1 convolution to `squeezed` channels and ReLU, one back to `channels` and a hard
    sigmoid, the map multiplied by that gate (and, with `residual`, the map added)."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, *size, channels), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            pooled = builder.emit(relax.op.mean(x, axis=[1, 2], keepdims=True))
            squeeze = relax.op.nn.relu(_convolution(pooled, weights["squeeze"], weights["squeeze_bias"]))
            excite = _convolution(builder.emit(squeeze), weights["excite"], weights["excite_bias"])
            gate = relax.op.minimum(
                relax.op.maximum(
                    excite * relax.const(np.float32(0.2)) + relax.const(np.float32(0.5)), relax.const(np.float32(0))
                ),
                relax.const(np.float32(1)),
            )
            gated = relax.op.multiply(x, builder.emit(gate))
            out = builder.emit_output(relax.op.add(gated, x) if residual else gated)
        builder.emit_func_output(out)
    return builder.get()


def _convolution(data, weight: np.ndarray, bias: np.ndarray):
    conv = relax.op.nn.conv2d(data, relax.const(weight), data_layout="NHWC", kernel_layout="OHWI")
    return relax.op.add(conv, relax.const(bias.reshape(1, 1, 1, -1)))


def in_numpy(x: np.ndarray, weights: dict[str, np.ndarray], residual: bool) -> np.ndarray:
    pooled = x.astype(np.float64).mean(axis=(1, 2))[0]
    squeezed = np.maximum(weights["squeeze"][:, 0, 0, :] @ pooled + weights["squeeze_bias"], 0)
    gate = np.clip((weights["excite"][:, 0, 0, :] @ squeezed + weights["excite_bias"]) * 0.2 + 0.5, 0, 1)
    return x * gate + x if residual else x * gate


def random_weights(rng: np.random.Generator, channels: int, squeezed: int) -> dict[str, np.ndarray]:
    shapes = {
        "squeeze": (squeezed, 1, 1, channels),
        "squeeze_bias": (squeezed,),
        "excite": (channels, 1, 1, squeezed),
        "excite_bias": (channels,),
    }
    return {name: rng.standard_normal(shape).astype("float32") for name, shape in shapes.items()}


def read_prepacked(built: tvm.IRModule) -> list[str]:
    """The built module's convolution kernels that read their weight pre-packed, input
    channels major (the build reorders it once, in a function of its own)."""
    return [
        gv.name_hint
        for gv, func in built.functions_items()
        if isinstance(func, tvm.tirx.PrimFunc)
        and "conv2d" in gv.name_hint
        and "weight_prepack" not in gv.name_hint
        and any(len(param.shape) == 2 for param in func.params)
    ]


def scheduled_convolutions(prepared: tvm.IRModule) -> list[str]:
    return [gv.name_hint for gv, func in prepared.functions_items() if is_scheduled(func) and "conv2d" in gv.name_hint]


@settings(max_examples=8, deadline=None)
@given(
    channels=st.integers(1, 70),
    squeezed=st.integers(1, 24),
    height=st.integers(1, 4),
    width=st.integers(1, 5),
    residual=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_the_convolutions_of_a_pixel_are_scheduled_and_answer_what_numpy_computes(
    channels, squeezed, height, width, residual, seed
):
    """Channels narrower than a vector, between vectors and wider than a register file row;
    a map of one pixel or more; the gated map alone or with a residual add fused in."""
    rng = np.random.default_rng(seed)
    weights = random_weights(rng, channels, squeezed)
    prepared = prepare(squeeze_excitation((height, width), channels, squeezed, residual, weights), HOST)
    assert len(scheduled_convolutions(prepared)) == 2, "the squeeze and the excitation are not both scheduled"
    assert not [t.task_name for t in extract_tasks(prepared, HOST) if "conv2d" in t.task_name]
    assert len(read_prepacked(apply_database(prepared, ms.database.MemoryDatabase(), HOST))) == 2, (
        "a convolution reorders its weight on every call instead of reading it pre-packed"
    )
    x = rng.standard_normal((1, height, width, channels)).astype("float32")
    vm = relax.VirtualMachine(build_untuned(prepared, HOST), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(out, in_numpy(x, weights, residual), rtol=1e-5, atol=1e-5)


def test_a_pointwise_convolution_of_a_map_stays_a_tuning_task():
    """A 1x1 convolution over more than one pixel is the convolution rule's (or the stock
    rules') to tune."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 2, 2, 8), "float32"))
    weight = np.random.default_rng(3).standard_normal((16, 1, 1, 8)).astype("float32")
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(
                relax.op.nn.conv2d(x, relax.const(weight), data_layout="NHWC", kernel_layout="OHWI")
            )
        builder.emit_func_output(out)
    prepared = prepare(builder.get(), HOST)
    assert not scheduled_convolutions(prepared)
    assert [t.task_name for t in extract_tasks(prepared, HOST) if "conv2d" in t.task_name]
