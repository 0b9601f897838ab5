"""ONNX models as users have them, imported on the host: integer inputs that index tables,
scalar inputs, branches on a fixed input, quantized weights, reference input files. Each model
is a small real ONNX graph built here with onnx.helper."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from support.onnx_samples import qdq_model, save
from support.prepared import kernel_names
from tvm import relax

from edgetune.compiler.models import (
    entry_function,
    load_model,
    reference_inputs,
    reference_outputs,
)
from edgetune.compiler.prepare import build_untuned, extract_tasks, prepare
from edgetune.errors import TuneError
from edgetune.inventory.schema import FixedValue, Model, ModelInput, ValueRange

pytestmark = pytest.mark.tvm

HOST = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})


def run_on_host(model: Model) -> tuple[np.ndarray, np.ndarray]:
    """The imported model's output on the reference input, and onnxruntime's."""
    mod = load_model(model)
    inputs = reference_inputs(model)
    prepared = prepare(mod, HOST)
    vm = relax.VirtualMachine(build_untuned(prepared, HOST), tvm.cpu())
    out = vm[entry_function(prepared)](*[tvm.runtime.tensor(inputs[i.name]) for i in model.fed_inputs])
    return out.numpy(), reference_outputs(model, inputs)[0]


def embedding_model(path: Path) -> Path:
    """token_type_ids (int64 [1, 8]) index a 2-row table, as in BERT's token type embedding."""
    table = numpy_helper.from_array(np.array([[0.5, -1.0, 2.0, 0.0], [1.5, 0.25, -0.5, 3.0]], np.float32), "table")
    return save(
        path,
        [helper.make_node("Gather", ["table", "token_type_ids"], ["embedded"], axis=0)],
        [helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("embedded", TensorProto.FLOAT, None)],
        [table],
    )


def test_integer_input_indexing_a_two_row_table_needs_its_range(tmp_path):
    path = embedding_model(tmp_path / "embed.onnx")
    undeclared = Model("encoder", (ModelInput("token_type_ids", (1, 8), "int64"),), onnx=path)
    with pytest.raises(TuneError) as err:
        load_model(undeclared)
    assert "model 'encoder'" in str(err.value)
    assert "input 'token_type_ids' got random values 0-7; declare its range" in str(err.value)

    declared = Model("encoder", (ModelInput("token_type_ids", (1, 8), "int64", ValueRange(0, 1)),), onnx=path)
    ids = reference_inputs(declared)["token_type_ids"]
    assert set(np.unique(ids)) == {0, 1}
    got, expected = run_on_host(declared)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def masked_softmax_model(path: Path) -> Path:
    """Attention as exported encoders mask it: softmax(scores + (1 - mask) * float32 min), with
    `attention_mask` (int64 [1, 8]) meant to hold 0 or 1; a 7 there overflows to inf, so NaN."""
    lowest = numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "lowest")
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    nodes = [
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "mask"], ["masked"]),
        helper.make_node("Mul", ["masked", "lowest"], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["biased"]),
        helper.make_node("Softmax", ["biased"], ["weights"], axis=-1),
    ]
    return save(
        path,
        nodes,
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 8]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, 8]),
        ],
        [helper.make_tensor_value_info("weights", TensorProto.FLOAT, [1, 8])],
        [lowest, one],
    )


def test_attention_mask_fed_values_it_never_holds_is_named_not_reported_as_an_import_bug(tmp_path):
    path = masked_softmax_model(tmp_path / "attend.onnx")
    inputs = (ModelInput("scores", (1, 8)), ModelInput("attention_mask", (1, 8), "int64"))
    with pytest.raises(TuneError) as err:
        load_model(Model("encoder", inputs, onnx=path))
    assert "model 'encoder': its outputs on the reference input are not finite" in str(err.value)
    assert "input 'attention_mask' got random values 0-7; declare its range" in str(err.value)
    assert "'scores'" not in str(err.value)

    declared = Model("encoder", (inputs[0], ModelInput("attention_mask", (1, 8), "int64", ValueRange(0, 1))), onnx=path)
    got, expected = run_on_host(declared)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_rank_0_input_imports_and_matches_onnxruntime(tmp_path):
    path = save(
        tmp_path / "gain.onnx",
        [helper.make_node("Mul", ["audio", "gain"], ["scaled"])],
        [
            helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 16]),
            helper.make_tensor_value_info("gain", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("scaled", TensorProto.FLOAT, [1, 16])],
        [],
    )
    model = Model(
        "gain", (ModelInput("audio", (1, 16)), ModelInput("gain", (), values=ValueRange(0.5, 2.0))), onnx=path
    )
    gain = reference_inputs(model)["gain"]
    assert gain.shape == () and 0.5 <= gain <= 2.0
    got, expected = run_on_host(model)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def vad_model(path: Path) -> Path:
    """A voice-activity detector's branch on the sample rate: `If(sr == 16000)` runs a
    matmul, else a softmax (as silero-vad picks a model per rate)."""
    weights = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    then_branch = helper.make_graph(
        [helper.make_node("MatMul", ["audio", "w"], ["then_out"])],
        "rate16k",
        [],
        [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, [1, 16])],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Softmax", ["audio"], ["else_out"], axis=-1)],
        "rate8k",
        [],
        [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, [1, 16])],
    )
    nodes = [
        helper.make_node("Equal", ["sr", "rate16k"], ["is16k"]),
        helper.make_node("If", ["is16k"], ["speech"], then_branch=then_branch, else_branch=else_branch),
    ]
    return save(
        path,
        nodes,
        [
            helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 16]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("speech", TensorProto.FLOAT, [1, 16])],
        [numpy_helper.from_array(np.array(16000, np.int64), "rate16k"), numpy_helper.from_array(weights, "w")],
    )


@pytest.mark.parametrize("rate,kernel,absent", [(16000, "matmul", "softmax"), (8000, "softmax", "matmul")])
def test_if_on_a_fixed_scalar_folds_away_and_the_unused_branch_leaves_no_kernel(tmp_path, rate, kernel, absent):
    model = Model(
        "vad",
        (ModelInput("audio", (1, 16)), ModelInput("sr", (), "int64", FixedValue(rate))),
        onnx=vad_model(tmp_path / "vad.onnx"),
    )
    kernels = kernel_names(prepare(load_model(model), HOST))  # tasks, and kernels `prepare` scheduled
    assert any(kernel in name for name in kernels), kernels
    assert not any(absent in name for name in kernels), kernels
    got, expected = run_on_host(model)  # the library takes audio only; onnxruntime gets sr too
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_if_on_a_fed_input_imports_since_the_frontend_handles_if_itself(tmp_path):
    """`If` is not in the frontend's converter map; it converts it itself, and edgetune's support
    check asks the frontend. Fed at run time, both branches stay: the matmul a task, the softmax
    a kernel `prepare` scheduled."""
    model = Model(
        "vad",
        (ModelInput("audio", (1, 16)), ModelInput("sr", (), "int64", ValueRange(8000, 16000))),
        onnx=vad_model(tmp_path / "vad.onnx"),
    )
    prepared = prepare(load_model(model), HOST)
    tasks = [t.task_name for t in extract_tasks(prepared, HOST)]
    assert any("matmul" in name for name in tasks), tasks
    assert any("softmax" in name for name in kernel_names(prepared)), kernel_names(prepared)
    got, expected = run_on_host(model)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def library_bytes(model: Model, directory: Path) -> int:
    """Size of the model's library as `edgetune build` makes it (pre-pack pipeline, exported)."""
    library = directory / f"{model.name}-{model.quantized_weights}.so"
    build_untuned(prepare(load_model(model), HOST), HOST).export_library(str(library))
    return library.stat().st_size


def test_qdq_int8_model_stays_quantized_and_float_is_the_opt_in(tmp_path):
    path = qdq_model(tmp_path / "qdq.onnx")
    onnx_bytes = path.stat().st_size
    quantized = Model("qdq", (ModelInput("x", (1, 512)),), onnx=path)
    assert library_bytes(quantized, tmp_path) <= 1.5 * onnx_bytes
    got, expected = run_on_host(quantized)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)

    widened = Model("qdq", (ModelInput("x", (1, 512)),), onnx=path, quantized_weights="float")
    assert library_bytes(widened, tmp_path) >= 3 * onnx_bytes  # int8 weights folded to float32


def test_reference_input_file_is_what_the_model_is_fed(tmp_path):
    path = embedding_model(tmp_path / "embed.onnx")
    ids = np.array([[0, 1, 1, 0, 0, 1, 0, 1]], np.int64)
    np.savez(tmp_path / "ids.npz", token_type_ids=ids)
    model = Model(
        "encoder", (ModelInput("token_type_ids", (1, 8), "int64"),), onnx=path, reference_input=tmp_path / "ids.npz"
    )
    assert np.array_equal(reference_inputs(model)["token_type_ids"], ids)
    got, expected = run_on_host(model)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_declared_input_of_another_dtype_fails_import_naming_both(tmp_path):
    path = embedding_model(tmp_path / "embed.onnx")
    with pytest.raises(
        TuneError, match=r"model 'encoder'.*input 'token_type_ids' is declared int32 but is int64 in the graph"
    ):
        load_model(Model("encoder", (ModelInput("token_type_ids", (1, 8), "int32"),), onnx=path))
