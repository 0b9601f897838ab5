"""Model import: built-in models and ONNX files, and their reference input/output."""

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax

from edgetune.errors import TuneError
from edgetune.inventory.schema import Model, ModelInput
from edgetune.tune.models import entry_function, load_model, reference_inputs, reference_outputs
from edgetune.tune.prepare import build_untuned, prepare

from conftest import conv_model

HOST = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})


def run(mod: tvm.IRModule, model: Model, inputs: dict) -> np.ndarray:
    prepared = prepare(mod, HOST)
    vm = relax.VirtualMachine(build_untuned(prepared, HOST), tvm.cpu())
    out = vm[entry_function(prepared)](*[tvm.runtime.tensor(inputs[i.name]) for i in model.inputs])
    return out.numpy()


@pytest.mark.parametrize("builtin,shape", [("mlp", (1, 64)), ("mobilenet-mini", (1, 3, 32, 32)),
                                           ("transformer-block", (1, 8, 32))])
def test_builtin_models_are_deterministic_and_match_reference(builtin, shape):
    model = Model(builtin, (ModelInput("x", shape),), builtin=builtin)
    inputs = reference_inputs(model)
    assert np.array_equal(inputs["x"], reference_inputs(model)["x"])
    np.testing.assert_allclose(run(load_model(model), model, inputs), reference_outputs(model, inputs)[0],
                               rtol=1e-4, atol=1e-5)


def test_onnx_model_is_frozen_preprocessed_and_matches_onnxruntime(tmp_path):
    model = conv_model(tmp_path / "conv.onnx")
    inputs = reference_inputs(model)
    np.testing.assert_allclose(run(load_model(model), model, inputs), reference_outputs(model, inputs)[0],
                               rtol=1e-4, atol=1e-5)


def test_unsupported_onnx_operator_is_named(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("DFT", ["r"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    path = tmp_path / "dft.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(TuneError, match=r"model 'odd'.*DFT"):
        load_model(Model("odd", (ModelInput("x", (1, 8, 2)),), onnx=path))
