"""The models of the inventory as Relax modules with bound weights, and their reference I/O.

`load_model` is the one entry point for tuning and building; `reference_inputs` makes the
input every later step (artifact check, regression) feeds (`reference_values`), and `reference_outputs`
computes what the model must answer to it: onnxruntime for ONNX models, and for built-in
models an untuned host build of the unoptimized module (plain loops, no tuning involved);
`rounding_spread` says how far a correct answer may lie from it (quantized models only).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from edgetune.inventory.schema import Model
from edgetune.tune.integer import integer_convolutions
from edgetune.tune.layout import convert_layout
from edgetune.tune.models.builtin import load_builtin
from edgetune.tune.models.onnx_import import load_onnx, onnx_reference_outputs, onnx_rounding_spread
from edgetune.tune.models.reference_values import reference_inputs

__all__ = ["entry_function", "load_model", "reference_inputs", "reference_outputs", "rounding_spread"]


def load_model(model: Model) -> tvm.IRModule:
    """The model as a Relax IRModule (function `main` for ONNX, `forward` for built-ins),
    weights bound as constants, convolutions in the model's `layout`. Raises TuneError naming
    the model when it cannot be imported."""
    mod = convert_layout(load_onnx(model) if model.onnx is not None else load_builtin(model), model.layout)
    return integer_convolutions(mod) if model.quantized_weights == "integer" else mod


def entry_function(mod: tvm.IRModule) -> str:
    """The name of the module's single public Relax function (private ones are its parts)."""
    names = [
        gv.name_hint
        for gv, func in mod.functions.items()
        if isinstance(func, relax.Function) and "global_symbol" in (func.attrs or {})
    ]
    return names[0]


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
