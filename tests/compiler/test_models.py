"""Model import: built-in models and ONNX files, and their reference input/output."""

from collections.abc import Callable

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from support import numpy_models
from support.onnx_samples import conv_model
from tvm import relax

from edgetune.compiler.models import (
    entry_function,
    load_model,
    reference_inputs,
    reference_outputs,
)
from edgetune.compiler.models.builtin import builtin_weights
from edgetune.compiler.prepare import build_untuned, prepare
from edgetune.errors import TuneError
from edgetune.inventory.schema import Model, ModelInput

pytestmark = pytest.mark.tvm

HOST = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})


def compiled(mod: tvm.IRModule, model: Model) -> Callable[[dict], np.ndarray]:
    """The module prepared and built for the host as the artifact build does (untuned)."""
    prepared = prepare(mod, HOST)
    function = relax.VirtualMachine(build_untuned(prepared, HOST), tvm.cpu())[entry_function(prepared)]
    return lambda inputs: function(*[tvm.runtime.tensor(inputs[i.name]) for i in model.inputs]).numpy()


def run(mod: tvm.IRModule, model: Model, inputs: dict) -> np.ndarray:
    return compiled(mod, model)(inputs)


@pytest.mark.parametrize(
    "builtin,shape", [("mlp", (1, 64)), ("mobilenet-mini", (1, 3, 32, 32)), ("transformer-block", (1, 8, 32))]
)
def test_builtin_models_are_deterministic_and_match_numpy(builtin, shape):
    """TVM's build of each built-in agrees with the model written again in NumPy on the reference
    input and on two more (one wide enough to drive ReLU6 into its clip), and so does the
    reference output edgetune ships with its artifacts."""
    model = Model(builtin, (ModelInput("x", shape),), builtin=builtin)
    inputs = reference_inputs(model)
    assert np.array_equal(inputs["x"], reference_inputs(model)["x"])
    rng = np.random.default_rng(1)
    others = [rng.standard_normal(shape).astype("float32"), rng.uniform(-8.0, 8.0, shape).astype("float32")]
    weights = {name: w.astype(np.float64) for name, w in builtin_weights(model).items()}
    forward = compiled(load_model(model), model)
    for x in [inputs["x"], *others]:
        expected = numpy_models.FORWARD[builtin](weights, x.astype(np.float64))
        np.testing.assert_allclose(forward({"x": x}), expected, rtol=1e-4, atol=1e-4)
    expected = numpy_models.FORWARD[builtin](weights, inputs["x"].astype(np.float64))
    np.testing.assert_allclose(reference_outputs(model, inputs)[0], expected, rtol=1e-4, atol=1e-4)


def test_onnx_model_is_frozen_preprocessed_and_matches_onnxruntime(tmp_path):
    model = conv_model(tmp_path / "conv.onnx")
    inputs = reference_inputs(model)
    np.testing.assert_allclose(
        run(load_model(model), model, inputs), reference_outputs(model, inputs)[0], rtol=1e-4, atol=1e-5
    )


def test_unsupported_onnx_operator_is_named(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("DFT", ["r"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    path = tmp_path / "dft.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(TuneError, match=r"model 'odd'.*DFT"):
        load_model(Model("odd", (ModelInput("x", (1, 8, 2)),), onnx=path))
