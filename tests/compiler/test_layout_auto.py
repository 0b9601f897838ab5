"""`layout: auto`: each model's layout chosen from its imported graph (NHWC where the NHWC
micro-kernel rules take most of its convolution FLOPs, NCHW otherwise), said with its reason
by `edgetune plan`, `tune --dry-run` and the build report, and the same for tuning and building."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tvm
import yaml
from onnx import TensorProto, helper, numpy_helper
from support.onnx_samples import save, write_quantized_separable, write_separable_block
from support.rule_tuning import assert_answers_like_onnxruntime, tune_briefly
from support.tests_samples import FAKE_PRIVATE_KEY
from tvm import relax

from edgetune.artifact.release import BuildOutcome, BuildReport
from edgetune.cli import main
from edgetune.compiler.models import entry_function, import_model
from edgetune.compiler.prepare import extract_tasks, prepare
from edgetune.compiler.relax.layout import LayoutChoice
from edgetune.compiler.tasks import workload_hash
from edgetune.compiler.tir.convolution import RULE
from edgetune.inventory import load_fleet
from edgetune.inventory.schema import DEFAULT_LAYOUT, Model, ModelInput

pytestmark = pytest.mark.tvm

REPO = Path(__file__).resolve().parents[2]
HOST = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})
RNG = np.random.default_rng(3)


def weight(name: str, *shape: int) -> TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.2).astype(np.float32), name)


def write_mlp(path: Path) -> Path:
    """Two dense layers of one row (1 x 64 -> 32 -> 10): no convolution, and rows no register
    tile of the pointwise rule divides, so NHWC would rewrite nothing."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    return save(
        path,
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [weight("w1", 64, 32), weight("w2", 32, 10)],
    )


def write_grouped_upsampler(path: Path) -> Path:
    """Convolutions no NHWC rule takes: a grouped 3x3 (16 -> 16 in 4 groups), a transposed 2x2
    of stride 2 (16 -> 8, kept NCHW) and a pointwise 8 -> 6 (6 channels: no vector of 4 lanes)."""
    nodes = [
        helper.make_node("Conv", ["x", "w_grouped"], ["g"], pads=[1, 1, 1, 1], group=4),
        helper.make_node("Relu", ["g"], ["r"]),
        helper.make_node("ConvTranspose", ["r", "w_up"], ["u"], strides=[2, 2]),
        helper.make_node("Conv", ["u", "w_pw"], ["y"]),
    ]
    weights = [weight("w_grouped", 16, 4, 3, 3), weight("w_up", 16, 8, 2, 2), weight("w_pw", 6, 8, 1, 1)]
    return save(
        path,
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 32, 32])],
        weights,
    )


def write_token_projection(path: Path) -> Path:
    """A dense layer over 8 tokens (1 x 8 x 32 -> 16): in NHWC it is a pointwise convolution."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    return save(
        path,
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])],
        [weight("w", 32, 16)],
    )


def separable(tmp_path: Path, layout: str = "auto") -> Model:
    return Model(
        "separable",
        (ModelInput("image", (1, 3, 32, 32)),),
        onnx=write_separable_block(tmp_path / "separable.onnx"),
        layout=layout,
    )


def grouped(tmp_path: Path, layout: str = "auto") -> Model:
    return Model(
        "upsampler",
        (ModelInput("x", (1, 16, 16, 16)),),
        onnx=write_grouped_upsampler(tmp_path / "upsampler.onnx"),
        layout=layout,
    )


def mlp(tmp_path: Path) -> Model:
    return Model("mlp", (ModelInput("x", (1, 64)),), onnx=write_mlp(tmp_path / "mlp.onnx"), layout="auto")


def conv_layouts(mod: tvm.IRModule) -> list[str]:
    """The data layout of each 2-d convolution of the module."""
    layouts = []
    relax.analysis.post_order_visit(
        mod[entry_function(mod)],
        lambda e: (
            layouts.append(str(e.attrs.data_layout))
            if isinstance(e, relax.Call) and e.op == tvm.ir.Op.get("relax.nn.conv2d")
            else None
        ),
    )
    return layouts


def test_a_depthwise_separable_cnn_is_compiled_nhwc_and_the_reason_counts_its_convolutions(tmp_path):
    imported = import_model(separable(tmp_path))
    assert imported.layout == LayoutChoice(
        "NHWC",
        "the NHWC micro-kernel rules take 3 of 3 convolutions (1 k x k, 1 depthwise, 1 pointwise), 100% of their FLOPs",
    )
    assert conv_layouts(imported.mod) == ["NHWC"] * 3


def write_byte_classifier(path: Path, column: bool) -> Path:
    """A 1-d convolution 8 -> 16 channels, kernel 5, over 64 steps with a ReLU: an ONNX Conv
    over one axis, or (`column`) a 2-d one over a column one pixel wide, as jax2tf exports it."""
    shape, kernel = ([1, 8, 64, 1], (16, 8, 5, 1)) if column else ([1, 8, 64], (16, 8, 5))
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[2, 0, 2, 0] if column else [2, 2]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    out = [1, 16, 64, 1] if column else [1, 16, 64]
    return save(
        path,
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
        [weight("w", *kernel)],
    )


@pytest.mark.parametrize("column", [False, True], ids=["conv-1d", "conv-2d-column"])
def test_a_one_dimensional_convolution_runs_along_an_image_row_where_the_rule_takes_it(tmp_path, column):
    path = write_byte_classifier(tmp_path / "bytes.onnx", column)
    shape = (1, 8, 64, 1) if column else (1, 8, 64)
    model = Model("bytes", (ModelInput("x", shape),), onnx=path, layout="auto")
    imported = import_model(model)
    assert imported.layout.line == (
        "NHWC: the NHWC micro-kernel rules take 1 of 1 convolutions (1 one-dimensional), 100% of their FLOPs"
    )
    assert conv_layouts(imported.mod) == ["NHWC"]
    prepared = prepare(imported.mod, HOST)
    marked = [t for t in extract_tasks(prepared, HOST) if RULE in t.dispatched[0].script()]
    assert len(marked) == 1 and marked[0].task_name.startswith("fused_conv2d_relu"), marked  # the ReLU in its epilogue
    assert_answers_like_onnxruntime(model, prepared, tune_briefly(marked, HOST, tmp_path), HOST)


def test_a_model_without_convolutions_stays_nchw_and_says_so(tmp_path):
    imported = import_model(mlp(tmp_path))
    assert imported.layout.line == "NCHW: no convolutions and no dense layers that NHWC would change"


def test_convolutions_no_rule_takes_stay_nchw_with_each_kind_named(tmp_path):
    imported = import_model(grouped(tmp_path))
    assert imported.layout.layout == "NCHW"
    assert imported.layout.reason.startswith(
        "the NHWC micro-kernel rules would take only 0 of 3 convolutions (0% of their FLOPs)"
    )
    for kind in ("1 grouped", "1 transposed", "1 pointwise of a shape the rules do not take"):
        assert kind in imported.layout.reason, imported.layout.reason
    assert conv_layouts(imported.mod) == ["NCHW", "NCHW"]  # the grouped and the pointwise ones


def test_dense_layers_without_convolutions_are_nhwc_pointwise_kernels(tmp_path):
    model = Model(
        "projection", (ModelInput("x", (1, 8, 32)),), onnx=write_token_projection(tmp_path / "p.onnx"), layout="auto"
    )
    imported = import_model(model)
    assert (
        imported.layout.line
        == "NHWC: the NHWC micro-kernel rules take 1 of 1 dense layers (1 dense), 100% of their FLOPs"
    )
    assert conv_layouts(imported.mod) == ["NHWC"]  # the dense layer, as a pointwise convolution


def test_nhwc_computes_a_dense_layer_as_a_pointwise_convolution(tmp_path):
    model = Model(
        "projection", (ModelInput("x", (1, 8, 32)),), onnx=write_token_projection(tmp_path / "p.onnx"), layout="NHWC"
    )
    assert conv_layouts(import_model(model).mod) == ["NHWC"]  # the dense layer, as a pointwise convolution


def test_an_explicit_layout_wins_over_what_the_graph_holds(tmp_path):
    nchw, nhwc = import_model(separable(tmp_path, "NCHW")), import_model(grouped(tmp_path, "NHWC"))
    assert nchw.layout.line == "NCHW: set in fleet.yaml" and conv_layouts(nchw.mod) == ["NCHW"] * 3
    assert nhwc.layout.line == "NHWC: set in fleet.yaml" and conv_layouts(nhwc.mod) == ["NHWC", "NHWC"]


def test_integer_arithmetic_under_auto_is_nhwc(tmp_path):
    model = Model(
        "int8",
        (ModelInput("x", (1, 16, 8, 8)),),
        onnx=write_quantized_separable(tmp_path / "q.onnx"),
        quantized_weights="integer",
        layout="auto",
    )
    imported = import_model(model)
    assert imported.layout.line == "NHWC: quantized_weights: integer computes convolutions in NHWC micro-kernels"
    assert set(conv_layouts(imported.mod)) == {"NHWC"}


def test_auto_tunes_and_builds_the_kernels_of_the_layout_it_chose(tmp_path):
    """Tuning and building each import the model: the choice, read from the graph alone, gives
    both the kernels (and workload keys of the class database) of the explicit layout it names."""

    def keys(model: Model) -> list[str]:
        return [workload_hash(t) for t in extract_tasks(prepare(import_model(model).mod, HOST), HOST)]

    auto = keys(separable(tmp_path))
    assert auto == keys(separable(tmp_path)) == keys(separable(tmp_path, "NHWC")) != keys(separable(tmp_path, "NCHW"))


def test_the_build_report_says_each_models_layout_once():
    outcomes = tuple(BuildOutcome("separable", c, "built", layout="NHWC: why") for c in ("a", "b"))
    report = BuildReport((*outcomes, BuildOutcome("mlp", "a", "failed", error="no database")))
    assert report.layouts() == ["layout of separable: NHWC: why"]


def cli_fleet(tmp_path: Path, models: list[dict]) -> Path:
    key = tmp_path / "id_ed25519"
    key.write_text(FAKE_PRIVATE_KEY)
    key.chmod(0o600)
    data = {
        "version": 1,
        "name": "layouts",
        "workdir": "work",
        "trackers": [{"name": "host", "bind_host": "127.0.0.1", "public_address": "127.0.0.1", "port": 9190}],
        "ssh": {"user": "root", "key": str(key), "known_hosts": "known_hosts"},
        "device_classes": [{"name": "v3", "profile": str(REPO / "device_profiles/x86-64-v3.yaml")}],
        "boards": [
            {
                "name": "b1",
                "address": "10.0.0.1",
                "device_class": "v3",
                "tracker": "host",
                "python": "/usr/bin/python3",
                "workdir": "/var/lib/edgetune",
            }
        ],
        "models": models,
        "tuning": {"trials_per_class": 64, "trials_per_iter": 16},
        "artifacts": {"dir": "artifacts", "signing_key": "keys/signing.key", "public_key": "keys/signing.pub"},
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_plan_and_dry_run_say_which_layout_each_model_gets_and_why(tmp_path, capsys):
    write_separable_block(tmp_path / "separable.onnx")
    write_mlp(tmp_path / "mlp.onnx")
    path = cli_fleet(
        tmp_path,
        [
            {"name": "separable", "onnx": "separable.onnx", "inputs": [{"name": "image", "shape": [1, 3, 32, 32]}]},
            {"name": "mlp", "onnx": "mlp.onnx", "inputs": [{"name": "x", "shape": [1, 64]}], "layout": "auto"},
            {
                "name": "pinned",
                "onnx": "separable.onnx",
                "inputs": [{"name": "image", "shape": [1, 3, 32, 32]}],
                "layout": "NCHW",
            },
        ],
    )
    assert DEFAULT_LAYOUT == "auto" and load_fleet(path).models[0].layout == "auto"  # the separable model sets none
    expected = [
        (
            "layout of separable: NHWC: the NHWC micro-kernel rules take 3 of 3 convolutions (1 k x k, 1 depthwise, "
            "1 pointwise), 100% of their FLOPs"
        ),
        "layout of mlp: NCHW: no convolutions and no dense layers that NHWC would change",
        "layout of pinned: NCHW: set in fleet.yaml",
    ]
    for command in (["plan"], ["tune", "--dry-run"]):
        assert main([*command, "-f", str(path)]) == 0
        out = capsys.readouterr().out
        assert [line for line in out.splitlines() if line.startswith("layout of ")] == expected, out
    assert main(["tune", "--dry-run", "--json", "--model", "mlp", "-f", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["layouts"] == {
        "mlp": {"layout": "NCHW", "reason": "no convolutions and no dense layers that NHWC would change"}
    }
