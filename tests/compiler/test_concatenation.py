"""Kernels that concatenate along their innermost axis, scheduled by `prepare`
(edgetune.compiler.tir.concatenation): which kernels, that they are no tuning task, and that the
scheduled kernel computes what NumPy computes, whatever the widths of the parts."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

from edgetune.compiler.prepare import build_untuned, extract_tasks, prepare
from edgetune.compiler.tir.common import is_scheduled

pytestmark = pytest.mark.tvm

HOST = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})  # 4 float32 lanes: parts of 16 at most
SCALE, SHIFT = np.float32(0.5), np.float32(3.0)


def concatenation(widths: list[int], axis: int, size=(3, 5)) -> tvm.IRModule:
    """A Relax module: NHWC inputs of `widths` channels, the first through a sigmoid,
    concatenated along `axis`, then scaled and shifted."""
    builder = relax.BlockBuilder()
    inputs = [relax.Var(f"x{i}", relax.TensorType((1, *size, width), "float32")) for i, width in enumerate(widths)]
    with builder.function("main", inputs):
        with builder.dataflow():
            parts = [builder.emit(relax.op.sigmoid(inputs[0])), *inputs[1:]]
            joined = builder.emit(relax.op.concat(parts, axis=axis))
            scaled = relax.op.add(relax.op.multiply(joined, relax.const(SCALE)), relax.const(SHIFT))
            out = builder.emit_output(scaled)
        builder.emit_func_output(out)
    return builder.get()


def in_numpy(values: list[np.ndarray], axis: int) -> np.ndarray:
    first = np.float32(1) / (np.float32(1) + np.exp(-values[0]))
    return np.concatenate([first, *values[1:]], axis=axis) * SCALE + SHIFT


def scheduled_kernels(prepared: tvm.IRModule) -> list[str]:
    return [gv.name_hint for gv, func in prepared.functions_items() if is_scheduled(func)]


def run(prepared: tvm.IRModule, values: list[np.ndarray]) -> np.ndarray:
    vm = relax.VirtualMachine(build_untuned(prepared, HOST), tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(v) for v in values)).numpy()


@settings(max_examples=8, deadline=None)
@given(widths=st.lists(st.integers(1, 70), min_size=2, max_size=4), seed=st.integers(0, 2**16))
def test_a_channel_concatenation_is_scheduled_and_answers_what_numpy_computes(widths, seed):
    """Parts of any width: narrower than a vector, between vectors, wider than the widest
    vector a part computes at once."""
    prepared = prepare(concatenation(widths, axis=3), HOST)
    assert [name for name in scheduled_kernels(prepared) if "concatenate" in name], "the concatenation is not scheduled"
    assert not [t.task_name for t in extract_tasks(prepared, HOST) if "concatenate" in t.task_name]
    rng = np.random.default_rng(seed)
    values = [rng.standard_normal((1, 3, 5, w)).astype("float32") for w in widths]
    np.testing.assert_allclose(run(prepared, values), in_numpy(values, axis=3), rtol=1e-6, atol=1e-6)


def test_a_concatenation_of_another_axis_stays_a_tuning_task():
    """Rows concatenated: every lane of a channel vector comes from one input, the stock rules'
    schedule vectorizes."""
    prepared = prepare(concatenation([8, 8], axis=1), HOST)
    assert not scheduled_kernels(prepared)
    assert [t.task_name for t in extract_tasks(prepared, HOST) if "concatenate" in t.task_name]
    values = [np.random.default_rng(1).standard_normal((1, 3, 5, 8)).astype("float32") for _ in range(2)]
    np.testing.assert_allclose(run(prepared, values), in_numpy(values, axis=1), rtol=1e-6, atol=1e-6)
