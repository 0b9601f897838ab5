"""Softmax-like row reductions (`tir/rows.py`): an attention's softmax computed row by row in
parallel, its reductions accumulated in vectors of partial results, answering what NumPy
computes; kernels the schedule is not made for are left to MetaSchedule; an attention model
built with it answers like onnxruntime and has no softmax task."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from support.onnx_samples import save
from support.rule_tuning import assert_answers_like_onnxruntime
from tvm import relax, te, topi
from tvm.s_tir import meta_schedule as ms

from edgetune.compiler.models import load_model
from edgetune.compiler.prepare import extract_tasks, prepare
from edgetune.compiler.relax.fast_math import legalize_fast_math
from edgetune.compiler.tir.common import SCHEDULED
from edgetune.compiler.tir.rows import _by_rows, schedule_row_reductions
from edgetune.inventory.schema import Model, ModelInput

pytestmark = pytest.mark.tvm

AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server", "num-cores": 2})  # compiled, never run
RUNS_HERE = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})  # 4 lanes, any x86-64 host
HEADS, TOKENS, HEAD = 2, 32, 8
RNG = np.random.default_rng(3)
MASK = np.where(RNG.random(TOKENS) < 0.25, -10000.0, 0.0).astype(np.float32).reshape(1, 1, 1, TOKENS)


def fused_kernels(shape: tuple[int, ...], build) -> list[tvm.tirx.PrimFunc]:
    """The kernels Relax fuses from `build(x)` on a float32 tensor of `shape`, legalized as
    `prepare` legalizes them (fast math)."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(build(x))
        builder.emit_func_output(out)
    with RUNS_HERE:
        mod = tvm.transform.Sequential([legalize_fast_math(), relax.get_pipeline("zero")])(builder.get())
    return [func for _, func in mod.functions_items() if isinstance(func, tvm.tirx.PrimFunc)]


def softmax(x: relax.Expr) -> relax.Expr:
    return relax.op.nn.softmax(x, axis=-1)


def attention_scores(shape: tuple[int, ...]) -> np.ndarray:
    """Scores as an attention's softmax gets them: a few logits apart, masked keys at -10000."""
    return (RNG.standard_normal(shape) * 4 + MASK).astype(np.float32)


def numpy_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def compiled(func: tvm.tirx.PrimFunc, target: tvm.target.Target):
    return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)


def run(func: tvm.tirx.PrimFunc, x: np.ndarray) -> np.ndarray:
    lib = compiled(func, RUNS_HERE)
    result = tvm.runtime.tensor(np.zeros(x.shape, np.float32))
    lib.mod["main"](tvm.runtime.tensor(x), result)
    return result.numpy()


def loops(func: tvm.tirx.PrimFunc, kind: str) -> list[int]:
    """The extents of every loop of `kind` ("parallel", "vectorized") in `func`, in order."""
    return [int(extent) for extent in re.findall(rf"T\.{kind}\(T\.int64\((\d+)\)", func.script())]


def test_an_attentions_softmax_is_computed_row_by_row_in_vectors_and_answers_what_numpy_computes():
    shape = (1, HEADS, TOKENS, TOKENS)
    (kernel,) = fused_kernels(shape, softmax)
    scheduled = _by_rows(kernel, 16)
    assert scheduled is not None and scheduled.attrs[SCHEDULED]
    assert loops(scheduled, "parallel") == [HEADS * TOKENS]  # one parallel loop, over rows
    # the max's and the sum's partial results, the exponentials, the quotients: a vector each
    assert loops(scheduled, "vectorized") == [16] * 4
    assembly = compiled(scheduled, AVX512).mod.inspect_source("asm")
    assert "vmaxps\t%zmm" in assembly and "vaddps\t%zmm" in assembly  # both reductions in whole registers

    scores = attention_scores(shape)
    got = run(_by_rows(kernel, 4), scores)
    np.testing.assert_allclose(got, numpy_softmax(scores), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-5)


def test_a_row_no_register_divides_is_computed_in_the_widest_vector_that_does():
    (kernel,) = fused_kernels((3, 100), softmax)
    scheduled = _by_rows(kernel, 16)
    assert scheduled is not None and set(loops(scheduled, "vectorized")) == {4}
    x = RNG.standard_normal((3, 100)).astype(np.float32)
    np.testing.assert_allclose(run(scheduled, x), numpy_softmax(x), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "shape, build",
    [
        pytest.param((5, 7), softmax, id="a row of 7: no vector divides it"),
        pytest.param((1, 8, 8, 8), lambda x: relax.op.nn.softmax(x, axis=1), id="softmax over a leading axis"),
        pytest.param(
            (4, 64),
            lambda x: relax.op.nn.layer_norm(
                x, relax.const(np.ones(64, "float32")), relax.const(np.zeros(64, "float32")), axes=[-1]
            ),
            id="layer norm: no step read twice, MetaSchedule tunes it faster",
        ),
        pytest.param((4, 64), lambda x: relax.op.sum(x, axis=[-1]), id="a sum alone"),
    ],
)
def test_kernels_the_schedule_is_not_made_for_are_left_to_metaschedule(shape, build):
    (kernel,) = fused_kernels(shape, build)
    assert _by_rows(kernel, 16) is None
    mod = tvm.IRModule({"main": kernel})
    assert schedule_row_reductions(AVX512)(mod).same_as(mod)


def test_a_softmax_of_a_transposed_tensor_is_left_to_metaschedule():
    """Row by row, its transpose would read each row's values a row of the source apart."""
    x = te.placeholder((4, 4, 16), name="x")
    func = te.create_prim_func([x, topi.nn.softmax(topi.transpose(x, (1, 0, 2)), axis=-1)])
    assert _by_rows(func, 16) is None
    assert _by_rows(te.create_prim_func([x, topi.nn.softmax(x, axis=-1)]), 16) is not None


def write_attention(path: Path) -> Path:
    """Scaled dot-product attention as an ONNX export writes it: Q Kt, scaled, the mask added,
    Softmax over the keys, times V."""
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["weights"], axis=-1),
        helper.make_node("MatMul", ["weights", "v"], ["y"]),
    ]
    heads = [1, HEADS, TOKENS, HEAD]
    return save(
        path,
        nodes,
        [
            helper.make_tensor_value_info("q", TensorProto.FLOAT, heads),
            helper.make_tensor_value_info("kt", TensorProto.FLOAT, [1, HEADS, HEAD, TOKENS]),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, heads),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, heads)],
        [
            numpy_helper.from_array(np.array(HEAD**-0.5, np.float32), "scale"),
            numpy_helper.from_array(MASK, "mask"),
        ],
    )


def test_an_attention_model_has_no_softmax_task_and_answers_like_onnxruntime(tmp_path):
    model = Model(
        "attention",
        (
            ModelInput("q", (1, HEADS, TOKENS, HEAD)),
            ModelInput("kt", (1, HEADS, HEAD, TOKENS)),
            ModelInput("v", (1, HEADS, TOKENS, HEAD)),
        ),
        onnx=write_attention(tmp_path / "attention.onnx"),
    )
    prepared = prepare(load_model(model), RUNS_HERE)
    kernels = [f for _, f in prepared.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert any("softmax" in f.script() and f.attrs.get(SCHEDULED) for f in kernels)
    assert not [t.task_name for t in extract_tasks(prepared, RUNS_HERE) if "softmax" in t.task_name]
    assert_answers_like_onnxruntime(model, prepared, ms.database.MemoryDatabase(), RUNS_HERE, tuned_tasks=0)
