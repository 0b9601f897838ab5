"""The prepared module of a (model, target): what tuning extracts its tasks from and the build
compiles, so that tasks and records match by construction.

`edgetune_pipeline(target)` is every step of `prepare` as one `tvm.transform.Sequential` of
named module passes, so a `PassContext` (instruments, `disabled_pass`) sees each of them;
`extract_tasks` gives the tuning tasks of a prepared module (`extract_kernels` also the kernels
`prepare` scheduled itself), `apply_database_and_build` and
`build_untuned` its executables, `count_tuned_tasks` how many of its tasks a database covers.
docs/compiler.md describes the steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from edgetune.compiler.relax.channel_padding import pad_output_channels
from edgetune.compiler.relax.fast_math import legalize_fast_math
from edgetune.compiler.relax.graph import fold_constants_with_numpy
from edgetune.compiler.relax.winograd import winograd_convolutions
from edgetune.compiler.tir.common import is_scheduled
from edgetune.compiler.tir.concatenation import schedule_concatenations
from edgetune.compiler.tir.convolution import annotate_convolutions
from edgetune.compiler.tir.depthwise import annotate_depthwise
from edgetune.compiler.tir.integer import annotate_integer_convolutions
from edgetune.compiler.tir.moves import schedule_moves
from edgetune.compiler.tir.prepack import drop_reordered_layout_free_weights
from edgetune.compiler.tir.rows import schedule_row_reductions
from edgetune.compiler.tir.single_pixel import schedule_single_pixel_convolutions
from edgetune.compiler.tir.small_loops import serial_small_loops_pass

PIPELINE = "EdgetunePipeline"


@dataclass(frozen=True)
class TaskCoverage:
    """How many of a prepared module's tuning tasks have a record in a database."""

    tuned: int  # built with their record's schedule
    total: int
    missing: tuple[str, ...]  # task names without a record (they build naive, serial loops)
    kept_untuned: tuple[str, ...] = ()  # task names with a record, built unscheduled: faster so on the boards

    @property
    def complete(self) -> bool:
        return self.tuned == self.total


def edgetune_pipeline(target: tvm.target.Target) -> tvm.transform.Sequential:
    """The steps of `prepare` for `target`, in order: the Relax rewrites before fusion (Winograd,
    channel padding, constants folded with NumPy), inference-time decomposition, legalization
    with fast math, Relax's "zero" pipeline (fusion), weights marked layout-free, then on the
    fused kernels: reordered weights taken off the layout-free ones, concatenations, kernels
    that only move values, softmax-like row reductions and convolutions of one pixel
    scheduled, and NHWC convolutions (groups 1, depthwise, integer) marked for their rules. Run
    it under `with target:` (LegalizeOps reads the current target)."""
    return tvm.transform.Sequential(
        [
            winograd_convolutions(target),
            pad_output_channels(target),
            fold_constants_with_numpy,
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
            legalize_fast_math(),
            relax.get_pipeline("zero"),
            relax.transform.AttachAttrLayoutFreeBuffers(),
            drop_reordered_layout_free_weights,
            schedule_concatenations(target),
            schedule_moves(target),
            schedule_row_reductions(target),
            schedule_single_pixel_convolutions(target),
            annotate_convolutions(target),
            annotate_depthwise(target),
            annotate_integer_convolutions(target),
        ],
        name=PIPELINE,
    )


def prepare(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """`mod` (weights bound as constants) through `edgetune_pipeline(target)`."""
    with target:
        return edgetune_pipeline(target)(mod)


def extract_tasks(prepared: tvm.IRModule, target: tvm.target.Target) -> list[ms.ExtractedTask]:
    """The tuning tasks of a prepared module (one per distinct kernel), but for the kernels
    `prepare` scheduled itself (`is_scheduled`)."""
    return extract_kernels(prepared, target).searched


@dataclass(frozen=True)
class PreparedKernels:
    """A prepared module's distinct kernels: those tuning searches, and those `prepare`
    scheduled itself (never searched; their time counts in a model's estimate all the same)."""

    searched: list[ms.ExtractedTask]
    scheduled: list[ms.ExtractedTask]


def extract_kernels(prepared: tvm.IRModule, target: tvm.target.Target) -> PreparedKernels:
    """Every distinct kernel of a prepared module, as tasks, split by who schedules it."""
    split = PreparedKernels([], [])
    for kernel in ms.relax_integration.extract_tasks(prepared, target):
        (split.scheduled if is_scheduled(kernel.dispatched[0]["main"]) else split.searched).append(kernel)
    return split


def kernel_hash(kernel: tvm.IRModule) -> str:
    """A kernel's identity in a class database: the structural hash its workload line starts with."""
    return str(tvm_ffi.structural_hash(kernel))


def apply_database_and_build(
    prepared: tvm.IRModule, database: ms.Database, target: tvm.target.Target, exec_mode: str = "compiled"
) -> relax.VMExecutable:
    """The tuned executable: the database applied to the prepared module, the weight layout
    rewrites split out and folded into pre-packed constants, compiled with the VM control flow
    as native code (`exec_mode="compiled"`). Kernels with a record get their best schedule and
    pre-packed weights; kernels without one stay untuned (check `count_tuned_tasks` first).
    Export the result with `executable.export_library(path, fcompile=...)`. `exec_mode`
    "bytecode" gives the same kernels under the bytecode VM, whose calls can be instrumented."""
    applied = apply_database(prepared, database, target)
    with target, database:
        return relax.build(applied, target=target, exec_mode=exec_mode)


def apply_database(prepared: tvm.IRModule, database: ms.Database, target: tvm.target.Target) -> tvm.IRModule:
    """The module `apply_database_and_build` builds: its PrimFuncs are the built library's
    kernels, by name, with their final (pre-packed) signatures, and their parallel loops too
    small for the target's threads serial (`serial_small_loops_pass`)."""
    with target, database:
        return tvm.transform.Sequential(
            [
                relax.transform.MetaScheduleApplyDatabase(enable_warning=False),
                relax.transform.SplitLayoutRewritePreproc(),
                relax.transform.LiftTransformParams(),
                relax.transform.FoldConstant(),
                serial_small_loops_pass(target),
            ]
        )(prepared)


def build_untuned(prepared: tvm.IRModule, target: tvm.target.Target, exec_mode: str = "compiled") -> relax.VMExecutable:
    """The same prepared module built without any record: the baseline tuning must beat."""
    return apply_database_and_build(prepared, ms.database.MemoryDatabase(), target, exec_mode)


def count_tuned_tasks(
    prepared: tvm.IRModule,
    database: ms.Database,
    target: tvm.target.Target,
    kept_untuned: frozenset[str] = frozenset(),
) -> TaskCoverage:
    """How many of the prepared module's tasks have a valid record in `database`; those whose
    kernel hash is in `kept_untuned` (left out of `database` on purpose) are counted apart."""
    tasks = extract_tasks(prepared, target)
    kept = tuple(task.task_name for task in tasks if kernel_hash(task.dispatched[0]) in kept_untuned)
    missing = tuple(
        task.task_name
        for task in tasks
        if task.task_name not in kept
        and database.query_tuning_record(task.dispatched[0], target, task.task_name) is None
    )
    return TaskCoverage(
        tuned=len(tasks) - len(missing) - len(kept), total=len(tasks), missing=missing, kept_untuned=kept
    )
