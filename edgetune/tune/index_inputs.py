"""Arguments in range for kernels that index with a runtime input (gather/take, embedding
lookups, scatter).

MetaSchedule's runner fills every argument of a candidate with random values. An integer input
that a kernel uses as an index (`A[ids[i], j]`) then points anywhere in memory, and the
candidate segfaults the board's session instead of being measured. Here each task's PrimFunc
says which integer inputs index which buffer axis; the runner's `f_alloc_argument`
(`InRangeArguments`) fills those with values in [0, that axis's extent), and every other input
at random, as MetaSchedule does.

An input whose bound cannot be read off (it indexes through an intermediate buffer, or inside an
arithmetic expression) is filled with zeros, which every index range contains: such a task is
measured too, never skipped.

The runner only sees each candidate's argument shapes and dtypes, so the bounds are keyed by
that signature; tasks that share a signature get the tighter bound of each argument.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import ir, tirx
from tvm.s_tir import meta_schedule as ms

ZEROS = 1  # a bound of 1: every value is 0

# per argument: the exclusive upper bound of its values, or None for a random fill
IndexBounds = tuple[int | None, ...]


def index_bounds(func: tirx.PrimFunc) -> IndexBounds:
    """Per parameter of `func`: the extent of the axis it indexes, ZEROS if it indexes but its
    bound cannot be read off, None if it is not used as an index."""
    params = {buffer: n for n, buffer in enumerate(func.params)}
    derived = _derived_from(func, params)
    bounds: list[int | None] = [None] * len(func.params)

    def tighten(param: int, bound: int) -> None:
        bounds[param] = bound if bounds[param] is None else min(bounds[param], bound)

    for buffer, axis, index in _buffer_indices(func):
        extent = buffer.shape[axis]
        direct = _loaded_buffer(index)
        for loaded in _loaded_buffers(index):
            for param in derived.get(loaded, ()):
                exact = loaded.same_as(direct) and loaded in params and isinstance(extent, tirx.IntImm)
                tighten(param, int(extent) if exact else ZEROS)
    return tuple(bounds)


def index_notes(func: tirx.PrimFunc) -> list[str]:
    """How each input `func` indexes with is measured, one line each (for the run's log)."""
    return [
        f"input {param.name} indexes with its values: measured with "
        + ("zeros (its bound cannot be read off)" if bound == ZEROS else f"values in [0, {bound})")
        for param, bound in zip(func.params, index_bounds(func))
        if bound is not None
    ]


def _nodes(root, kind: type) -> list:
    """Every node of type `kind` under `root` (TVM's structural walk, in post-order)."""
    found = []
    tvm_ffi.structural_walk(root, lambda node: found.append(node) if isinstance(node, kind) else None)
    return found


def _buffer_indices(func: tirx.PrimFunc) -> list[tuple[tirx.Var, int, tirx.PrimExpr]]:
    """(buffer, axis, index expression) of every buffer load and store in `func`."""
    return [
        (_accessed(node), axis, index)
        for node in _nodes(func.body, (ir.TensorLoad, tirx.BufferStore))
        for axis, index in enumerate(node.indices)
    ]


def _accessed(node) -> tirx.Var:
    """The buffer a load reads or a store writes."""
    return node.source if isinstance(node, ir.TensorLoad) else node.buffer


def _loaded_buffers(expr) -> list[tirx.Var]:
    return [load.source for load in _nodes(expr, ir.TensorLoad)]


def _loaded_buffer(index) -> tirx.Var | None:
    """The buffer whose element is the whole index (casts aside), or None."""
    while isinstance(index, tirx.Cast):
        index = index.value
    return index.source if isinstance(index, ir.TensorLoad) else None


def _derived_from(func: tirx.PrimFunc, params: Mapping[tirx.Var, int]) -> dict[tirx.Var, set[int]]:
    """For every buffer, the integer parameters its values are computed from (a parameter is
    computed from itself), following stores into intermediate buffers until nothing changes."""
    derived = {buffer: {n} for buffer, n in params.items() if "int" in str(buffer.dtype)}
    stores = _nodes(func.body, tirx.BufferStore)
    changed = True
    while changed:
        changed = False
        for store in stores:
            sources = set().union(*(derived.get(b, set()) for b in _loaded_buffers(store.value)))
            if not sources <= derived.get(store.buffer, set()):
                derived[store.buffer] = derived.get(store.buffer, set()) | sources
                changed = True
    return derived


def signature(args_info: Iterable) -> str:
    """The key of a candidate's arguments: their MetaSchedule JSON (kind, dtype, shape)."""
    return json.dumps([list(arg) for arg in args_info])


def class_index_bounds(funcs: Iterable[tirx.PrimFunc]) -> dict[str, IndexBounds]:
    """The bounds of every task that indexes with an input, by argument signature."""
    merged: dict[str, IndexBounds] = {}
    for func in funcs:
        bounds = index_bounds(func)
        if all(b is None for b in bounds):
            continue
        key = signature(arg.as_json() for arg in ms.arg_info.ArgInfo.from_prim_func(func))
        merged[key] = _tighter(merged[key], bounds) if key in merged else bounds
    return merged


def _tighter(a: IndexBounds, b: IndexBounds) -> IndexBounds:
    return tuple(y if x is None else x if y is None else min(x, y) for x, y in zip(a, b))


@dataclass(frozen=True)
class InRangeArguments:
    """The RPCRunner's `f_alloc_argument`: MetaSchedule's random fill, except that an input a
    kernel indexes with gets values below its bound (`index_bounds`)."""

    bounds: Mapping[str, IndexBounds]  # argument signature -> per-argument bound
    seed: int = 0

    def __call__(self, session, device, args_info: Sequence, alloc_repeat: int) -> list[list[tvm.runtime.Tensor]]:
        random_fill = session.get_function("tvm.contrib.random.random_fill_for_measure")
        bounds = self.bounds.get(signature(args_info), (None,) * len(args_info))
        rng = np.random.default_rng(self.seed)
        return [
            [
                self._allocate(device, dtype, shape, bound, random_fill, rng)
                for (_kind, dtype, shape), bound in zip(args_info, bounds)
            ]
            for _ in range(alloc_repeat)
        ]

    @staticmethod
    def _allocate(device, dtype: str, shape: list[int], bound: int | None, random_fill, rng) -> tvm.runtime.Tensor:
        tensor = tvm.runtime.empty(shape, dtype=dtype, device=device)
        if bound is None:
            random_fill(tensor)
        else:
            tensor.copyfrom(rng.integers(0, bound, size=shape).astype(dtype))
        return tensor
