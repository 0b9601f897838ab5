"""Which weights `prepare` leaves for MetaSchedule to pre-pack (edgetune.compiler.tir.prepack): not the
weights a transposed convolution reorders before its reduction, whose pre-packing TVM 0.27's
RewriteLayout gets wrong, and every other weight as before."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from support.onnx_samples import save
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms

from edgetune.compiler.intrinsics import load_cpu_intrinsics
from edgetune.compiler.models import load_model
from edgetune.compiler.prepare import extract_tasks, prepare
from edgetune.compiler.tir.prepack import LAYOUT_FREE
from edgetune.inventory.schema import Model, ModelInput

pytestmark = pytest.mark.tvm

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})


def text_detector_head(path) -> Model:
    """As DBNet's head: a 3x3 convolution 8->8, then a 2x2 stride-2 transposed convolution
    8->1 with a bias and a sigmoid (the probability map)."""
    rng = np.random.default_rng(3)
    weights = [
        numpy_helper.from_array(rng.standard_normal(shape).astype("float32") * 0.5, name)
        for name, shape in (("w_conv", (8, 8, 3, 3)), ("w_up", (8, 1, 2, 2)), ("b_up", (1,)))
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w_conv"], ["conv"], pads=[1] * 4),
        helper.make_node("ConvTranspose", ["conv", "w_up", "b_up"], ["up"], strides=[2, 2]),
        helper.make_node("Sigmoid", ["up"], ["y"]),
    ]
    path = save(
        path,
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 16, 16])],
        weights,
    )
    return Model("head", (ModelInput("x", (1, 8, 8, 8)),), onnx=path, layout="NHWC")


def kernels(tmp_path) -> dict[str, tvm.IRModule]:
    prepared = prepare(load_model(text_detector_head(tmp_path / "head.onnx")), TARGET)
    tasks = {
        ("transposed" if "conv2d_transpose" in t.task_name else "regular"): t.dispatched[0]
        for t in extract_tasks(prepared, TARGET)
        if "conv2d" in t.task_name
    }
    assert set(tasks) == {"transposed", "regular"}
    return tasks


def layout_free(kernel: tvm.IRModule) -> list[int]:
    attrs = kernel["main"].attrs
    return [int(i) for i in attrs[LAYOUT_FREE]] if LAYOUT_FREE in attrs else []


def test_the_transposed_convolution_weight_is_read_as_it_is_and_the_regular_one_prepacked(tmp_path):
    found = kernels(tmp_path)
    assert layout_free(found["regular"]) == [1]  # its weight
    weight_shapes = {i: [int(d) for d in p.shape] for i, p in enumerate(found["transposed"]["main"].params)}
    assert weight_shapes[1] == [8, 1, 2, 2]  # IOHW, reordered by the kernel's kernel_transform block
    assert 1 not in layout_free(found["transposed"])


def with_split_reduction_and_rewritten_layout(kernel: tvm.IRModule) -> tvm.IRModule:
    """The kernel with its reduction over input channels split by 2, as the tuner's candidates
    often have it, and MetaSchedule's RewriteLayout postproc applied."""
    sch = s_tir.Schedule(kernel)
    compute = sch.get_sblock("compute")
    *_, channels, kernel_h, kernel_w = sch.get_loops(compute)
    sch.split(channels, [None, 2])
    rewrite = ms.postproc.RewriteLayout()
    load_cpu_intrinsics(TARGET)  # as the class process does: TuneContext would import all of TVM's (15-50 s)
    rewrite._initialize_with_tune_context(ms.TuneContext(mod=kernel, target=TARGET, task_name="transposed"))
    assert rewrite.apply(sch)
    return sch.mod


def outputs(kernel: tvm.IRModule, inputs: list[np.ndarray]) -> np.ndarray:
    tensors = [tvm.runtime.tensor(a) for a in inputs]
    tvm.compile(kernel, target=TARGET)["main"](*tensors)
    return tensors[-1].numpy()


def test_the_transposed_convolution_tuned_with_a_rewritten_layout_computes_what_it_did(tmp_path):
    kernel = kernels(tmp_path)["transposed"]
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal([int(d) for d in p.shape]).astype("float32") for p in kernel["main"].params]
    expected = outputs(kernel, inputs)
    np.testing.assert_allclose(
        outputs(with_split_reduction_and_rewritten_layout(kernel), inputs), expected, rtol=1e-5, atol=1e-6
    )

    # the reason: with the weight left layout-free, TVM 0.27 pre-packs it wrong (when this
    # fails, TVM has fixed RewriteLayout and edgetune.compiler.tir.prepack can go)
    as_tvm_marks_it = kernel.clone()
    as_tvm_marks_it["main"] = kernel["main"].with_attr(LAYOUT_FREE, [1, 2])
    wrong = outputs(with_split_reduction_and_rewritten_layout(as_tvm_marks_it), inputs)
    assert np.abs(wrong - expected).max() > 0.1
