"""The TIR lowering every edgetune build uses: TVM's default (s_tir) pipeline, then the
micro-kernels' register tiles kept on the stack.

The schedule rules (`schedule_rules/`) accumulate a tile in a buffer of scope "local" that LLVM
keeps in registers. TVM's LowerTVMBuiltin leaves on the stack only "global" buffers smaller than
1 KB; every other CPU buffer, "local" ones included, becomes a `TVMBackendAllocWorkspace` /
`TVMBackendFreeWorkspace` pair around each tile plus a `memset` of it, and LLVM, seeing a pointer
from a call, must store the accumulators there and load them back for the epilogue. Marking
small constant-size "local" buffers `disable_lower_builtin` makes them plain stack allocations,
which LLVM promotes to registers. Measured on YOLOv8n's kernels (the tuned record, host,
interleaved): 1-3 % faster on its 3x3 and large 1x1 convolutions, 7 % on a 10x10 64->64 1x1.

Candidates built while tuning (`candidate_builder.FastBuild`) and the artifact's build
(`prepare.apply_database_and_build`) both lower with it, so what is measured is what ships.
This module is pickled by value into MetaSchedule's builder processes, as candidate_builder is.
"""

from __future__ import annotations

import sys

import cloudpickle
import tvm
import tvm_ffi

TIR_PIPELINE = "edgetune"
STACK_LIMIT_BYTES = 4096  # a register tile: at most 32 vector registers of 64 bytes, 2 KB
_DISABLE_LOWER_BUILTIN = "disable_lower_builtin"  # tvm::tirx::transform::kDisableLowerTVMBuiltin


def tir_pipeline() -> str:
    """The name of edgetune's TIR pipeline (for `tvm.tirx.build(pipeline=...)` and
    `relax.build(tir_pipeline=...)`), registered with TVM in this process."""
    from tvm.tirx.compilation_pipeline import PIPELINE_MAP, register_tir_pipeline

    if TIR_PIPELINE not in PIPELINE_MAP:
        register_tir_pipeline(TIR_PIPELINE, _pipeline)
    return TIR_PIPELINE


def _pipeline():
    from tvm.s_tir.pipeline import default_s_tir_pipeline

    lower, finalize_host, finalize_device = default_s_tir_pipeline()
    tiles_on_stack = tvm.transform.module_pass(_tiles_on_stack, opt_level=0, name="edgetune.TilesOnStack")
    return tvm.transform.Sequential([lower, tiles_on_stack]), finalize_host, finalize_device


def _tiles_on_stack(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    return tvm_ffi.structural_map(mod, [(tvm.tirx.AllocBuffer, _on_stack)])


def _on_stack(alloc: tvm.tirx.AllocBuffer) -> tvm.tirx.AllocBuffer:
    """A small constant-size "local" allocation marked to stay on the stack; others unchanged."""
    size = _constant_bytes(alloc.buffer)
    if alloc.buffer.scope() != "local" or size is None or size > STACK_LIMIT_BYTES:
        return alloc
    annotations = dict(alloc.annotations)
    annotations[_DISABLE_LOWER_BUILTIN] = tvm.tirx.IntImm("int32", 1)
    return tvm.tirx.AllocBuffer(alloc.buffer, annotations)


def _constant_bytes(buffer: tvm.tirx.Buffer) -> int | None:
    if not all(isinstance(extent, tvm.tirx.IntImm) for extent in buffer.shape):
        return None
    size = (buffer.dtype.bits * buffer.dtype.lanes + 7) // 8
    for extent in buffer.shape:
        size *= int(extent)
    return size


cloudpickle.register_pickle_by_value(sys.modules[__name__])
