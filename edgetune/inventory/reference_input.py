"""A model's reference input file (`.npz`) checked against the inputs the inventory declares.

The file holds one array per input fed at run time (named as the input), of the declared shape
and dtype, with values the declaration allows; a fixed input may be left out (its value is
known), and if present must hold that value. Array headers are read before any data, so a
mismatched or oversized member is refused without loading it.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from edgetune.inventory.reader import Node
from edgetune.inventory.schema import FixedValue, ModelInput, ValueRange


def check_reference_input(node: Node, path: Path, inputs: tuple[ModelInput, ...]) -> None:
    """Raise InventoryError at `node` unless the file at `path` fits `inputs`."""
    headers = _array_headers(node, path)
    declared = {i.name: i for i in inputs}
    extra = sorted(set(headers) - set(declared))
    if extra:
        raise node.error(f"holds arrays {', '.join(extra)} that are not declared inputs (declared: {', '.join(declared)})")
    missing = [i.name for i in inputs if i.name not in headers and not i.fixed]
    if missing:
        raise node.error(f"has no array for input(s) {', '.join(missing)} (it holds: {', '.join(headers) or 'nothing'})")
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
        raise node.error(f"array '{name}' must hold the input's fixed value {inp.values.value} everywhere, got {low} to {high}")
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
                    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
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
