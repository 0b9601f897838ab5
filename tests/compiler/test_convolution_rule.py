"""The micro-kernel rule of NHWC convolutions with groups 1, pointwise and KxK
(edgetune.compiler.tir.convolution): which kernels `prepare` marks, what the rule's
schedules look like, and that a model tuned with it answers what onnxruntime answers."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from support.onnx_samples import save, write_separable_block
from support.rule_tuning import assert_answers_like_onnxruntime, tune_briefly
from tvm.s_tir import meta_schedule as ms

from edgetune.compiler.intrinsics import load_cpu_intrinsics
from edgetune.compiler.models import load_model
from edgetune.compiler.prepare import extract_tasks, prepare
from edgetune.compiler.tir.common import MAX_ROWS, MIN_ROWS, row_tiles
from edgetune.compiler.tir.convolution import RULE
from edgetune.compiler.tir.rules import register_schedule_rules
from edgetune.inventory.schema import Model, ModelInput

pytestmark = pytest.mark.tvm

HOST = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})  # 4 float32 lanes
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server", "num-cores": 1})  # 16 lanes


def separable(tmp_path, layout: str) -> Model:
    return Model(
        "separable",
        (ModelInput("image", (1, 3, 32, 32)),),
        onnx=write_separable_block(tmp_path / "separable.onnx"),
        layout=layout,
    )


def marked_tasks(prepared: tvm.IRModule, target: tvm.target.Target) -> tuple[list, list]:
    tasks = extract_tasks(prepared, target)
    marked = [t for t in tasks if RULE in t.dispatched[0].script()]
    return marked, [t for t in tasks if "conv2d" in t.task_name and t not in marked]


def convolutions(tmp_path, channels_in: int, *layers: tuple[int, int, int], group: int = 1, size: int = 16) -> Model:
    """Convolutions of a `size` x `size` image, each (channels out, kernel size, stride), one
    after the other with a ReLU between them, padded to keep the image size at stride 1."""
    rng, nodes, weights, channels, current, image = np.random.default_rng(0), [], [], channels_in, "x", size
    for index, (channels_out, kernel, stride) in enumerate(layers):
        weight = rng.standard_normal((channels_out, channels // group, kernel, kernel)) / np.sqrt(channels * kernel**2)
        weights.append(numpy_helper.from_array(weight.astype("float32"), f"w{index}"))
        nodes += [
            helper.make_node(
                "Conv",
                [current, f"w{index}"],
                [f"conv{index}"],
                strides=[stride, stride],
                pads=[kernel // 2] * 4,
                group=group,
            ),
            helper.make_node("Relu", [f"conv{index}"], [f"y{index}"]),
        ]
        channels, size, current = channels_out, size // stride, f"y{index}"
    path = save(
        tmp_path / "convolutions.onnx",
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels_in, image, image])],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, [1, channels, size, size])],
        weights,
    )
    return Model("convolutions", (ModelInput("x", (1, channels_in, image, image)),), onnx=path, layout="NHWC")


def test_the_stem_and_the_pointwise_convolution_of_a_separable_block_are_marked_not_the_depthwise(tmp_path):
    marked, other_convolutions = marked_tasks(prepare(load_model(separable(tmp_path, "NHWC")), AVX512), AVX512)
    assert len(other_convolutions) == 1  # the depthwise 3x3
    weights = sorted(tuple(int(d) for d in task.dispatched[0]["main"].params[1].shape) for task in marked)
    assert weights == [(16, 3, 3, 3), (32, 1, 1, 16)]  # the 3-channel 3x3 stem, the pointwise 1x1


def test_a_stem_with_few_input_channels_has_its_reduction_unrolled_around_the_tile(tmp_path):
    (stem,), _ = marked_tasks(prepare(load_model(convolutions(tmp_path, 3, (16, 3, 2))), AVX512), AVX512)
    for sch in design_spaces(stem, AVX512):
        loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("conv2d_nhwc"))]
        kernel_h, kernel_w, channels_in = loops[-7:-4]
        assert (int(kernel_w.extent), int(channels_in.extent)) == (3, 3)
        assert kernel_w.kind == channels_in.kind == tvm.tirx.ForKind.UNROLLED
        assert kernel_h.kind == tvm.tirx.ForKind.SERIAL


@pytest.mark.parametrize("kernel, stride", [(1, 1), (1, 2), (3, 1), (3, 2), (5, 1)])
def test_a_lone_convolution_is_marked_whatever_its_kernel_size_and_stride(tmp_path, kernel, stride):
    prepared = prepare(load_model(convolutions(tmp_path, 16, (32, kernel, stride))), AVX512)
    assert RULE in prepared.script()
    assert sum("conv2d" in t.task_name for t in extract_tasks(prepared, AVX512)) == 1


@pytest.mark.parametrize("group", [4, 16])
def test_grouped_and_depthwise_convolutions_are_not_marked(tmp_path, group):
    prepared = prepare(load_model(convolutions(tmp_path, 16, (16, 3, 1), group=group)), AVX512)
    assert RULE not in prepared.script()
    assert sum("conv2d" in t.task_name for t in extract_tasks(prepared, AVX512)) == 1


def test_nchw_models_are_not_marked(tmp_path):
    prepared = prepare(load_model(separable(tmp_path, "NCHW")), AVX512)
    assert RULE not in prepared.script()
    assert sum("conv2d" in t.task_name for t in extract_tasks(prepared, AVX512)) == 3


@pytest.mark.parametrize(
    "channels_out, kernel, stride, lanes, register",
    [  # 24, 40, 36: padded to 32, 48, 48
        (32, 1, 1, 16, "zmm"),
        (24, 3, 2, 16, "zmm"),
        (40, 3, 1, 16, "zmm"),
        (36, 1, 1, 16, "zmm"),
        (8, 3, 1, 8, "ymm"),
        (4, 1, 1, 4, "xmm"),
    ],
)
def test_the_rule_spaces_are_register_tiled_micro_kernels_of_the_widest_vectors_that_fit(
    tmp_path, channels_out, kernel, stride, lanes, register
):
    (task,), _ = marked_tasks(
        prepare(load_model(convolutions(tmp_path, 16, (channels_out, kernel, stride))), AVX512), AVX512
    )
    for sch in design_spaces(task, AVX512):
        conv = sch.get_sblock("conv2d_nhwc")
        *padding, output = [
            b for b in sch.get_child_blocks(sch.get_sblock("root")) if not sch.get(b).same_as(sch.get(conv))
        ]
        assert [sch.get(b).name_hint for b in padding] in ([], ["pad_temp"]), sch.mod.script()
        loops = [sch.get(loop) for loop in sch.get_loops(conv)]
        lane, unit, vectors, rows = loops[-1], loops[-2], loops[-3], loops[-4]
        assert lane.kind == tvm.tirx.ForKind.VECTORIZED and int(lane.extent) == lanes
        assert int(unit.extent) == 1  # a reduction loop: the vectors are not fused into one wide vector
        assert vectors.kind == rows.kind == tvm.tirx.ForKind.UNROLLED
        assert 4 <= int(rows.extent) <= 8 and int(rows.extent) * int(vectors.extent) <= 32
        assert [int(loop.extent) for loop in loops[-7:-4]] == [kernel, kernel, 16]  # the reduction around the tile
        output_loops = [sch.get(loop) for loop in sch.get_loops(output)]
        tile = len(loops) - 7  # the loops above the reduction: the output tile, which the output block shares
        assert [loop.same_as(other) for loop, other in zip(loops[:tile], output_loops)] == [True] * tile
        assert output_loops[-1].kind == tvm.tirx.ForKind.VECTORIZED
        assembly = tvm.compile(sch.mod, target=AVX512).mod.inspect_source("asm")
        assert set(re.findall(r"vfmadd\d+ps\s+[^\n]*%([xyz]mm)", assembly)) == {register}


def test_the_vectors_of_a_tile_stay_apart_after_meta_schedules_postprocessing(tmp_path):
    (task,), _ = marked_tasks(prepare(load_model(convolutions(tmp_path, 16, (48, 1, 1))), AVX512), AVX512)
    register_schedule_rules()
    context = ms.TuneContext(
        mod=task.dispatched[0],
        target=AVX512,
        space_generator="post-order-apply",
        search_strategy="replay-trace",
        task_name=task.task_name,
    )
    postproc = ms.postproc.RewriteParallelVectorizeUnroll()
    postproc._initialize_with_tune_context(context)
    three_vectors = 0
    for sch in context.generate_design_space():
        loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("conv2d_nhwc"))]
        three_vectors += int(loops[-3].extent) == 3
        assert postproc.apply(sch)
        vectorized = [
            int(sch.get(loop).extent)
            for loop in sch.get_loops(sch.get_sblock("conv2d_nhwc"))
            if sch.get(loop).kind == tvm.tirx.ForKind.VECTORIZED
        ]
        assert vectorized == [16]  # not 48 lanes: LLVM rebuilt those lane by lane every step
    assert three_vectors  # a space with 3 x 16 channels was among them


def test_the_epilogue_is_folded_into_the_tile(tmp_path):
    marked, _ = marked_tasks(prepare(load_model(separable(tmp_path, "NHWC")), AVX512), AVX512)
    (pointwise,) = [task for task in marked if "add" in task.task_name]  # the one with a bias
    for sch in design_spaces(pointwise, AVX512):
        names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
        assert len(names) == 2, sch.mod.script()  # the convolution and the output: bias, clip inlined


def design_spaces(task: ms.ExtractedTask, target: tvm.target.Target) -> list[tvm.s_tir.Schedule]:
    load_cpu_intrinsics(target)  # as the class process does: TuneContext would import all of TVM's (15-50 s)
    register_schedule_rules()  # as the tuner does before it makes tune contexts
    context = ms.TuneContext(
        mod=task.dispatched[0],
        target=target,
        space_generator="post-order-apply",
        search_strategy="replay-trace",
        task_name=task.task_name,
    )
    spaces = context.generate_design_space()
    assert spaces
    return spaces


def test_a_model_tuned_with_the_rule_answers_what_onnxruntime_answers(tmp_path):
    model = convolutions(tmp_path, 3, (24, 3, 2), (16, 1, 1))
    prepared = prepare(load_model(model), HOST)
    tasks, _ = marked_tasks(prepared, HOST)
    assert len(tasks) == 2  # the padded 3x3 stride-2 3-channel stem and the pointwise convolution
    assert_answers_like_onnxruntime(model, prepared, tune_briefly(tasks, HOST, tmp_path), HOST, tuned_tasks=2)


def test_a_row_no_tile_divides_is_tiled_with_its_last_tile_under_a_predicate(tmp_path):
    model = convolutions(tmp_path, 8, (16, 3, 1), (16, 1, 1), size=13)  # 13 = 2 tiles of 7, one pixel idle
    prepared = prepare(load_model(model), HOST)
    tasks, other_convolutions = marked_tasks(prepared, HOST)
    assert len(tasks) == 2 and not other_convolutions
    for task in tasks:
        for sch in design_spaces(task, HOST):
            loops = sch.get_loops(sch.get_sblock("conv2d_nhwc"))
            assert int(sch.get(loops[-4]).extent) == 7  # the tile's pixels, unrolled
            assert "T.where" in sch.mod.script()  # the predicate of the last tile
    assert_answers_like_onnxruntime(model, prepared, tune_briefly(tasks, HOST, tmp_path), HOST, tuned_tasks=2)


@given(st.integers(1, 100_000))
def test_every_row_over_three_pixels_gets_tiles_that_leave_the_fewest_pixels_idle(width):
    counts = range(MIN_ROWS, MAX_ROWS + 1)
    divisors = [rows for rows in counts if width % rows == 0]
    assert row_tiles(width) == divisors  # the depthwise and integer rules take only these
    tiles = row_tiles(width, tail=True)
    if width < MIN_ROWS:
        assert tiles == []
        return
    assert tiles and set(tiles) <= set(counts)
    idle = {rows: -width % rows for rows in counts}  # pixels of the last tile past the row's end
    if divisors:  # and the longer tiles that leave at most 1/32 of the row idle
        assert tiles[: len(divisors)] == divisors
        longer = tiles[len(divisors) :]
        assert all(rows > max(divisors) and idle[rows] * 32 <= width for rows in longer)
        assert len(longer) == sum(rows > max(divisors) and idle[rows] * 32 <= width for rows in counts)
        return
    assert {idle[rows] for rows in tiles} == {min(idle.values())} and min(idle.values()) < MIN_ROWS


def test_a_long_row_only_short_tiles_divide_also_gets_longer_tiles_under_a_predicate(tmp_path):
    """132 rows: 4 and 6 divide them; tiles of 7 and 8 leave 1 and 4 rows idle (at most 1/32)."""
    marked, _ = marked_tasks(prepare(load_model(dense_layers(tmp_path, tokens=132)), AVX512), AVX512)
    for task in marked:  # the second layer's 37 of 48 output channels are a predicate of their own
        predicates = [
            (int(sch.get(sch.get_loops(sch.get_sblock("conv2d_nhwc"))[-4]).extent), sch.mod.script().count("T.where"))
            for sch in design_spaces(task, AVX512)
        ]
        assert {rows for rows, _ in predicates} == {4, 6, 7, 8}
        divided = {count for rows, count in predicates if rows in (4, 6)}
        assert len(divided) == 1 and all(count > max(divided) for rows, count in predicates if rows in (7, 8))


def dense_layers(tmp_path, tokens: int = 10) -> Model:
    """Two dense layers of `tokens` rows, as a text recogniser's head has them: MatMul 24 -> 37
    (no vector divides 37) + bias, ReLU, MatMul 37 -> 32."""
    rng = np.random.default_rng(2)
    weights = [
        numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype("float32"), name)
        for name, shape in (("w0", (24, 37)), ("b0", (37,)), ("w1", (37, 32)))
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["m0"]),
        helper.make_node("Add", ["m0", "b0"], ["a0"]),
        helper.make_node("Relu", ["a0"], ["r0"]),
        helper.make_node("MatMul", ["r0", "w1"], ["y"]),
    ]
    path = save(
        tmp_path / "dense.onnx",
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, 24])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, 32])],
        weights,
    )
    return Model("dense", (ModelInput("x", (1, tokens, 24)),), onnx=path, layout="NHWC")


def test_dense_layers_are_pointwise_kernels_of_the_rule_their_odd_outputs_padded_to_a_vector(tmp_path):
    marked, _ = marked_tasks(prepare(load_model(dense_layers(tmp_path)), AVX512), AVX512)
    weights = sorted(tuple(int(d) for d in task.dispatched[0]["main"].params[1].shape) for task in marked)
    assert weights == [(32, 1, 1, 37), (48, 1, 1, 24)]  # 37 outputs padded to 48 (3 vectors of 16)
    for task in marked:
        for sch in design_spaces(task, AVX512):
            lane = sch.get(sch.get_loops(sch.get_sblock("conv2d_nhwc"))[-1])
            assert lane.kind == tvm.tirx.ForKind.VECTORIZED and int(lane.extent) == 16


@pytest.mark.parametrize("tokens", [13, 132])  # 13 rows: tiles of 7, the last under a predicate; 132: 4 to 8
def test_dense_layers_tuned_with_the_rule_answer_what_onnxruntime_answers(tmp_path, tokens):
    model = dense_layers(tmp_path, tokens)
    prepared = prepare(load_model(model), HOST)
    tasks, _ = marked_tasks(prepared, HOST)
    assert len(tasks) == 2
    assert_answers_like_onnxruntime(model, prepared, tune_briefly(tasks, HOST, tmp_path), HOST, tuned_tasks=2)


def test_dense_layers_of_one_row_stay_matmuls_that_stock_meta_schedule_tunes(tmp_path):
    """A classifier head (one row) fits no register tile; padded and sliced, its stock schedules
    had RewriteLayout pre-pack the weight wrongly (edgetune.compiler.relax.layout), so it is left alone."""
    names = [
        task.task_name for task in extract_tasks(prepare(load_model(dense_layers(tmp_path, tokens=1)), AVX512), AVX512)
    ]
    assert sum("matmul" in name for name in names) == 2 and not any("conv2d" in name for name in names), names


AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 1})  # 8 lanes: every x86 CI machine has it
ZEN4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 1})  # 16 lanes, on 8-lane units


def marked_weights(model: Model, target: tvm.target.Target) -> list[tuple[int, ...]]:
    marked, _ = marked_tasks(prepare(load_model(model), target), target)
    return sorted(tuple(int(d) for d in task.dispatched[0]["main"].params[1].shape[:1]) for task in marked)


def test_output_channels_no_full_vector_divides_are_computed_padded_then_sliced_off(tmp_path):
    model = convolutions(tmp_path, 8, (24, 3, 1), (12, 1, 1), (32, 1, 1))
    assert marked_weights(model, AVX512) == [(16,), (32,), (32,)]  # 24: 3 vectors of 8 become 2 of 16; 12: 3 of 4, 1
    assert marked_weights(model, AVX2) == [(16,), (24,), (32,)]  # 24 is 3 full vectors of 8 already; 12: 3 of 4, 2 of 8
    assert marked_weights(model, HOST) == [(12,), (24,), (32,)]  # 4 lanes divide them all
    # Zen 4 computes a 16-lane operation as two 8-lane ones: 24 is 3 operations either way, padded
    # 12 is 2 (one 16-lane vector) against 3 of 4 lanes
    assert marked_weights(model, ZEN4) == [(16,), (24,), (32,)]
    marked, _ = marked_tasks(prepare(load_model(model), AVX512), AVX512)
    assert sum("strided_slice" in task.task_name for task in marked) == 2


def test_a_row_no_register_tile_fits_is_not_padded(tmp_path):
    """Stock MetaSchedule, not the rule, tunes it: padded and sliced, such a kernel once had its
    weight pre-packed wrongly (edgetune.compiler.relax.layout)."""
    names = [
        t.task_name
        for t in extract_tasks(prepare(load_model(convolutions(tmp_path, 8, (24, 3, 1), size=3)), AVX512), AVX512)
    ]
    assert any("conv2d" in name for name in names) and not any("strided_slice" in name for name in names), names


def test_padded_convolutions_tuned_with_the_rule_answer_what_onnxruntime_answers(tmp_path):
    model = convolutions(tmp_path, 8, (12, 3, 1), (20, 1, 1))  # padded to 16 and 24 on AVX2
    prepared = prepare(load_model(model), AVX2)
    tasks, _ = marked_tasks(prepared, AVX2)
    assert sorted(int(t.dispatched[0]["main"].params[1].shape[0]) for t in tasks) == [16, 24]
    assert_answers_like_onnxruntime(model, prepared, tune_briefly(tasks, AVX2, tmp_path), AVX2, tuned_tasks=2)
