"""The profile of bench/profile_gap.py and `edgetune profile`: TVM kernel rows inside the whole model add up to the
model's time, kernels get the right kinds and FLOPs, and onnxruntime's own profile is read into
rows of the same kinds."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from support.onnx_samples import write_quantized_separable
from tvm import relax

from edgetune.artifact.profile import (
    INT8_CONV,
    onnxruntime_profile,
    profile_onnxruntime,
    profile_vm,
    tvm_kernel_kinds,
)
from edgetune.compiler.models import entry_function, load_model, reference_inputs
from edgetune.compiler.prepare import build_untuned, prepare
from edgetune.inventory.schema import Model, ModelInput

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})
# The kernel rows and the VM builtins, timed by the instrument, against uninstrumented calls
# interleaved with them, medians over calls: they must agree within 15 % (the instrument's own
# cost, a few microseconds per kernel, is far below that).
SUM_MARGIN = 0.15


def separable_cnn(path, layout: str = "NCHW") -> Model:
    """conv 3x3 8->16 @32x32, depthwise 3x3, pointwise 16->32, each + relu."""
    rng = np.random.default_rng(0)

    def weight(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.1, name)

    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[3, 3], pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1] * 4, group=16),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3"], ["c3"], kernel_shape=[1, 1]),
        helper.make_node("Relu", ["c3"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "sep",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 32, 32])],
        initializer=[weight("w1", 16, 8, 3, 3), weight("w2", 16, 1, 3, 3), weight("w3", 32, 16, 1, 1)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return Model("sep", (ModelInput("x", (1, 8, 32, 32)),), onnx=path, layout=layout)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_kernels_get_their_kinds_and_flops_in_either_layout(tmp_path, layout):
    prepared = prepare(load_model(separable_cnn(tmp_path / "sep.onnx", layout)), TARGET)
    kinds = tvm_kernel_kinds(prepared, layout)
    assert sorted(kind for kind, _ in kinds.values() if kind.startswith("conv")) == [
        "conv 1x1 (pointwise)",
        "conv 3x3",
        "conv 3x3 depthwise",
    ]
    assert sorted(flops for _, flops in kinds.values() if flops) == sorted(
        [2 * 16 * 32 * 32 * 8 * 9, 2 * 16 * 32 * 32 * 9, 2 * 32 * 32 * 32 * 16]
    )


@pytest.mark.tvm  # builds and runs the model
def test_kernel_rows_add_up_to_the_model_time(tmp_path):
    model = separable_cnn(tmp_path / "sep.onnx")
    prepared = prepare(load_model(model), TARGET)
    kinds = tvm_kernel_kinds(prepared)

    vm = relax.VirtualMachine(build_untuned(prepared, TARGET, exec_mode="bytecode"), tvm.cpu())
    tensors = [tvm.runtime.tensor(reference_inputs(model)["x"])]
    vm[entry_function(prepared)](*tensors)
    profile = profile_vm(vm, entry_function(prepared), tensors, kinds, calls=15)

    assert {k.kind for k in profile.kernels} >= {"conv 1x1 (pointwise)", "conv 3x3", "conv 3x3 depthwise"}
    measured = profile.kernels_ms + profile.builtins_ms
    assert abs(measured - profile.model_ms) <= SUM_MARGIN * profile.model_ms, (measured, profile.model_ms)


def twice_the_same_convolution(path) -> Model:
    """Two 3x3 8->8 convolutions @16x16 of the same shape: one kernel, called twice."""
    rng = np.random.default_rng(1)
    weights = [numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), f"w{i}") for i in (1, 2)]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[3, 3], pads=[1] * 4),
        helper.make_node("Conv", ["c1", "w2"], ["y"], kernel_shape=[3, 3], pads=[1] * 4),
    ]
    graph = helper.make_graph(
        nodes,
        "twice",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        initializer=weights,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return Model("twice", (ModelInput("x", (1, 8, 16, 16)),), onnx=path, layout="NCHW")


@pytest.mark.tvm  # builds and runs the model
def test_a_kernel_called_for_two_layers_counts_the_flops_of_both(tmp_path):
    model = twice_the_same_convolution(tmp_path / "twice.onnx")
    prepared = prepare(load_model(model), TARGET)
    vm = relax.VirtualMachine(build_untuned(prepared, TARGET, exec_mode="bytecode"), tvm.cpu())
    tensors = [tvm.runtime.tensor(reference_inputs(model)["x"])]
    profile = profile_vm(vm, entry_function(prepared), tensors, tvm_kernel_kinds(prepared), calls=3)

    convolutions = [k for k in profile.kernels if k.kind == "conv 3x3"]
    assert len(convolutions) == 1
    assert convolutions[0].flops == 2 * (2 * 8 * 16 * 16 * 8 * 9)


def test_onnxruntime_profile_rows_by_kind_within_the_run_time(tmp_path):
    model = separable_cnn(tmp_path / "sep.onnx")
    profile = profile_onnxruntime(model.onnx, reference_inputs(model), runs=5)

    kinds = set(profile.by_kind())
    assert {"conv 3x3", "conv 3x3 depthwise", "conv 1x1 (pointwise)"} <= kinds
    assert {k.op for k in profile.kernels if k.kind.startswith("conv")} <= {"Conv", "FusedConv", "NchwcConv"}
    assert 0 < profile.kernels_ms <= profile.model_ms


def test_integer_convolutions_and_onnxruntimes_qlinearconv_are_one_kind_with_their_flops(tmp_path):
    """A block quantized by onnxruntime: edgetune's two integer convolutions (3x3 16 -> 32, 1x1
    32 -> 48 at 8x8) and onnxruntime's QLinearConv nodes are both 'conv int8'; the depthwise
    convolution stays float32 in TVM."""
    path = write_quantized_separable(tmp_path / "block.int8.onnx")
    model = Model("qdq", (ModelInput("x", (1, 16, 8, 8)),), onnx=path, layout="NHWC", quantized_weights="integer")
    kinds = tvm_kernel_kinds(prepare(load_model(model), TARGET), "NHWC")
    assert sorted(flops for kind, flops in kinds.values() if kind == INT8_CONV) == [
        2 * 64 * 48 * 32,
        2 * 64 * 32 * 16 * 9,
    ]
    assert "conv 3x3 depthwise" in {kind for kind, _ in kinds.values()}

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "ort")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for _ in range(3):
        session.run(None, reference_inputs(model))
    assert INT8_CONV in onnxruntime_profile(tmp_path / session.end_profiling(), skip_runs=1).by_kind()
