"""The micro-kernel rule of NHWC pointwise convolutions (edgetune.tune.schedule_rules.pointwise):
which kernels `prepare` marks, what the rule's schedules look like, and that a model tuned with
it answers what onnxruntime answers."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.s_tir import meta_schedule as ms

from edgetune.inventory.schema import Model, ModelInput
from edgetune.tune.models import load_model
from edgetune.tune.prepare import extract_tasks, prepare
from edgetune.tune.schedule_rules.pointwise import RULE

from onnx import TensorProto, helper, numpy_helper
from onnx_samples import save, write_separable_block
from rule_tuning import assert_answers_like_onnxruntime, tune_briefly

HOST = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})  # 4 float32 lanes
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server", "num-cores": 1})  # 16 lanes


def separable(tmp_path, layout: str) -> Model:
    return Model("separable", (ModelInput("image", (1, 3, 32, 32)),),
                 onnx=write_separable_block(tmp_path / "separable.onnx"), layout=layout)  # fmt: skip


def marked_tasks(prepared: tvm.IRModule, target: tvm.target.Target) -> tuple[list, list]:
    tasks = extract_tasks(prepared, target)
    marked = [t for t in tasks if RULE in t.dispatched[0].script()]
    return marked, [t for t in tasks if "conv2d" in t.task_name and t not in marked]


def test_only_the_pointwise_convolution_of_an_nhwc_model_is_marked(tmp_path):
    marked, other_convolutions = marked_tasks(prepare(load_model(separable(tmp_path, "NHWC")), AVX512), AVX512)
    assert len(marked) == 1 and len(other_convolutions) == 2  # the 3x3 stem and the depthwise 3x3
    weights = [tuple(int(d) for d in p.shape) for p in marked[0].dispatched[0]["main"].params[1:2]]
    assert weights == [(32, 1, 1, 16)]


@pytest.mark.parametrize("stride, marked", [(1, True), (2, False)])
def test_a_lone_pointwise_convolution_is_marked_only_with_stride_1(tmp_path, stride, marked):
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((32, 16, 1, 1)).astype("float32"), "w")
    size = 16 // stride
    path = save(tmp_path / "pointwise.onnx", [helper.make_node("Conv", ["x", "w"], ["y"], strides=[stride, stride])],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 16, 16])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, size, size])], [weight])  # fmt: skip
    model = Model("pointwise", (ModelInput("x", (1, 16, 16, 16)),), onnx=path, layout="NHWC")
    prepared = prepare(load_model(model), AVX512)
    assert (RULE in prepared.script()) == marked
    assert sum("conv2d" in t.task_name for t in extract_tasks(prepared, AVX512)) == 1


def test_nchw_models_are_not_marked(tmp_path):
    prepared = prepare(load_model(separable(tmp_path, "NCHW")), AVX512)
    assert RULE not in prepared.script()
    assert sum("conv2d" in t.task_name for t in extract_tasks(prepared, AVX512)) == 3


def test_the_rule_spaces_are_register_tiled_micro_kernels_with_the_epilogue_in_the_tile(tmp_path):
    (task,), _ = marked_tasks(prepare(load_model(separable(tmp_path, "NHWC")), AVX512), AVX512)
    context = ms.TuneContext(mod=task.dispatched[0], target=AVX512, space_generator="post-order-apply",
                             search_strategy="replay-trace", task_name=task.task_name)  # fmt: skip
    spaces = context.generate_design_space()
    assert spaces
    for sch in spaces:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        assert len(blocks) == 2, sch.mod.script()  # input copy and epilogue blocks inlined
        conv, output = blocks
        loops = [sch.get(loop) for loop in sch.get_loops(conv)]
        lane, vectors, rows = loops[-1], loops[-2], loops[-3]
        assert lane.kind == tvm.tirx.ForKind.VECTORIZED and int(lane.extent) == 16
        assert vectors.kind == rows.kind == tvm.tirx.ForKind.UNROLLED
        assert 4 <= int(rows.extent) <= 8
        output_loops = [sch.get(loop) for loop in sch.get_loops(output)]
        tile = len(loops) - 4  # the loops above the reduction loop: the output tile
        assert [loop.same_as(other) for loop, other in zip(loops[:tile], output_loops)] == [True] * tile
        assert output_loops[-1].kind == tvm.tirx.ForKind.VECTORIZED
        assert int(sch.get(sch.get_loops(conv)[-4]).extent) == 16  # the reduction: 16 input channels


def test_a_model_tuned_with_the_rule_answers_what_onnxruntime_answers(tmp_path):
    model = separable(tmp_path, "NHWC")
    prepared = prepare(load_model(model), HOST)
    (task,), _ = marked_tasks(prepared, HOST)
    assert_answers_like_onnxruntime(model, prepared, tune_briefly(task, HOST, tmp_path), HOST)
