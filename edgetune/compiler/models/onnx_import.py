"""ONNX import: bake fixed inputs in, freeze the inventory's input shapes, let onnxruntime fold
the shape arithmetic, check the result against the original, then import with TVM's Relax ONNX
frontend. `group_dequantized_weights`, a pass of the import pipeline, keeps int8 weights int8
(each dequantize of a constant grouped with the matmul or convolution it feeds). Every error
names the model, and where it is about an input, the input and its values. docs/compiler.md
says why each step is there.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import tvm
from onnx import numpy_helper
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard
from tvm.relax.frontend.onnx import from_onnx
from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

from edgetune.compiler.models.onnx_inputs import graph_inputs, input_mismatches
from edgetune.compiler.models.reference_values import (
    reference_inputs,
    values_description,
)
from edgetune.errors import EdgetuneError, TuneError
from edgetune.inventory.schema import Model

PREPROCESS_RTOL = 1e-4
PREPROCESS_ATOL = 1e-5
WEIGHT_CONSUMERS = ("matmul", "nn.conv1d", "nn.conv2d", "nn.conv3d")
# The reference runs the graph as it is defined: onnxruntime's basic level only folds constants
# and removes redundant nodes; its extended level fuses quantize/dequantize groups into int8
# kernels that round differently (`onnx_rounding_spread`).
DEFINITION_LEVEL = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
QUANTIZATION_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


def load_onnx(model: Model) -> tvm.IRModule:
    """The ONNX model at the inventory's shapes as a Relax module with weights bound; its
    `main` takes the fed (not fixed) inputs in inventory order."""
    original = _read(model)
    preprocessed = preprocess(model, original)
    _check_preprocessed(model, original, preprocessed)
    _check_supported(model, preprocessed)
    shapes = {inp.name: list(inp.shape) for inp in model.fed_inputs}
    dtypes = {inp.name: inp.dtype for inp in model.fed_inputs}
    try:
        return from_onnx(preprocessed, shape_dict=shapes, dtype_dict=dtypes, keep_params_in_input=False)
    except Exception as err:  # the frontend raises many kinds; all mean "cannot import"
        raise TuneError(f"model {model.name!r} ({model.onnx}): TVM's ONNX frontend failed: {error_line(err)}") from err


def error_line(err: BaseException) -> str:
    """A library's error as one line: its message's lines joined (TVM's and onnxruntime's
    messages span several, and a YAML comment or a log line holds one); where the message
    carries a traceback, its last line alone (the error itself). The type's name leads where
    the message does not say what failed (`InternalError: Check failed: ... Divide by zero`)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if any(line.startswith("Traceback") for line in lines):
        lines = lines[-1:]
    text = " ".join(lines) or "no message"
    return text if isinstance(err, EdgetuneError) else f"{type(err).__name__}: {text}"


def preprocess(model: Model, original: onnx.ModelProto) -> onnx.ModelProto:
    """Bake fixed inputs, freeze input dims, fold constants with onnxruntime ORT_ENABLE_BASIC,
    infer shapes."""
    frozen = _freeze_inputs(model, original)
    with tempfile.TemporaryDirectory(prefix="edgetune-onnx-") as tmp:
        optimized = Path(tmp) / "basic.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(optimized)
        try:
            ort.InferenceSession(frozen.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception as err:  # onnxruntime raises its own Fail/InvalidArgument types
            declared = ", ".join(
                f"{i.name}{list(i.shape)}:{i.dtype}" + ("=fixed" if i.fixed else "") for i in model.inputs
            )
            raise TuneError(
                f"model {model.name!r}: onnxruntime cannot load {model.onnx} at the declared inputs ({declared}): {err}"
            ) from err
        folded = onnx.load(str(optimized))
    return onnx.shape_inference.infer_shapes(folded)


def onnx_reference_outputs(model: Model, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The original ONNX model's outputs on `inputs` (every declared input), by onnxruntime
    running the graph as it is defined (`DEFINITION_LEVEL`)."""
    return _run_ort(model, _read(model), inputs)


def onnx_rounding_spread(model: Model, inputs: dict[str, np.ndarray]) -> float:
    """How far two correct executions of the model may differ on `inputs`: 0 for float graphs;
    for quantized ones (QuantizeLinear / DequantizeLinear), the largest difference between
    onnxruntime's fused int8 kernels (`ORT_ENABLE_ALL`: QLinearConv, QLinearSoftmax, ...) and
    the graph as defined. Both are right: a quantize step rounds, and a value near a rounding
    tie lands on either side depending on how the sum before it was computed (YOLOv8n int8:
    15 of 320 on one input)."""
    original = _read(model)
    if not QUANTIZATION_OPS & _op_types(original.graph):
        return 0.0
    defined = _run_ort(model, original, inputs)
    fused = _run_ort(model, original, inputs, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    return max(float(np.max(np.abs(a.astype(np.float64) - b), initial=0.0)) for a, b in zip(fused, defined))


@tvm.transform.module_pass(opt_level=0, name="GroupDequantizedWeights")
def group_dequantized_weights(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """The import pipeline's pass for `quantized_weights: keep`: each `dequantize(constant)`
    (transposed or not) with the matmul or convolution it feeds, as one function taking the int8
    constant as an argument: one kernel after fusion."""
    weight = is_op("relax.dequantize")(is_const(), is_const(), is_const())
    weight = weight | is_op("relax.permute_dims")(weight)
    patterns = [(f"dequantize_{op}", is_op(f"relax.{op}")(wildcard(), weight)) for op in WEIGHT_CONSUMERS]
    grouped = relax.transform.FuseOpsByPattern(patterns, bind_constants=False, annotate_codegen=False)(mod)
    # Unchanged models stay the very module they were (the pass renumbers variables), so their
    # artifacts' source digest, and with it "unchanged" rebuilds, stay as they were.
    return grouped if len(grouped.functions) > len(mod.functions) else mod


def _read(model: Model) -> onnx.ModelProto:
    try:
        return onnx.load(str(model.onnx))
    except Exception as err:  # OSError, protobuf DecodeError
        raise TuneError(f"model {model.name!r}: cannot read ONNX file {model.onnx}: {err}") from err


def _freeze_inputs(model: Model, proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `proto` with fixed inputs turned into constants and the others' dims set."""
    problems = input_mismatches(model, graph_inputs(proto))
    if problems:
        raise TuneError(f"model {model.name!r} ({model.onnx}): {'; '.join(problems)}; fix `inputs` in fleet.yaml")
    frozen = onnx.ModelProto()
    frozen.CopyFrom(proto)
    graph_inputs_by_name = {i.name: i for i in frozen.graph.input}
    fixed = {inp.name: inp for inp in model.inputs if inp.fixed}
    for inp in model.fed_inputs:
        dims = graph_inputs_by_name[inp.name].type.tensor_type.shape.dim
        for dim, size in zip(dims, inp.shape):
            dim.ClearField("dim_param")
            dim.dim_value = size
    kept = [i for i in frozen.graph.input if i.name not in fixed]
    kept_weights = [w for w in frozen.graph.initializer if w.name not in fixed]
    del frozen.graph.input[:], frozen.graph.initializer[:]
    frozen.graph.input.extend(kept)
    frozen.graph.initializer.extend(kept_weights)
    frozen.graph.initializer.extend(
        numpy_helper.from_array(np.full(inp.shape, inp.values.value, dtype=inp.dtype), inp.name)
        for inp in fixed.values()
    )
    return frozen


def _check_preprocessed(model: Model, original: onnx.ModelProto, preprocessed: onnx.ModelProto) -> None:
    inputs = reference_inputs(model)
    fed = {inp.name: inputs[inp.name] for inp in model.fed_inputs}
    outputs = _run_ort(model, original, inputs)
    if not _finite(outputs):
        _refuse_non_finite(model, original, inputs)
    for expected, got in zip(outputs, _run_ort(model, preprocessed, fed)):
        if not np.allclose(expected, got, rtol=PREPROCESS_RTOL, atol=PREPROCESS_ATOL):
            raise TuneError(
                f"model {model.name!r}: onnxruntime's constant folding changed the outputs "
                f"(max abs diff {np.max(np.abs(expected - got)):.3g}); report this model"
            )


def _check_supported(model: Model, proto: onnx.ModelProto) -> None:
    """Ask TVM's frontend about every operator of the graph and of its subgraphs (If branches)."""
    missing = sorted(op for op in _op_types(proto.graph) if not _frontend_converts(op))
    if missing:
        raise TuneError(
            f"model {model.name!r} ({model.onnx}): TVM's ONNX frontend does not support the "
            f"operator(s) {', '.join(missing)}; replace them in the exported model"
        )


def _op_types(graph: onnx.GraphProto) -> set[str]:
    ops = set()
    for node in graph.node:
        ops.add(node.op_type)
        for attribute in node.attribute:
            for subgraph in [attribute.g] if attribute.HasField("g") else attribute.graphs:
                ops |= _op_types(subgraph)
    return ops


def _frontend_converts(op_type: str) -> bool:
    """The frontend's own check (its convert map and the operators it handles itself, such
    as If), asked about one operator."""
    importer = ONNXGraphImporter(shape_dict={}, dtype_dict={})
    try:
        importer._check_for_unsupported_ops(SimpleNamespace(node=[SimpleNamespace(op_type=op_type)]))
    except tvm.error.OpNotImplemented:
        return False
    return True


def _finite(outputs: list[np.ndarray]) -> bool:
    return all(np.all(np.isfinite(out)) for out in outputs if out.dtype.kind == "f")


def _refuse_non_finite(model: Model, proto: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> None:
    """A model whose output on the reference input holds NaN or inf has nothing to check a
    build against; name the inputs whose values cause it (finite with zeros there), as an
    attention mask fed 0-7 does where the model expects 0 or 1."""
    culprits = [
        inp.name
        for inp in model.fed_inputs
        if _finite(_run_ort(model, proto, {**inputs, inp.name: np.zeros_like(inputs[inp.name])}))
    ]
    cause = (
        f"{_value_causes(model, culprits)}: the outputs are finite with zeros there"
        if culprits
        else "no single input's values cause it (zeroing each one does not help)"
    )
    raise TuneError(f"model {model.name!r}: its outputs on the reference input are not finite (NaN or inf); {cause}")


def _run_ort(
    model: Model,
    proto: onnx.ModelProto,
    inputs: dict[str, np.ndarray],
    level: ort.GraphOptimizationLevel = DEFINITION_LEVEL,
) -> list[np.ndarray]:
    """The outputs of `proto` on `inputs` (one thread); a failure names the model and, when the
    model runs once one input's values are zeroed, that input and the values it got."""
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.intra_op_num_threads = 1
    try:
        session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own Fail/InvalidArgument types
        raise TuneError(f"model {model.name!r}: onnxruntime cannot load {model.onnx}: {err}") from err
    fed = {name: inputs[name] for name in (i.name for i in session.get_inputs())}
    try:
        return session.run(None, fed)
    except Exception as err:  # onnxruntime raises its own Fail/InvalidArgument types
        culprits = [name for name in fed if _runs_with_zeros(session, fed, name)]
        raise TuneError(f"model {model.name!r}: {_run_failure(model, culprits, err)}") from err


def _runs_with_zeros(session: ort.InferenceSession, inputs: dict[str, np.ndarray], name: str) -> bool:
    try:
        session.run(None, {**inputs, name: np.zeros_like(inputs[name])})
    except Exception:  # noqa: BLE001 - any failure means "not this input alone"
        return False
    return True


def _run_failure(model: Model, culprits: list[str], err: Exception) -> str:
    if not culprits:
        return f"onnxruntime cannot run {model.onnx} on the reference input ({err})"
    return f"{_value_causes(model, culprits)}: onnxruntime fails on them and runs with zeros there ({err})"


def _value_causes(model: Model, culprits: list[str]) -> str:
    """'input 'X' got random values 0-7; declare its range (...)', for each culprit."""
    declared = {inp.name: inp for inp in model.inputs}
    return "; ".join(
        f"input '{name}' got {values_description(model, declared[name])}; "
        + (
            "fix its values in that file"
            if model.reference_input is not None
            else "declare its range (values: {range: [low, high]})"
        )
        for name in culprits
    )
