"""The reference input of a model: the values every later step (import check, artifact
check, regression) feeds it, the same on every machine.

Per input, in this order: the inventory's `reference_input` file; the input's declared values
(`fixed`, or uniform in `range`); else a default seeded by the model and input names (uniform
in [-1, 1) for floats, 0-7 for integers). `values_description` says which, for error messages.
"""

from __future__ import annotations

import hashlib

import numpy as np

from edgetune.inventory.schema import FixedValue, Model, ModelInput, ValueRange

DEFAULT_INTEGERS = (0, 7)  # inclusive
DEFAULT_FLOATS = (-1.0, 1.0)


def reference_inputs(model: Model) -> dict[str, np.ndarray]:
    """One array per declared input (fixed inputs included), keyed by input name."""
    from_file = _read_npz(model) if model.reference_input is not None else {}
    return {inp.name: from_file[inp.name] if inp.name in from_file else _generated(model, inp) for inp in model.inputs}


def values_description(model: Model, inp: ModelInput) -> str:
    """Where the input's reference values came from, e.g. 'random values 0-7'."""
    if model.reference_input is not None and not inp.fixed:
        return f"the values of {model.reference_input}"
    if isinstance(inp.values, FixedValue):
        return f"its fixed value {inp.values.value}"
    if isinstance(inp.values, ValueRange):
        return f"random values in its declared range [{inp.values.low}, {inp.values.high}]"
    if _is_integer(inp):
        return f"random values {DEFAULT_INTEGERS[0]}-{DEFAULT_INTEGERS[1]}"
    return f"random values in [{DEFAULT_FLOATS[0]:g}, {DEFAULT_FLOATS[1]:g})"


def _generated(model: Model, inp: ModelInput) -> np.ndarray:
    if isinstance(inp.values, FixedValue):
        return np.full(inp.shape, inp.values.value, dtype=inp.dtype)
    low, high = (
        (inp.values.low, inp.values.high)
        if isinstance(inp.values, ValueRange)
        else (DEFAULT_INTEGERS if _is_integer(inp) else DEFAULT_FLOATS)
    )
    seed = int.from_bytes(hashlib.sha256(f"{model.name}/{inp.name}".encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    if _is_integer(inp):
        return rng.integers(low, high, size=inp.shape, endpoint=True).astype(inp.dtype)
    return rng.uniform(low, high, size=inp.shape).astype(inp.dtype)


def _is_integer(inp: ModelInput) -> bool:
    return np.issubdtype(np.dtype(inp.dtype), np.integer)


def _read_npz(model: Model) -> dict[str, np.ndarray]:
    """The file's arrays (the loader has checked them against the declared inputs)."""
    with np.load(model.reference_input, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}
