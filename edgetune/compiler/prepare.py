"""The pre-pack pipeline: one prepared module per (model, target), tuned and built alike.

TVM_NOTES 'Tuning and build pipeline', verified on these machines:
1. `prepare`: compute large 3x3 stride-1 convolutions by Winograd's F(4x4, 3x3)
   (edgetune.compiler.winograd), pad the output channels of convolutions no full vector divides
   (edgetune.compiler.channel_padding), fold the transposes, reshapes, concatenations and
   dequantizes of constants with NumPy (edgetune.compiler.graph: Relax would compile a kernel
   for each), legalize (sigmoid, softmax, exp, erf, GELU, tanh and log the fast way: edgetune.compiler.fast_math) and fuse the model
   (Relax's "zero" pipeline), mark constant weights
   layout-free, so that MetaSchedule's RewriteLayout can pre-pack them (not those a kernel
   reorders first: edgetune.compiler.prepack), schedule the kernels that concatenate along
   their innermost axis (edgetune.compiler.concatenation) and the 1x1 convolutions of one pixel
   (squeeze-and-excitation: edgetune.compiler.single_pixel), and mark the kernels
   of NHWC convolutions (groups 1, and depthwise) for their micro-kernel rules
   (edgetune.compiler.schedule_rules);
2. the tuner extracts its tasks from that prepared module (tasks and records match by
   construction, TVM_NOTES pitfall 2);
3. `apply_database_and_build`: apply the class database to the same prepared module, split
   the weight layout rewrites out, fold them into pre-packed constants, and compile with the
   VM control flow as native code (`exec_mode="compiled"`).

The artifact release (`edgetune.artifact.release`) calls `prepare`, then `apply_database_and_build` (or `build_untuned`)
and `count_tuned_tasks`. Every function takes the class's `tvm.target.Target`.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from edgetune.compiler.channel_padding import pad_output_channels
from edgetune.compiler.concatenation import schedule_concatenations
from edgetune.compiler.fast_math import legalize_fast_math
from edgetune.compiler.graph import fold_constants_with_numpy
from edgetune.compiler.prepack import drop_reordered_layout_free_weights
from edgetune.compiler.schedule_rules.common import is_scheduled
from edgetune.compiler.schedule_rules.convolution import annotate_convolutions
from edgetune.compiler.schedule_rules.depthwise import annotate_depthwise
from edgetune.compiler.schedule_rules.integer import annotate_integer_convolutions
from edgetune.compiler.single_pixel import schedule_single_pixel_convolutions
from edgetune.compiler.winograd import winograd_convolutions


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


def prepare(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """Step 1: rewrite large 3x3 stride-1 convolutions as Winograd's (`winograd`), pad the
    output channels of narrow-vector convolutions (`channel_padding`),
    legalize, fuse, mark weights layout-free (needs weights bound as constants), schedule the
    concatenations of the innermost axis and the convolutions of one pixel, and mark NHWC
    convolutions (groups 1, depthwise, integer) for their micro-kernel rules."""
    with target:
        fused = tvm.transform.Sequential(
            [
                winograd_convolutions(target),
                pad_output_channels(target),
                fold_constants_with_numpy,
                relax.transform.DecomposeOpsForInference(),
                relax.transform.CanonicalizeBindings(),
                legalize_fast_math(),
                relax.get_pipeline("zero"),
                relax.transform.AttachAttrLayoutFreeBuffers(),
            ]
        )(mod)
    layout_free = drop_reordered_layout_free_weights(fused)
    scheduled = schedule_single_pixel_convolutions(schedule_concatenations(layout_free, target), target)
    marked = annotate_convolutions(scheduled, target)
    return annotate_integer_convolutions(annotate_depthwise(marked, target), target)


def extract_tasks(prepared: tvm.IRModule, target: tvm.target.Target) -> list[ms.ExtractedTask]:
    """Step 2's input: the tuning tasks of a prepared module (one per distinct kernel), but for
    the kernels `prepare` scheduled itself (`is_scheduled`)."""
    tasks = ms.relax_integration.extract_tasks(prepared, target)
    return [task for task in tasks if not is_scheduled(task.dispatched[0]["main"])]


def kernel_hash(kernel: tvm.IRModule) -> str:
    """A kernel's identity in a class database: the structural hash its workload line starts with."""
    return str(tvm_ffi.structural_hash(kernel))


def apply_database_and_build(
    prepared: tvm.IRModule, database: ms.Database, target: tvm.target.Target, exec_mode: str = "compiled"
) -> relax.VMExecutable:
    """Step 3: the tuned executable. Kernels with a record get their best schedule and
    pre-packed weights; kernels without one stay untuned (check `count_tuned_tasks` first).
    Export the result with `executable.export_library(path, fcompile=...)`. `exec_mode`
    "bytecode" gives the same kernels under the bytecode VM, whose calls can be instrumented."""
    applied = apply_database(prepared, database, target)
    with target, database:
        return relax.build(applied, target=target, exec_mode=exec_mode)


def apply_database(prepared: tvm.IRModule, database: ms.Database, target: tvm.target.Target) -> tvm.IRModule:
    """The module `apply_database_and_build` builds: its PrimFuncs are the built library's
    kernels, by name, with their final (pre-packed) signatures."""
    with target, database:
        return tvm.transform.Sequential(
            [
                relax.transform.MetaScheduleApplyDatabase(enable_warning=False),
                relax.transform.SplitLayoutRewritePreproc(),
                relax.transform.LiftTransformParams(),
                relax.transform.FoldConstant(),
            ]
        )(prepared)


def build_untuned(prepared: tvm.IRModule, target: tvm.target.Target, exec_mode: str = "compiled") -> relax.VMExecutable:
    """The same prepared module built without any record: the baseline tuning must beat."""
    return apply_database_and_build(prepared, ms.database.MemoryDatabase(), target, exec_mode)


def count_tuned_tasks(
    prepared: tvm.IRModule, database: ms.Database, target: tvm.target.Target,
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
    return TaskCoverage(tuned=len(tasks) - len(missing) - len(kept), total=len(tasks), missing=missing,
                        kept_untuned=kept)
