"""The micro-kernel rule of NHWC depthwise convolutions (edgetune.compiler.tir.depthwise):
which kernels `prepare` marks, what the rule's schedules look like, and that models tuned with
it answer what onnxruntime answers (padding, strides 1 and 2, 3x3 and 5x5 kernels)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from support.onnx_samples import save, write_separable_block
from support.rule_tuning import assert_answers_like_onnxruntime, tune_briefly
from tvm.s_tir import meta_schedule as ms

from edgetune.compiler.intrinsics import load_cpu_intrinsics
from edgetune.compiler.models import load_model
from edgetune.compiler.prepare import extract_tasks, prepare
from edgetune.compiler.tir import convolution, depthwise
from edgetune.compiler.tir.rules import register_schedule_rules
from edgetune.inventory.schema import Model, ModelInput

pytestmark = pytest.mark.tvm

HOST = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})  # 4 float32 lanes
AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 1})  # 8 lanes
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server", "num-cores": 1})  # 16 lanes


def separable(tmp_path, layout: str) -> Model:
    return Model(
        "separable",
        (ModelInput("image", (1, 3, 32, 32)),),
        onnx=write_separable_block(tmp_path / "separable.onnx"),
        layout=layout,
    )


def lone_convolution(
    tmp_path, kernel: int, stride: int, channels: int = 16, groups: int | None = None, channels_out: int | None = None
) -> Model:
    """One convolution (depthwise unless `groups` says otherwise) of a 1 x channels x 16 x 16
    input, with bias, padding kernel // 2 and a ReLU6 (Clip)."""
    groups, channels_out = groups or channels, channels_out or channels
    rng = np.random.default_rng(2)
    weights = [
        numpy_helper.from_array(
            rng.standard_normal((channels_out, channels // groups, kernel, kernel)).astype("float32"), "w"
        ),
        numpy_helper.from_array(rng.standard_normal(channels_out).astype("float32"), "b"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(6.0, np.float32), "six"),
    ]
    nodes = [
        helper.make_node(
            "Conv", ["x", "w", "b"], ["conv"], group=groups, strides=[stride, stride], pads=[kernel // 2] * 4
        ),
        helper.make_node("Clip", ["conv", "zero", "six"], ["y"]),
    ]
    size = 16 // stride
    path = save(
        tmp_path / f"conv{kernel}s{stride}g{groups}.onnx",
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels_out, size, size])],
        weights,
    )
    return Model("conv", (ModelInput("x", (1, channels, 16, 16)),), onnx=path, layout="NHWC")


def tasks_by_rule(prepared: tvm.IRModule, target: tvm.target.Target) -> dict[str, list]:
    """The convolution tasks marked for each rule, and under None the unmarked ones."""
    found: dict[str, list] = {depthwise.RULE: [], convolution.RULE: [], None: []}
    for task in extract_tasks(prepared, target):
        if "conv2d" in task.task_name:
            script = task.dispatched[0].script()
            found[next((rule for rule in (depthwise.RULE, convolution.RULE) if rule in script), None)].append(task)
    return found


def design_spaces(task, target: tvm.target.Target) -> list:
    load_cpu_intrinsics(target)  # as the class process does: TuneContext would import all of TVM's (15-50 s)
    register_schedule_rules()  # as the tuner does before it makes tune contexts
    context = ms.TuneContext(
        mod=task.dispatched[0],
        target=target,
        space_generator="post-order-apply",
        search_strategy="replay-trace",
        task_name=task.task_name,
    )
    return context.generate_design_space()


def weight_shapes(task) -> list[tuple[int, ...]]:
    return [tuple(int(d) for d in task.dispatched[0]["main"].params[1].shape)]


def test_in_an_nhwc_model_the_depthwise_convolution_is_marked_and_the_others_keep_their_rules(tmp_path):
    tasks = tasks_by_rule(prepare(load_model(separable(tmp_path, "NHWC")), AVX512), AVX512)
    assert [weight_shapes(t) for t in tasks[depthwise.RULE]] == [[(16, 3, 3, 1)]]
    assert sorted(weight_shapes(t) for t in tasks[convolution.RULE]) == [[(16, 3, 3, 3)], [(32, 1, 1, 16)]]  # stem, 1x1
    assert not tasks[None]


def test_nchw_models_are_not_marked(tmp_path):
    prepared = prepare(load_model(separable(tmp_path, "NCHW")), AVX512)
    assert depthwise.RULE not in prepared.script()
    assert sum("conv2d" in t.task_name for t in extract_tasks(prepared, AVX512)) == 3


@pytest.mark.parametrize(
    "groups, channels_out, marked",
    [(16, 16, True), (1, 16, False), (16, 32, False)],
    ids=["depthwise", "regular", "channel-multiplier-2"],
)
def test_only_depthwise_convolutions_of_one_filter_per_channel_are_marked(tmp_path, groups, channels_out, marked):
    prepared = prepare(load_model(lone_convolution(tmp_path, 5, 2, groups=groups, channels_out=channels_out)), AVX512)
    assert (depthwise.RULE in prepared.script()) == marked
    assert sum("conv2d" in t.task_name for t in extract_tasks(prepared, AVX512)) == 1


def test_the_rule_spaces_are_register_tiles_of_pixels_by_channel_vectors_with_the_padding_and_epilogue_folded(tmp_path):
    (task,) = tasks_by_rule(prepare(load_model(separable(tmp_path, "NHWC")), AVX512), AVX512)[depthwise.RULE]
    spaces = design_spaces(task, AVX512)
    pixels = set()
    for sch in spaces:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        assert len(blocks) == 2, sch.mod.script()  # padding and epilogue blocks inlined
        conv, output = blocks
        loops = [sch.get(loop) for loop in sch.get_loops(conv)]
        kernel_h, kernel_w, pixel, vectors, unit_channel, lane = loops[-6:]
        assert lane.kind == tvm.tirx.ForKind.VECTORIZED and int(lane.extent) == 16
        assert int(unit_channel.extent) == 1
        assert all(loop.kind == tvm.tirx.ForKind.UNROLLED for loop in (kernel_h, kernel_w, pixel, vectors))
        assert (int(kernel_h.extent), int(kernel_w.extent), int(vectors.extent)) == (3, 3, 1)
        pixels.add(int(pixel.extent))
        output_loops = [sch.get(loop) for loop in sch.get_loops(output)]
        tile = len(loops) - 6  # the loops above the taps: the output tile
        assert [loop.same_as(other) for loop, other in zip(loops[:tile], output_loops)] == [True] * tile
        assert output_loops[-1].kind == tvm.tirx.ForKind.VECTORIZED
    assert pixels == {4, 8}  # the divisors of the 16-pixel rows from 4 to 8: one space each


def test_channels_that_the_register_width_does_not_divide_are_tiled_in_narrower_vectors(tmp_path):
    (task,) = tasks_by_rule(prepare(load_model(lone_convolution(tmp_path, 3, 1, channels=24)), AVX512), AVX512)[
        depthwise.RULE
    ]
    for sch in design_spaces(task, AVX512):
        conv = sch.get_child_blocks(sch.get_sblock("root"))[0]
        lane = sch.get(sch.get_loops(conv)[-1])
        assert lane.kind == tvm.tirx.ForKind.VECTORIZED and int(lane.extent) == 8  # 3 vectors of 8 float32


@pytest.mark.parametrize(
    "write_model, target",
    [(lambda path: separable(path, "NHWC"), HOST), (lambda path: lone_convolution(path, 5, 2, channels=12), AVX2)],
    ids=["separable-block-3x3-stride-1-hardswish", "5x5-stride-2-bias-relu6-12-channels-in-vectors-of-4"],
)
def test_a_model_tuned_with_the_rule_answers_what_onnxruntime_answers(tmp_path, write_model, target):
    model = write_model(tmp_path)
    prepared = prepare(load_model(model), target)
    (task,) = tasks_by_rule(prepared, target)[depthwise.RULE]
    assert_answers_like_onnxruntime(model, prepared, tune_briefly([task], target, tmp_path), target)
