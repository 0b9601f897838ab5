"""A model's inputs as fleet.yaml declares them, and its reference input file against them.

Dimensions are positive integers (fixed shapes), checked as written. The values an input takes
are `{range: [low, high]}` (drawn from for the reference input) or `{fixed: value}` (baked into
the model), numbers its dtype holds. The reference input file (`.npz`) holds one array per
input fed at run time (named as the input), of the declared shape and dtype, with values the
declaration allows; a fixed input may be left out (its value is known), and if present must
hold that value. Array headers are read before any data, so a mismatched or oversized member
is refused without loading it.
"""

from __future__ import annotations

import dataclasses
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from edgetune.inventory.reader import Node
from edgetune.inventory.schema import FixedValue, ModelInput, ValueRange

INTEGER_LIMITS = {
    "int8": (-(2**7), 2**7 - 1),
    "uint8": (0, 2**8 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
}
FLOAT_LIMITS = {"float16": 65504.0, "float32": 3.4028234663852886e38}
MAX_ELEMENTS = 2**31 - 1  # per input tensor, and per dimension


def check_dimensions(node: Node) -> None:
    """The shape at `node` as written (a name such as `batch` is no dimension)."""
    elements = 1
    for index, dim in enumerate(node.value if isinstance(node.value, list) else ()):
        if isinstance(dim, bool) or not isinstance(dim, int) or not 0 < dim <= MAX_ELEMENTS:
            raise node.child(index).error(
                f"input dimensions must be positive integers (fixed shapes), got {dim!r} (at most {MAX_ELEMENTS})"
            )
        elements *= dim
    if elements > MAX_ELEMENTS:
        raise node.error(f"holds {elements} elements, more than the {MAX_ELEMENTS} a tensor may have")


def with_values(node: Node, inputs: tuple[ModelInput, ...], may_fix: bool) -> tuple[ModelInput, ...]:
    """`inputs` (decoded from the list at `node`, their `values` withheld) with the values each
    declares; only an ONNX model (`may_fix`) may fix one, and one at least is fed at run time."""
    derived = []
    for index, given in enumerate(inputs):
        item = node.child(index)
        values = _values(item.child("values"), given.dtype)
        if isinstance(values, FixedValue) and not may_fix:
            raise item.child("values").error(
                "a fixed value is baked into an ONNX model; a builtin model takes its input at run time"
            )
        derived.append(dataclasses.replace(given, values=values))
    if all(i.fixed for i in derived):
        raise node.error("every input has a fixed value; at least one must be fed at run time")
    return tuple(derived)


def _values(node: Node, dtype: str) -> ValueRange | FixedValue | None:
    """`{range: [low, high]}` or `{fixed: value}`: numbers the dtype holds (integers for
    integer dtypes), low <= high."""
    if node.value is None:
        return None
    node.check_keys(["range", "fixed"])
    if (node.child("range").value is None) == (node.child("fixed").value is None):
        raise node.error("give exactly one of 'range: [low, high]' or 'fixed: value'")
    if node.child("range").value is None:
        return FixedValue(_value(node.child("fixed"), dtype))
    bounds = node.child("range").decode(tuple[Any, ...])
    if len(bounds) != 2:
        raise node.child("range").error(f"must be [low, high], got {list(bounds)!r}")
    low, high = (_value(node.child("range").child(i), dtype) for i in range(2))
    if low > high:
        raise node.child("range").error(f"low must not exceed high, got [{low}, {high}]")
    return ValueRange(low, high)


def _value(node: Node, dtype: str) -> float | int:
    integer = dtype in INTEGER_LIMITS
    value = node.decode(int if integer else float)
    low, high = INTEGER_LIMITS[dtype] if integer else (-FLOAT_LIMITS[dtype], FLOAT_LIMITS[dtype])
    if not low <= value <= high:
        raise node.error(f"{value} does not fit in {dtype} (from {low:g} to {high:g})")
    return value


def check_reference_input(node: Node, path: Path, inputs: tuple[ModelInput, ...]) -> None:
    """Raise InventoryError at `node` unless the file at `path` fits `inputs`."""
    headers = _array_headers(node, path)
    declared = {i.name: i for i in inputs}
    extra = sorted(set(headers) - set(declared))
    if extra:
        raise node.error(
            f"holds arrays {', '.join(extra)} that are not declared inputs (declared: {', '.join(declared)})"
        )
    missing = [i.name for i in inputs if i.name not in headers and not i.fixed]
    if missing:
        raise node.error(
            f"has no array for input(s) {', '.join(missing)} (it holds: {', '.join(headers) or 'nothing'})"
        )
    for name, (shape, dtype) in headers.items():
        inp = declared[name]
        if shape != inp.shape or dtype != np.dtype(inp.dtype):
            raise node.error(
                f"array '{name}' is {dtype}{list(shape)}, but the input is declared {inp.dtype}{list(inp.shape)}"
            )
    for name, array in _arrays(node, path, list(headers)).items():
        _check_values(node, name, array, declared[name])


def _check_values(node: Node, name: str, array: np.ndarray, inp: ModelInput) -> None:
    if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
        raise node.error(f"array '{name}' holds NaN or infinite values")
    if array.size == 0:
        return
    low, high = array.min(), array.max()

    def declared(value: float | int) -> np.ndarray:
        return np.asarray(value).astype(array.dtype)

    if isinstance(inp.values, FixedValue) and not (low == high == declared(inp.values.value)):
        raise node.error(
            f"array '{name}' must hold the input's fixed value {inp.values.value} everywhere, got {low} to {high}"
        )
    if isinstance(inp.values, ValueRange) and not declared(inp.values.low) <= low <= high <= declared(inp.values.high):
        raise node.error(
            f"array '{name}' holds values from {low} to {high}, outside the declared range [{inp.values.low}, {inp.values.high}]"
        )


def _array_headers(node: Node, path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """name -> (shape, dtype) of every `.npy` member, read from the headers only."""
    headers = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if not member.endswith(".npy"):
                    raise node.error(f"holds '{member}', which is not a .npy array; save it with numpy.savez")
                with archive.open(member) as stream:
                    version = np.lib.format.read_magic(stream)
                    read_header = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, _, dtype = read_header(stream)
                headers[member.removesuffix(".npy")] = (tuple(shape), dtype)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as err:
        raise node.error(f"'{path}' is not a numpy .npz file ({err}); save it with numpy.savez") from None
    return headers


def _arrays(node: Node, path: Path, names: list[str]) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in names}
    except (ValueError, OSError, EOFError) as err:  # object arrays need pickle: refused
        raise node.error(f"'{path}' cannot be read as plain arrays ({err})") from None
