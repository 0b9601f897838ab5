"""`edgetune import` on real ONNX files: its stdout is a fleet.yaml `models:` entry that loads as
YAML whatever the model, with nothing TVM or onnxruntime print in it; a model with dynamic sizes
is not run and no time limit is suggested for it; a model TVM fails on ends in a clean error.

The models are the suite's real ONNX graphs (tests/support/onnx_samples.py, built with onnx.helper and
onnxruntime's quantizer), graphs built here the way exporters write dynamic sizes, and the pinned
public models of bench/real_models.py where they are already in its cache (never downloaded here:
`.venv/bin/python bench/real_models.py` fetches them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper
from real_models import MODELS, UNSEEN, cache_dir
from support.onnx_samples import (
    qdq_model,
    save,
    write_conv_model,
    write_quantized_moves,
    write_quantized_separable,
    write_quantized_silu,
    write_separable_block,
)

from edgetune.cli import main
from edgetune.errors import InventoryError, TuneError

REPO = Path(__file__).resolve().parents[2]

# What TVM's and onnxruntime's code writes when it converts or runs a model: none of it may
# reach stdout.
LIBRARY_OUTPUT = ("Error converting operator", "Metadata omitted", "Warning:", ":onnxruntime:", "Traceback")


def dynamic_reshape_model(path: Path) -> Path:
    """image[batch, 3, 8, width] (batch and width dynamic): conv 3x3 (3 -> 4) + ReLU, flattened
    per image by a Reshape whose shape is computed from the input's own (Shape -> Slice ->
    Concat with -1, as exporters write `x.view(x.size(0), -1)`), then its mean: the pattern TVM's
    converter prints `Error converting operator Reshape` for at unsuitable sizes."""
    rng = np.random.default_rng(5)
    weights = [
        numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([-1], np.int64), "rest"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "w"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("Shape", ["relu"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "one"], ["batch"]),
        helper.make_node("Concat", ["batch", "rest"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["relu", "flat_shape"], ["flat"]),
        helper.make_node("ReduceMean", ["flat"], ["y"], axes=[1]),
    ]
    return save(
        path,
        nodes,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 8, "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])],
        weights,
    )


def pool_then(path: Path, last: str, dims: list) -> Path:
    """x[dims] -> max pool 2x2 stride 2 -> `last` (GlobalAveragePool, or a Reshape to [1, 4]):
    at a 1 x 1 image onnxruntime pools to 1 x 1 but TVM to 0 x 0, as PP-OCR's text-direction
    classifier does at sizes 1, so TVM divides by zero (the mean) or cannot reshape."""
    weights = [numpy_helper.from_array(np.array([1, 4], np.int64), "shape")] if last == "Reshape" else []
    nodes = [
        helper.make_node("MaxPool", ["x"], ["pooled"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node(last, ["pooled", "shape"] if last == "Reshape" else ["pooled"], ["y"]),
    ]
    return save(
        path,
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        weights,
    )


def paddle_style_dynamic(path: Path) -> Path:
    """The PP-OCR classifier's input as Paddle2ONNX writes it (x[-1, 3, -1, -1]: dynamic sizes as
    dim_value -1), in front of the pooling TVM divides by zero on at sizes 1."""
    path = pool_then(path, "GlobalAveragePool", [1, 4, 1, 1])
    proto = onnx.load(str(path))
    for index in (0, 2, 3):
        proto.graph.input[0].type.tensor_type.shape.dim[index].dim_value = -1
    onnx.save(proto, str(path))
    return path


SUITE_MODELS = {  # name: (writer, the inputs whose sizes are dynamic)
    "conv-dynamic-batch": (write_conv_model, ["image"]),
    "conv": (lambda path: write_conv_model(path, batch=1), []),
    "separable-block": (write_separable_block, []),
    "quantized-moves": (write_quantized_moves, []),
    "quantized-silu": (write_quantized_silu, []),
    "quantized-separable-softmax": (lambda path: write_quantized_separable(path, softmax=True), []),
    "qdq-rate-branch": (lambda path: qdq_model(path, rate_branch=True), []),
    "dynamic-reshape": (dynamic_reshape_model, ["image"]),
    "pool-mean-dynamic": (lambda path: pool_then(path, "GlobalAveragePool", ["n", 4, "h", "w"]), ["x"]),
    "paddle-style-dynamic": (paddle_style_dynamic, ["x"]),
}


def cached_real_models() -> list:
    """bench/real_models.py's models already in its cache, with their paths (none downloaded)."""
    found = [(model, cache_dir() / f"{model.name}-{model.sha256[:12]}.onnx") for model in (*MODELS, *UNSEEN)]
    return [pytest.param(path, id=model.name) for model, path in found if path.is_file()]


def dynamic_inputs(path: Path) -> list[str]:
    """The graph's inputs with a size it leaves open, read with onnx alone."""
    proto = onnx.load(str(path), load_external_data=False)
    weights = {w.name for w in proto.graph.initializer}
    return [
        value.name
        for value in proto.graph.input
        if value.name not in weights
        and (
            not value.type.tensor_type.HasField("shape")
            or any(not (d.HasField("dim_value") and d.dim_value > 0) for d in value.type.tensor_type.shape.dim)
        )
    ]


def check_entry(out: str, name: str, path: Path) -> dict:
    """stdout is one `models:` entry of `name` at `path`, valid YAML, every line outside the entry
    a comment, nothing from a library in it."""
    for marker in LIBRARY_OUTPUT:
        assert marker not in out, f"library output on stdout: {marker!r} in\n{out}"
    assert all(line.startswith(("models:", "  ", "#")) for line in out.splitlines()), out
    document = yaml.safe_load(out)
    assert list(document) == ["models"] and len(document["models"]) == 1, out
    entry = document["models"][0]
    assert entry["name"] == name and entry["onnx"] == str(path), entry
    return entry


def check_import(path: Path, name: str, dynamic: list[str], capfd) -> None:
    capfd.readouterr()  # what building the model printed (onnxruntime's quantizer) is not import's
    assert main(["import", str(path), "--name", name]) == 0, capfd.readouterr().err
    out = capfd.readouterr().out
    entry = check_entry(out, name, path)
    graph = onnx.load(str(path), load_external_data=False)
    weights = {w.name for w in graph.graph.initializer}
    assert [i["name"] for i in entry["inputs"]] == [v.name for v in graph.graph.input if v.name not in weights]
    if dynamic:
        assert "time_limit_s" not in out, out
        reason = out[out.index("# no tuning time limit suggested") :]
        assert all(f" {name}: " in reason for name in dynamic), reason
        assert "models[].inputs[].shape" in reason and "`edgetune plan`" in reason, reason
    else:
        assert "\n# tuning:\n#   time_limit_s: " in out, out


@pytest.mark.parametrize("sample", SUITE_MODELS)
def test_import_of_each_suite_model_prints_a_valid_entry_and_nothing_else(sample, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)  # no fleet.yaml: the target and rate import falls back to
    writer, dynamic = SUITE_MODELS[sample]
    path = writer(tmp_path / f"{sample}.onnx")
    assert dynamic_inputs(path) == dynamic  # the sample is what its name says
    check_import(path, sample, dynamic, capfd)


@pytest.mark.parametrize(
    "path",
    cached_real_models()
    or [
        pytest.param(
            None,
            marks=pytest.mark.skip(
                reason="no model of bench/real_models.py in its cache (fetch: .venv/bin/python bench/real_models.py)"
            ),
        )
    ],
)
def test_import_of_each_cached_public_model_prints_a_valid_entry_and_nothing_else(path, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    check_import(path, path.stem, dynamic_inputs(path), capfd)


def test_a_model_with_dynamic_sizes_is_not_run(tmp_path, monkeypatch, capfd):
    """PP-OCR's classifier at sizes 1 made TVM divide by zero: a dynamic model is not imported
    into TVM at all (its conversion would fail the same way)."""
    import edgetune.compiler.tasks as tasks

    def refuse(*_args, **_kwargs):
        raise AssertionError("a model with dynamic sizes was run")

    monkeypatch.setattr(tasks, "class_tasks", refuse)
    monkeypatch.chdir(tmp_path)
    check_import(paddle_style_dynamic(tmp_path / "cls.onnx"), "cls", ["x"], capfd)


def run_import(path: Path) -> subprocess.CompletedProcess:
    """`edgetune import` as a user runs it: its own process, its real descriptors 1 and 2."""
    return subprocess.run(
        [sys.executable, "-m", "edgetune", "import", str(path)],
        capture_output=True,
        text=True,
        cwd=path.parent,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.parametrize(
    "last,message",
    [
        # TVM's converter prints `Error converting operator Reshape, with inputs: [...]` (several lines)
        ("Reshape", "TVM's ONNX frontend failed: ValueError: Reshape expects the new shape to be convertible"),
        # TVM's legalization of the mean divides by the zero size (an InternalError out of C++)
        (
            "GlobalAveragePool",
            "TVM cannot extract its tasks: InternalError: Check failed: fb->value != 0 (0 vs. 0) : Divide by zero",
        ),
    ],
)
def test_a_model_tvm_cannot_convert_is_a_clean_error_after_its_entry(tmp_path, last, message):
    path = pool_then(tmp_path / "pooled.onnx", last, [1, 4, 1, 1])
    done = run_import(path)
    assert done.returncode == TuneError.exit_code == 4, done.stderr
    assert "Traceback" not in done.stderr and 'File "' not in done.stderr, done.stderr
    assert "error: model 'pooled' " in done.stderr and message in done.stderr, done.stderr
    out = done.stdout
    check_entry(out, "pooled", path)
    problem = [line for line in out.splitlines() if line.startswith("# no tuning time limit suggested")]
    assert len(problem) == 1 and message in problem[0], out
    assert "time_limit_s" not in out
    if last == "Reshape":
        assert "Error converting operator Reshape" in done.stderr  # where the converter's print went


def test_an_input_edgetune_cannot_feed_is_an_inventory_error_after_its_entry(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    path = save(
        tmp_path / "flags.onnx",
        [
            helper.make_node("Not", ["flags"], ["inverted"]),
            helper.make_node("Cast", ["inverted"], ["y"], to=TensorProto.FLOAT),
        ],
        [helper.make_tensor_value_info("flags", TensorProto.BOOL, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [],
    )
    assert main(["import", str(path)]) == InventoryError.exit_code == 2
    captured = capfd.readouterr()
    entry = check_entry(captured.out, "flags", path)
    assert entry["inputs"] == [{"name": "flags", "shape": [1, 4], "dtype": "bool"}]
    assert "dtype: bool  # FIX: edgetune feeds float32" in captured.out and "time_limit_s" not in captured.out
    message = f"model 'flags' ({path}): input(s) of a dtype edgetune cannot feed"
    assert f"# no tuning time limit suggested: {message}" in captured.out
    assert f"error: {message}" in captured.err and "Traceback" not in captured.err
