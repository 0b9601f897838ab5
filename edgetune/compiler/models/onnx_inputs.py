"""The inputs of an ONNX graph, compared with what the inventory declares, and written out as
the fleet.yaml `models:` entry `edgetune import` prints.

`check_declared_inputs` runs at `edgetune check` (and before every verb that loads the
inventory): a declared input the graph does not have, of another rank or dtype, or a graph
input left undeclared is an InventoryError (exit 2) naming the model, both sides, and listing
the graph's inputs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from edgetune.errors import InventoryError
from edgetune.inventory.reader import display_path
from edgetune.inventory.schema import DTYPES, Fleet, Model

LAYOUT_HINT = (
    "the default: NHWC or NCHW chosen from the graph, `edgetune plan` says which and why; "
    'NCHW or NHWC to choose yourself, compared with `make bench BENCH_ARGS="--models ... --ablate-layout"`'
)
INTEGER_HINT = "integer input: declare the values it takes, e.g. values: {range: [0, 1]}, or a reference_input file"


@dataclass(frozen=True)
class GraphInput:
    """An input of an ONNX graph as the file states it: dims are sizes, names of dynamic
    dimensions, or None (unknown); dtype is numpy's name (None when not a tensor)."""

    name: str
    dims: tuple[int | str | None, ...] | None  # None: unknown rank
    dtype: str | None

    def describe(self) -> str:
        dims = "?" if self.dims is None else ", ".join("?" if d is None else str(d) for d in self.dims)
        return f"{self.name}: {self.dtype or 'not a tensor'}[{dims}]"

    @property
    def dynamic(self) -> list[str]:
        return [str(d) if d is not None else "?" for d in self.dims or () if not isinstance(d, int)]


def read_graph(path: Path) -> onnx.ModelProto:
    """The model's graph and weights' metadata (external weight files are not read)."""
    return onnx.load(str(path), load_external_data=False)


def graph_inputs(proto: onnx.ModelProto) -> list[GraphInput]:
    """The inputs a caller feeds (initializers listed as inputs by older exporters excluded)."""
    weights = {init.name for init in proto.graph.initializer}
    return [_graph_input(value) for value in proto.graph.input if value.name not in weights]


def _graph_input(value: onnx.ValueInfoProto) -> GraphInput:
    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type"):
        return GraphInput(value.name, None, None)
    dtype = _dtype(tensor.elem_type) if tensor.elem_type else None
    if not tensor.HasField("shape"):
        return GraphInput(value.name, None, dtype)
    return GraphInput(value.name, tuple(_dim(d) for d in tensor.shape.dim), dtype)


def _dtype(elem_type: int) -> str:
    """numpy's name of an ONNX element type (`elem_type N` for one this onnx does not know)."""
    try:
        return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)))
    except (KeyError, TypeError, ValueError):
        return f"elem_type {elem_type}"


def _dim(dim: onnx.TensorShapeProto.Dimension) -> int | str | None:
    """A size, a dynamic dimension's name, or None. Exporters such as Paddle2ONNX write a
    dynamic dimension as dim_value -1 (or 0), not as a dim_param: that is no fixed size."""
    if dim.HasField("dim_value") and dim.dim_value > 0:
        return dim.dim_value
    return " ".join(dim.dim_param.split()) or None  # one line: it is written into YAML comments


def input_mismatches(model: Model, graph: list[GraphInput]) -> list[str]:
    """What differs between the declared inputs and the graph's, one line each (empty: none)."""
    by_name = {g.name: g for g in graph}
    problems = []
    for inp in model.inputs:
        found = by_name.get(inp.name)
        if found is None:
            problems.append(f"input '{inp.name}' is declared but the graph has no input of that name")
        elif found.dims is not None and len(found.dims) != len(inp.shape):
            problems.append(
                f"input '{inp.name}' is declared with rank {len(inp.shape)} (shape {list(inp.shape)}) but has "
                f"rank {len(found.dims)} in the graph ({found.describe()})"
            )
        elif found.dtype is not None and found.dtype != inp.dtype:
            problems.append(f"input '{inp.name}' is declared {inp.dtype} but is {found.dtype} in the graph")
        elif found.dims is not None and any(isinstance(d, int) and d != s for d, s in zip(found.dims, inp.shape)):
            problems.append(
                f"input '{inp.name}' is declared with shape {list(inp.shape)} but the graph fixes it to {found.describe()}"
            )
    declared = {i.name for i in model.inputs}
    problems += [f"the graph's input '{g.name}' is not declared" for g in graph if g.name not in declared]
    return problems


def check_declared_inputs(fleet: Fleet) -> None:
    """Every ONNX model's declared inputs match its graph's; InventoryError otherwise."""
    for index, model in enumerate(fleet.models):
        if model.onnx is None:
            continue
        where = f"{display_path(fleet.path)}: models[{index}]"
        graph = graph_inputs(_read_checked(model.onnx, f"{where}.onnx"))
        problems = input_mismatches(model, graph)
        if problems:
            listed = "; ".join(g.describe() for g in graph) or "none"
            raise InventoryError(
                f"{where}.inputs: model '{model.name}' ({model.onnx}): "
                f"{'; '.join(problems)}. The graph's inputs are: {listed}"
            )


def _read_checked(path: Path, where: str) -> onnx.ModelProto:
    """The ONNX model at `path`; InventoryError at `where` when it is not one."""
    try:
        proto = read_graph(path)
    except Exception as err:  # OSError, protobuf DecodeError
        raise InventoryError(f"{where}: '{path}' is not an ONNX model ({type(err).__name__}: {err})") from None
    if not proto.graph.node:
        raise InventoryError(f"{where}: '{path}' is not an ONNX model (no graph nodes)")
    return proto


def model_entry(path: Path, name: str) -> str:
    """The fleet.yaml `models:` entry of the ONNX model at `path` (as YAML text), read from its
    graph: dynamic dimensions get size 1 and a comment saying so, integer inputs a comment
    asking for their range, inputs of a dtype edgetune cannot feed a comment naming it."""
    proto = _read_checked(path, str(path))
    lines = ["models:", f"  - name: {json.dumps(name)}", f"    onnx: {json.dumps(str(path))}"]
    if any(node.op_type == "Conv" for node in proto.graph.node):
        lines.append(f"    # layout: auto  # {LAYOUT_HINT}")
    lines.append("    inputs:")
    for inp in graph_inputs(proto):
        lines += _input_entry(inp)
    return "\n".join(lines) + "\n"


def _input_entry(inp: GraphInput) -> list[str]:
    dims = [d if isinstance(d, int) and d > 0 else 1 for d in inp.dims or ()]
    shape = f"        shape: [{', '.join(map(str, dims))}]"
    if inp.dims is None:
        shape += "  # FIX: the graph does not state this input's rank; give its shape"
    elif inp.dynamic:
        shape += f"  # FIX: dynamic dimension(s) {', '.join(inp.dynamic)} set to 1; give the sizes the boards use"
    dtype = f"        dtype: {inp.dtype}"
    if inp.dtype not in DTYPES:
        dtype += f"  # FIX: edgetune feeds {', '.join(DTYPES)} only"
    elif np.issubdtype(np.dtype(inp.dtype), np.integer):
        dtype += f"  # FIX: {INTEGER_HINT}"
    return [f"      - name: {json.dumps(inp.name)}", shape, dtype]
