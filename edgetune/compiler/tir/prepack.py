"""Which weights MetaSchedule may pre-pack.

`drop_reordered_layout_free_weights`, a pass of the `prepare` pipeline, takes a weight out of
its kernel's `layout_free_buffers` when the kernel copies it into another order before its
reduction reads it, because TVM 0.27's RewriteLayout pre-packs such a weight wrongly
(docs/compiler.md); kernels that read their weights directly keep the attribute.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir

from edgetune.compiler.tir.common import has_reduction, top_blocks

LAYOUT_FREE = "layout_free_buffers"


@tvm.transform.module_pass(opt_level=0, name="DropReorderedLayoutFreeWeights")
def drop_reordered_layout_free_weights(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """The pass that takes every weight a kernel reorders before its reduction reads it out of
    that kernel's layout-free buffers; other kernels are left as they are."""
    updated = mod
    for global_var, func in mod.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc) or func.attrs is None or LAYOUT_FREE not in func.attrs:
            continue
        layout_free = [int(i) for i in func.attrs[LAYOUT_FREE]]
        reordered = _reordered_before_reduction(func, layout_free)
        if not reordered:
            continue
        kept = [i for i in layout_free if i not in reordered]
        func = func.with_attr(LAYOUT_FREE, kept) if kept else func.without_attr(LAYOUT_FREE)
        if updated is mod:
            updated = mod.clone()
        updated[global_var] = func
    return updated


def _reordered_before_reduction(func: tvm.tirx.PrimFunc, layout_free: list[int]) -> set[int]:
    """The layout-free parameters that a spatial block reads at other indices than it writes,
    into a buffer that a reduction block reads."""
    if not isinstance(func.body, s_tir.SBlockRealize):
        return set()
    sch = s_tir.Schedule(func)
    blocks = top_blocks(sch)
    spatial = [sch.get(rv) for rv in blocks if not has_reduction(sch, rv)]
    reduced = [region.source for rv in blocks if has_reduction(sch, rv) for region in sch.get(rv).reads]
    found = set()
    for block in spatial:
        if len(block.writes) != 1 or not any(block.writes[0].source.same_as(buffer) for buffer in reduced):
            continue
        written = [r.min for r in block.writes[0].region]
        for region in block.reads:
            index = next((i for i in layout_free if region.source.same_as(func.params[i])), None)
            if index is not None and not tvm_ffi.structural_equal([r.min for r in region.region], written):
                found.add(index)
    return found
