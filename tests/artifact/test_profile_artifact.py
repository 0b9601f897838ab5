"""`edgetune profile` on the simulated fleet (`built_release`, tests/conftest.py): a built
artifact's kernels timed on a board of its class next to onnxruntime's operators, as a table
and as JSON; and the errors for an unknown model or class, a model never built, a board that
is not up.

No tuning here: the ONNX model below is the built-in mlp written as an ONNX graph (MatMul, Add,
Relu), whose prepared kernels are the built-in's, so the class database `built_release` tuned
for mlp serves it; this module builds it into a copy of the store."""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket

import numpy as np
import onnx
import pytest
import tvm
import yaml
from onnx import TensorProto, helper, numpy_helper
from support.inventory_dump import fleet_to_dict
from tvm.s_tir import meta_schedule as ms

from edgetune.artifact.board_profile import library_kernels
from edgetune.artifact.release import build_artifacts
from edgetune.cli import main
from edgetune.compiler.models import load_model
from edgetune.compiler.prepare import apply_database, prepare
from edgetune.inventory.schema import Model, ModelInput
from edgetune.inventory.workdir import Workdir

CLASS = "gw-fast"
MODEL = "mlp-onnx"
FEATURES = 256


def write_mlp_onnx(path):
    """The built-in mlp (256 -> 512 -> relu -> 256) as an ONNX graph."""
    rng = np.random.default_rng(2)

    def weight(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.05, name)

    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="fc1"),
        helper.make_node("Add", ["m1", "b1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["r1"]),
        helper.make_node("MatMul", ["r1", "w2"], ["m2"], name="fc2"),
        helper.make_node("Add", ["m2", "b2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, FEATURES])],
        initializer=[
            weight("w1", FEATURES, 2 * FEATURES),
            weight("b1", 2 * FEATURES),
            weight("w2", 2 * FEATURES, FEATURES),
            weight("b2", FEATURES),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture(scope="module")
def profiled_fleet(built_release, tmp_path_factory):
    """A copy of `built_release` (CLASS's database, the whole store) with MODEL declared and
    built for CLASS from that database, and its fleet.yaml for the CLI."""
    source, as_built = built_release.fleet, built_release.as_built
    root = tmp_path_factory.mktemp("profile")
    database = Workdir(as_built / "work").database(CLASS)
    shutil.copytree(database, root / database.relative_to(as_built))
    shutil.copytree(as_built / "artifacts", root / "artifacts")
    model = Model(MODEL, (ModelInput("x", (1, FEATURES)),), onnx=write_mlp_onnx(root / "mlp.onnx"))
    fleet = source.replace(
        path=root / "fleet.yaml",
        workdir=root / "work",
        models=(*source.models, model),
        artifacts=dataclasses.replace(source.artifacts, dir=root / "artifacts"),
    )
    fleet.path.write_text(yaml.safe_dump(fleet_to_dict(fleet)))
    report = build_artifacts(fleet, classes=[CLASS], models=[MODEL])
    assert report.ok, report.failures()
    return fleet


def profile(capsys, fleet, *args) -> tuple[int, str, str]:
    code = main(["profile", "-f", str(fleet.path), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_table_has_kernel_rows_operator_rows_and_totals(profiled_fleet, capsys):
    code, out, err = profile(capsys, profiled_fleet, MODEL, "--class", CLASS, "--repeat", "3")
    print(out)
    assert code == 0, err
    assert f"{MODEL} v1 for {CLASS} on board fast-" in out
    kernel_lines = [line for line in out.splitlines() if line.startswith("fused_matmul")]
    assert len(kernel_lines) == 2 and all("matmul / dense" in line for line in kernel_lines)
    # onnxruntime fuses each MatMul with its Add into a Gemm (FusedGemm with the Relu); node names keep "fc1"/"fc2"
    operators = [line for line in out.splitlines() if "fc1/" in line or "fc2/" in line]
    assert len(operators) == 2 and all("Gemm " in line and "matmul / dense" in line for line in operators)
    for total in ("= all kernels", "= outside kernels", "= model call"):
        assert sum(line.startswith(total) for line in out.splitlines()) == 1, total


def test_json_has_both_profiles_by_kernel_and_by_kind(profiled_fleet, capsys):
    code, out, err = profile(capsys, profiled_fleet, MODEL, "--class", CLASS, "--version", "1", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["model"], report["class"], report["version"]) == (MODEL, CLASS, 1)
    assert report["board"] in [b.name for b in profiled_fleet.boards_of(CLASS)]
    assert report["tvm"]["ran_on"] == "board" and report["onnxruntime"]["ran_on"] == "host"
    tvm_kernels = {k["name"]: k for k in report["tvm"]["kernels"]}
    first = next(k for name, k in tvm_kernels.items() if "relu" in name)
    assert (first["kind"], first["calls"], first["flops"]) == ("matmul / dense", 1, 2 * FEATURES * 2 * FEATURES)
    assert all(k["ms"] > 0 for k in tvm_kernels.values())
    assert {k["op"] for k in report["onnxruntime"]["kernels"]} <= {"Gemm", "FusedGemm", "MatMul", "Add", "Relu"}
    assert {k["kind"] for k in report["onnxruntime"]["kernels"]} == {"matmul / dense"}
    for side in ("tvm", "onnxruntime"):
        assert report[side]["model_ms"] > 0
        assert report[side]["kernels_ms"] == pytest.approx(sum(k["ms"] for k in report[side]["kernels"]))
    kinds = {row["kind"]: row for row in report["kinds"]}
    assert kinds["matmul / dense"]["tvm_ms"] > 0 and kinds["matmul / dense"]["onnxruntime_ms"] > 0


def test_a_built_in_model_has_no_onnxruntime_side(profiled_fleet, capsys):
    code, out, err = profile(capsys, profiled_fleet, "mlp", "--class", CLASS, "--repeat", "2", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["onnxruntime"] is None and len(report["tvm"]["kernels"]) == 2


def test_kernels_are_the_built_modules_with_their_call_counts(profiled_fleet):
    """Every kernel the entry function calls, once each here, with its pre-packed signature."""
    model = next(m for m in profiled_fleet.models if m.name == MODEL)
    target = tvm.target.Target(dict(profiled_fleet.device_class(CLASS).profile.target_json()))
    kernels = library_kernels(apply_database(prepare(load_model(model), target), ms.database.MemoryDatabase(), target))
    assert sorted(k.name for k in kernels) == ["fused_matmul1_add11", "fused_matmul_add_relu1"]
    assert all(k.calls == 1 and k.shapes[0] == (1, FEATURES if "relu" in k.name else 2 * FEATURES) for k in kernels)


@pytest.mark.parametrize(
    ("args", "exit_code", "message"),
    [
        (["resnet"], 5, "unknown model 'resnet' (models in "),
        ([MODEL, "--class", "gw-huge"], 5, "unknown device class 'gw-huge' (classes in "),
        ([MODEL, "--class", CLASS, "--version", "9"], 5, f"{MODEL} for {CLASS} has no version 9 (stored: v1)"),
        ([MODEL, "--class", "gw-slow"], 5, f"no built artifact of {MODEL} for class gw-slow in "),
        (
            [MODEL, "--class", CLASS, "--board", "slow-1"],
            3,
            f"'slow-1' is not a board of class {CLASS} (its boards: fast-1, fast-2)",
        ),
    ],
)
def test_errors_name_what_is_wrong_and_what_to_run(profiled_fleet, capsys, args, exit_code, message):
    code, out, err = profile(capsys, profiled_fleet, *args)
    assert (code, out) == (exit_code, "")
    assert message in err
    if "no built artifact" in message:
        assert f"run `edgetune build -f {profiled_fleet.path} --class gw-slow --model {MODEL}` first" in err


def test_a_fleet_that_is_not_up_is_told_to_run_fleet_up(profiled_fleet, capsys, tmp_path):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    trackers = tuple(
        dataclasses.replace(t, bind_host="127.0.0.1", public_address="127.0.0.1", port=port, port_end=port)
        for t in profiled_fleet.trackers
    )
    down = profiled_fleet.replace(path=tmp_path / "fleet.yaml", workdir=tmp_path / "work", trackers=trackers)
    down.path.write_text(yaml.safe_dump(fleet_to_dict(down)))
    code, out, err = profile(capsys, down, MODEL, "--class", CLASS)
    assert code == 3 and out == ""
    assert f"the tracker at 127.0.0.1:{port} does not answer" in err and "run `edgetune fleet up -f " in err
