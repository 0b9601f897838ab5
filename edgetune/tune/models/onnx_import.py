"""ONNX import: freeze the inventory's input shapes, let onnxruntime fold the shape arithmetic,
check the result against the original, then import with TVM's Relax ONNX frontend.

Real exported models compute shapes inside the graph, which TVM's frontend often cannot import
("Reshape requires the input new shape to be Shape"). Freezing the input dims and saving the
graph through onnxruntime's basic optimizer (standard-ONNX-only constant folding) fixes that,
and also folds batch norms into convolutions (TVM_NOTES 'Real ONNX models').
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import tvm
from tvm.relax.frontend.onnx import from_onnx

from edgetune.errors import TuneError
from edgetune.inventory.schema import Model

PREPROCESS_RTOL = 1e-4
PREPROCESS_ATOL = 1e-5


def load_onnx(model: Model) -> tvm.IRModule:
    """The ONNX model at the inventory's shapes as a Relax module with weights bound."""
    original = _read(model)
    preprocessed = preprocess(model, original)
    _check_preprocessed(model, original, preprocessed)
    _check_supported(model, preprocessed)
    shapes = {inp.name: list(inp.shape) for inp in model.inputs}
    dtypes = {inp.name: inp.dtype for inp in model.inputs}
    try:
        return from_onnx(preprocessed, shape_dict=shapes, dtype_dict=dtypes, keep_params_in_input=False)
    except Exception as err:  # the frontend raises many kinds; all mean "cannot import"
        raise TuneError(f"model {model.name!r} ({model.onnx}): TVM's ONNX frontend failed: {err}") from err


def preprocess(model: Model, original: onnx.ModelProto) -> onnx.ModelProto:
    """Freeze input dims, fold constants with onnxruntime ORT_ENABLE_BASIC, infer shapes."""
    frozen = _freeze_inputs(model, original)
    with tempfile.TemporaryDirectory(prefix="edgetune-onnx-") as tmp:
        optimized = Path(tmp) / "basic.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(optimized)
        try:
            ort.InferenceSession(frozen.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception as err:  # onnxruntime raises its own Fail/InvalidArgument types
            raise TuneError(f"model {model.name!r}: onnxruntime cannot load {model.onnx}: {err}") from err
        folded = onnx.load(str(optimized))
    return onnx.shape_inference.infer_shapes(folded)


def onnx_reference_outputs(model: Model, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The original ONNX model's outputs on `inputs`, computed by onnxruntime."""
    return _run_ort(_read(model), inputs)


def _read(model: Model) -> onnx.ModelProto:
    try:
        return onnx.load(str(model.onnx))
    except Exception as err:  # OSError, protobuf DecodeError
        raise TuneError(f"model {model.name!r}: cannot read ONNX file {model.onnx}: {err}") from err


def _freeze_inputs(model: Model, proto: onnx.ModelProto) -> onnx.ModelProto:
    frozen = onnx.ModelProto()
    frozen.CopyFrom(proto)
    graph_inputs = {i.name: i for i in frozen.graph.input}
    for inp in model.inputs:
        if inp.name not in graph_inputs:
            raise TuneError(
                f"model {model.name!r}: input {inp.name!r} is not in {model.onnx} "
                f"(its inputs: {', '.join(graph_inputs)}); fix `inputs` in fleet.yaml"
            )
        dims = graph_inputs[inp.name].type.tensor_type.shape.dim
        if len(dims) != len(inp.shape):
            raise TuneError(
                f"model {model.name!r}: input {inp.name!r} has rank {len(dims)} in {model.onnx}, "
                f"but fleet.yaml gives shape {list(inp.shape)}"
            )
        for dim, size in zip(dims, inp.shape):
            dim.ClearField("dim_param")
            dim.dim_value = size
    return frozen


def _check_preprocessed(model: Model, original: onnx.ModelProto, preprocessed: onnx.ModelProto) -> None:
    from edgetune.tune.models import reference_inputs  # the one definition of the fixed input

    inputs = reference_inputs(model)
    for expected, got in zip(_run_ort(original, inputs), _run_ort(preprocessed, inputs)):
        if not np.allclose(expected, got, rtol=PREPROCESS_RTOL, atol=PREPROCESS_ATOL):
            raise TuneError(
                f"model {model.name!r}: onnxruntime's constant folding changed the outputs "
                f"(max abs diff {np.max(np.abs(expected - got)):.3g}); report this model"
            )


def _check_supported(model: Model, proto: onnx.ModelProto) -> None:
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    supported = _get_convert_map()
    missing = sorted({node.op_type for node in proto.graph.node if node.op_type not in supported})
    if missing:
        raise TuneError(
            f"model {model.name!r} ({model.onnx}): TVM's ONNX frontend does not support the "
            f"operator(s) {', '.join(missing)}; replace them in the exported model"
        )


def _run_ort(proto: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    try:
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, inputs)
    except Exception as err:  # onnxruntime raises its own Fail/InvalidArgument types
        raise TuneError(f"onnxruntime cannot run the model: {err}") from err
