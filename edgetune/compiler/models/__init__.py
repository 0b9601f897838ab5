"""The models of the inventory as Relax modules with bound weights, and their reference I/O.

`load_model` is the one entry point for tuning and building: the frontend's module through
`import_pipeline`, the named passes of edgetune's import-time rewrites (`import_model` also says
which layout `layout: auto` chose and why, `model_layouts` only that); `reference_inputs` makes the
input every later step (artifact check, regression) feeds (`reference_values`), and `reference_outputs`
computes what the model must answer to it: onnxruntime for ONNX models, and for built-in
models an untuned host build of the unoptimized module (plain loops, no tuning involved);
`rounding_spread` says how far a correct answer may lie from it (quantized models only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from edgetune.artifact_format.manifest import Interface, TensorSpec
from edgetune.compiler.models.builtin import load_builtin
from edgetune.compiler.models.onnx_import import (
    group_dequantized_weights,
    load_onnx,
    onnx_reference_outputs,
    onnx_rounding_spread,
)
from edgetune.compiler.models.reference_values import reference_inputs
from edgetune.compiler.relax.integer import (
    byte_tables,
    element_wise_quantization,
    integer_convolutions,
    quantized_moves,
)
from edgetune.compiler.relax.layout import LayoutChoice, choose_layout, convert_model_layout
from edgetune.errors import TuneError
from edgetune.inventory.schema import QUANTIZED_WEIGHTS, Model

__all__ = [
    "ImportedModel",
    "entry_function",
    "import_model",
    "import_pipeline",
    "load_model",
    "model_interface",
    "model_layouts",
    "reference_inputs",
    "reference_outputs",
    "rounding_spread",
]


IMPORT_PIPELINE = "ImportPipeline"


@dataclass(frozen=True)
class ImportedModel:
    mod: tvm.IRModule
    layout: LayoutChoice  # the layout `mod`'s convolutions are in, and why


def load_model(model: Model) -> tvm.IRModule:
    """The model as a Relax IRModule (function `main` for ONNX, `forward` for built-ins),
    weights bound as constants, convolutions in the model's layout (`import_model`). Raises
    TuneError naming the model when it cannot be imported."""
    return import_model(model).mod


def import_model(model: Model) -> ImportedModel:
    """The model as `load_model` returns it, with its layout: fleet.yaml's, or for `auto` the
    one `choose_layout` reads from the imported graph (the same for every import of the same
    model, so tuning and building compile the same kernels)."""
    source = _import_source(model)
    layout = choose_layout(model, lambda: source)
    return ImportedModel(import_pipeline(layout.layout, model.quantized_weights)(source), layout)


def import_pipeline(layout: str, quantized_weights: str) -> tvm.transform.Sequential:
    """The rewrites from a model as its frontend imports it to the module `load_model` gives, as
    one `tvm.transform.Sequential` of named module passes: for `quantized_weights` "keep", the
    dequantized constant weights grouped with their consumers; for "integer", quantized moves
    and the activations' quantization as element-wise operators; the convolutions converted to
    `layout` (NCHW or NHWC); for "integer", then the integer convolutions and byte tables."""
    if quantized_weights not in QUANTIZED_WEIGHTS:
        raise ValueError(
            f"import_pipeline: quantized_weights {quantized_weights!r} is not one of {', '.join(QUANTIZED_WEIGHTS)}"
        )
    integer = quantized_weights == "integer"
    steps = [
        *([group_dequantized_weights] if quantized_weights == "keep" else []),
        *([quantized_moves, element_wise_quantization] if integer else []),
        convert_model_layout(layout),
        *([integer_convolutions, byte_tables] if integer else []),
    ]
    return tvm.transform.Sequential(steps, name=IMPORT_PIPELINE)


def model_layouts(models: Sequence[Model]) -> dict[str, LayoutChoice]:
    """Each model's layout and why (what `edgetune plan` and `tune --dry-run` print), by name;
    a model is imported only when its layout is read from its graph."""
    return {model.name: choose_layout(model, lambda model=model: _import_source(model)) for model in models}


def _import_source(model: Model) -> tvm.IRModule:
    return load_onnx(model) if model.onnx is not None else load_builtin(model)


def entry_function(mod: tvm.IRModule) -> str:
    """The name of the module's single public Relax function (private ones are its parts)."""
    names = [
        gv.name_hint
        for gv, func in mod.functions.items()
        if isinstance(func, relax.Function) and "global_symbol" in (func.attrs or {})
    ]
    return names[0]


def model_interface(mod: tvm.IRModule, input_names: Sequence[str]) -> Interface:
    """What the module's entry function takes and answers, from its signature: its parameters
    (named `input_names`, in call order) and its results (`output0`, ... in return order), each
    with its shape (a free dimension by its name) and dtype."""
    func = mod[entry_function(mod)]
    if len(func.params) != len(input_names):
        raise TuneError(
            f"the model's entry function takes {len(func.params)} inputs, "
            f"{len(input_names)} are declared: {', '.join(input_names)}"
        )
    returned = func.ret_ty
    results = list(returned.fields) if isinstance(returned, relax.TupleType) else [returned]
    return Interface(
        inputs=tuple(_tensor_spec(name, p.ty) for name, p in zip(input_names, func.params)),
        outputs=tuple(_tensor_spec(f"output{i}", info) for i, info in enumerate(results)),
    )


def _tensor_spec(name: str, ty: relax.Type) -> TensorSpec:
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise TuneError(f"{name}: not a tensor of known shape ({ty}): edgetune's runtime takes and answers tensors")
    dims = tuple(int(d.value) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in ty.shape.values)
    return TensorSpec(name, dims, str(ty.dtype))


def reference_outputs(model: Model, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """What the model must output for `inputs` (ordered as the model inputs)."""
    if model.onnx is not None:
        return onnx_reference_outputs(model, inputs)
    mod = load_builtin(model)
    executable = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    args = [tvm.runtime.tensor(inputs[inp.name]) for inp in model.inputs]
    result = vm[entry_function(mod)](*args)
    return [r.numpy() for r in result] if isinstance(result, (list, tuple, tvm.ir.Array)) else [result.numpy()]


def rounding_spread(model: Model, inputs: dict[str, np.ndarray]) -> float:
    """How far two correct executions of the model may differ on `inputs` (0 unless the model
    is a quantized ONNX graph; `onnx_rounding_spread`)."""
    return onnx_rounding_spread(model, inputs) if model.onnx is not None else 0.0
