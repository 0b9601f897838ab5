"""`quantized_weights: integer`: the convolutions (groups 1) of a quantized (QDQ) model run in
integer arithmetic with AVX-512 VNNI, and the model answers what onnxruntime answers running
the same quantized file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from support.onnx_samples import write_quantized_moves, write_quantized_separable, write_quantized_silu
from support.rule_tuning import assert_answers_like_onnxruntime, tune_briefly
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from edgetune.artifact_format.reference import (
    FLOAT_TOLERANCE,
    check_outputs,
    output_tolerance,
)
from edgetune.compiler.models import (
    entry_function,
    load_model,
    reference_inputs,
    reference_outputs,
    rounding_spread,
)
from edgetune.compiler.prepare import build_untuned, extract_tasks, prepare
from edgetune.compiler.tir import depthwise, integer
from edgetune.inventory.schema import Model, ModelInput
from edgetune.tune.database import ClassDatabasePaths, open_database

pytestmark = pytest.mark.tvm

AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server", "num-cores": 1})  # has VNNI
HOST_HAS_VNNI = "avx512_vnni" in Path("/proc/cpuinfo").read_text()
RUNNABLE = AVX512 if HOST_HAS_VNNI else tvm.target.Target({"kind": "llvm", "num-cores": 1})  # no VNNI: stock kernels


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> Model:
    path = write_quantized_separable(tmp_path_factory.mktemp("qdq") / "separable.int8.onnx")
    return Model(
        "qdq-separable", (ModelInput("x", (1, 16, 8, 8)),), onnx=path, layout="NHWC", quantized_weights="integer"
    )


def marked(prepared: tvm.IRModule, rule: str) -> list:
    return [t for t in extract_tasks(prepared, AVX512) if f'"schedule_rule": "{rule}"' in t.dispatched[0].script()]


def test_convolutions_become_integer_kernels_and_the_quantize_operators_no_transposes(quantized):
    mod = load_model(quantized)
    text = relax.transform.FoldConstant()(mod).script()  # the constants ConvertLayout permuted, folded
    assert text.count("R.permute_dims(") == 2  # the input's and the output's, nothing around Q/DQ
    assert "R.quantize(" not in text and "R.dequantize(" not in text
    prepared = prepare(mod, AVX512)
    assert len(marked(prepared, integer.RULE)) == 2  # the padded 3x3 16 -> 32 and the pointwise 32 -> 48
    assert len(marked(prepared, depthwise.RULE)) == 1  # the depthwise one stays float32, NHWC


def test_the_untuned_build_answers_what_onnxruntime_answers_on_the_quantized_file(quantized):
    prepared = prepare(load_model(quantized), RUNNABLE)
    inputs = reference_inputs(quantized)
    vm = relax.VirtualMachine(build_untuned(prepared, RUNNABLE), tvm.cpu())
    got = vm[entry_function(prepared)](tvm.runtime.tensor(inputs["x"])).numpy()
    expected = reference_outputs(quantized, inputs)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)  # the same integers, the same rounding
    assert float(np.abs(expected).max()) > 0.1


def test_a_quantized_tensor_that_only_moves_moves_as_integers(tmp_path):
    path = write_quantized_moves(tmp_path / "moves.int8.onnx")
    model = Model("qdq-moves", (ModelInput("x", (1, 8, 8, 8)),), onnx=path, layout="NHWC", quantized_weights="integer")
    mod = load_model(model)
    moves = {
        op: [line for line in mod.script().splitlines() if f"= R.{op}(" in line]
        for op in ("nn.max_pool2d", "split", "image.resize2d", "strided_slice", "concat")
    }
    assert all(len(lines) == 1 and 'dtype="uint8"' in lines[0] for lines in moves.values()), moves
    prepared = prepare(mod, RUNNABLE)
    inputs = reference_inputs(model)
    vm = relax.VirtualMachine(build_untuned(prepared, RUNNABLE), tvm.cpu())
    got = vm[entry_function(prepared)](tvm.runtime.tensor(inputs["x"])).numpy()
    expected = reference_outputs(model, inputs)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert float(np.abs(expected).max()) > 0.1


@pytest.fixture(scope="module")
def silu(tmp_path_factory) -> Model:
    path = write_quantized_silu(tmp_path_factory.mktemp("qdq-silu") / "silu.int8.onnx")
    return Model("qdq-silu", (ModelInput("x", (1, 16, 8, 8)),), onnx=path, layout="NHWC", quantized_weights="integer")


def test_a_quantized_silu_is_a_table_of_its_byte(silu):
    text = load_model(silu).script()
    assert text.count("R.call_tir(cls.byte_table") == 2 and "R.sigmoid(" not in text
    prepared = prepare(load_model(silu), RUNNABLE)
    inputs = reference_inputs(silu)
    vm = relax.VirtualMachine(build_untuned(prepared, RUNNABLE), tvm.cpu())
    got = vm[entry_function(prepared)](tvm.runtime.tensor(inputs["x"])).numpy()
    expected = reference_outputs(silu, inputs)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)  # the table's bytes are the graph's
    assert float(np.abs(expected).max()) > 0.1


@pytest.mark.skipif(not HOST_HAS_VNNI, reason="this CPU has no AVX-512 VNNI to run the tuned kernels")
def test_tuned_with_tables_the_silu_model_answers_what_onnxruntime_answers(silu, tmp_path):
    prepared = prepare(load_model(silu), AVX512)
    tasks = marked(prepared, integer.RULE)  # each convolution's, its epilogue up to the byte the table looks up
    assert len(tasks) == 2
    database = tune_briefly(tasks, AVX512, tmp_path)
    assert_answers_like_onnxruntime(silu, prepared, database, AVX512, tuned_tasks=2)


@pytest.mark.skipif(not HOST_HAS_VNNI, reason="this CPU has no AVX-512 VNNI to run the tuned kernels")
def test_tuned_with_the_vnni_rule_the_model_answers_what_onnxruntime_answers(quantized, tmp_path):
    prepared = prepare(load_model(quantized), AVX512)
    tasks = marked(prepared, integer.RULE)
    database = tune_briefly(tasks, AVX512, tmp_path)
    for task in tasks:
        (record,) = database.get_top_k(database.commit_workload(task.dispatched[0]), 1)
        assert integer.VNNI_DOT in str(record.trace)  # the 16 x 4 products are one vpdpbusd
    assert_answers_like_onnxruntime(quantized, prepared, database, AVX512, tuned_tasks=2)
    # The records name edgetune's intrinsic: a class database holding them loads in any process.
    paths = ClassDatabasePaths(tmp_path / "class")
    saved = open_database(paths)
    for record in database.get_all_tuning_records():
        saved.commit_tuning_record(
            ms.database.TuningRecord(
                record.trace,
                saved.commit_workload(record.workload.mod),
                record.run_secs,
                record.target,
                record.args_info,
            )
        )
    load = (
        f"from pathlib import Path; from edgetune.tune.database import ClassDatabasePaths, open_database; "
        f"print(len(open_database(ClassDatabasePaths(Path({str(paths.directory)!r}))).get_all_tuning_records()))"
    )
    loaded = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert int(loaded.stdout) == len(database.get_all_tuning_records())


def test_a_quantized_softmax_is_checked_against_the_graph_as_defined_within_onnxruntimes_own_spread(tmp_path):
    """onnxruntime's fused int8 softmax rounds differently from the graph's quantize steps: the
    reference is the graph as defined, and the tolerance widens to twice that spread, so the
    integer build passes where the float tolerance would refuse onnxruntime itself."""
    path = write_quantized_separable(tmp_path / "softmax.int8.onnx", softmax=True)
    model = Model(
        "qdq-softmax", (ModelInput("x", (1, 16, 8, 8)),), onnx=path, layout="NHWC", quantized_weights="integer"
    )
    inputs = reference_inputs(model)
    expected = {"y": reference_outputs(model, inputs)[0]}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    fused = {"y": ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, inputs)[0]}
    spread = rounding_spread(model, inputs)
    assert 0 < spread < 0.1 * float(np.abs(expected["y"]).max())
    assert not check_outputs(fused, expected, FLOAT_TOLERANCE).ok
    assert check_outputs(fused, expected, output_tolerance(spread)).ok

    prepared = prepare(load_model(model), RUNNABLE)
    vm = relax.VirtualMachine(build_untuned(prepared, RUNNABLE), tvm.cpu())
    got = {"y": vm[entry_function(prepared)](tvm.runtime.tensor(inputs["x"])).numpy()}
    assert check_outputs(got, expected, output_tolerance(spread)).ok
    assert not check_outputs({"y": got["y"][:, ::-1]}, expected, output_tolerance(spread)).ok  # channels swapped
    float_model = Model("softmax", model.inputs, onnx=path.with_suffix(".float.onnx"))
    assert rounding_spread(float_model, inputs) == 0.0
