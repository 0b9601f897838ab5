"""The model's interface in the manifest (`compiler.models.model_interface`): what onnxruntime
reports for the same ONNX file, and what the built library really takes and answers."""

from __future__ import annotations

import onnxruntime as ort
import pytest
from support.onnx_samples import conv_model, qdq_model

from edgetune.compiler.models import load_model, model_interface, reference_inputs, reference_outputs
from edgetune.errors import TuneError
from edgetune.inventory.schema import Model, ModelInput

ORT_TYPES = {"tensor(float)": "float32", "tensor(uint8)": "uint8", "tensor(int8)": "int8", "tensor(int64)": "int64"}


def _same_as_onnxruntime(model: Model) -> None:
    interface = model_interface(load_model(model), [i.name for i in model.fed_inputs])
    session = ort.InferenceSession(str(model.onnx), providers=["CPUExecutionProvider"])
    declared = {i.name: i.shape for i in model.inputs}
    ours = {s.name: s for s in interface.inputs}
    for theirs in session.get_inputs():
        spec = ours[theirs.name]
        assert spec.dtype == ORT_TYPES[theirs.type]
        assert len(spec.shape) == len(theirs.shape)
        for i, (mine, onnx_dim) in enumerate(zip(spec.shape, theirs.shape)):
            assert mine == (onnx_dim if isinstance(onnx_dim, int) else declared[theirs.name][i])
    assert len(interface.outputs) == len(session.get_outputs())
    given = reference_inputs(model)
    for spec, theirs, out in zip(interface.outputs, session.get_outputs(), session.run(None, given)):
        assert spec.dtype == ORT_TYPES[theirs.type] and spec.shape == out.shape  # the declared input's shapes


def test_an_onnx_models_interface_is_what_onnxruntime_reports(tmp_path):
    _same_as_onnxruntime(conv_model(tmp_path / "conv.onnx"))


def test_a_quantized_onnx_models_interface_is_what_onnxruntime_reports(tmp_path):
    path = qdq_model(tmp_path / "qdq.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = tuple(
        ModelInput(i.name, tuple(d if isinstance(d, int) else 1 for d in i.shape)) for i in session.get_inputs()
    )
    _same_as_onnxruntime(Model(name="qdq", inputs=inputs, onnx=path))


def test_a_builtin_models_interface_is_its_reference_data():
    model = Model(name="mlp", inputs=(ModelInput("x", (1, 64), "float32"),), builtin="mlp")
    interface = model_interface(load_model(model), ["x"])
    given = reference_inputs(model)
    expected = reference_outputs(model, given)
    assert [(s.name, s.shape, s.dtype) for s in interface.inputs] == [("x", (1, 64), str(given["x"].dtype))]
    assert [(s.name, s.shape, s.dtype) for s in interface.outputs] == [
        (f"output{i}", out.shape, str(out.dtype)) for i, out in enumerate(expected)
    ]


def test_inputs_declared_that_the_function_does_not_take_are_refused():
    model = Model(name="mlp", inputs=(ModelInput("x", (1, 64), "float32"),), builtin="mlp")
    with pytest.raises(TuneError, match="takes 1 inputs, 2 are declared: x, y"):
        model_interface(load_model(model), ["x", "y"])
