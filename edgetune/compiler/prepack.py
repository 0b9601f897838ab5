"""Which weights MetaSchedule may pre-pack.

`relax.transform.AttachAttrLayoutFreeBuffers` marks every constant weight of a kernel
layout-free, and MetaSchedule's RewriteLayout postproc then stores it in the order the tuned
schedule reads it (pre-packed at build time). When a kernel first copies a weight into another
order, an element-wise block feeding its reduction (the `kernel_transform` of every transposed
convolution: IOHW read as OIHW and flipped), TVM 0.27's RewriteLayout applies the index map it
derived for that block's output to the weight itself. The pre-packed weight is then wrong, and
so is the kernel's output: ppocr-det's last transposed convolution, tuned, differed from the
unscheduled kernel in 97 % of its outputs, by up to 1 after its sigmoid. Such weights are taken
out of `layout_free_buffers` and read as they are; kernels that read their weights directly
keep the attribute unchanged (and with it their tuning records).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir

from edgetune.compiler.schedule_rules.common import has_reduction, top_blocks

LAYOUT_FREE = "layout_free_buffers"


def drop_reordered_layout_free_weights(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every weight that a kernel reorders before its reduction reads it taken out
    of that kernel's layout-free buffers; other kernels are left as they are."""
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
