"""Parallel loops too small for the board's threads run serially.

A parallel loop is one launch of TVM's thread pool: the calling thread hands the other threads
their share and waits until the last one is done. Waking a thread and joining it costs more
than a small loop's whole work, and when the board's cores are busy with something else the
join waits for a thread the kernel scheduler has not run yet. MetaSchedule parallelizes every
kernel's outer loops whatever their size, so `serial_small_loops` turns each parallel loop
whose work (the executions of the statements in it, vector lanes counted) is below what `threads`
threads need to gain anything (`MIN_WORK_PER_EXTRA_THREAD` per thread beyond the first) back
into a serial one. On one thread the loops are left as they are: a launch there runs the loop in
the calling thread, waking no one.
"""

from __future__ import annotations

import math

import tvm
from tvm import s_tir, tirx

MIN_WORK_PER_EXTRA_THREAD = 1 << 19  # statement executions that repay waking and joining one more thread


def min_parallel_work(threads: int) -> float:
    """The least work a loop must hold to be parallel on `threads` (at least 2) threads."""
    return MIN_WORK_PER_EXTRA_THREAD * threads / (threads - 1)


def loop_work(stmt: tirx.Stmt) -> float:
    """How many times the statements in `stmt` run (a loop of unknown extent: infinitely often)."""
    if isinstance(stmt, tirx.For):
        extent = stmt.extent
        return extent.value * loop_work(stmt.body) if isinstance(extent, tirx.IntImm) else math.inf
    if isinstance(stmt, tirx.SeqStmt):
        return sum(loop_work(s) for s in stmt.seq)
    if isinstance(stmt, s_tir.SBlockRealize):
        block = stmt.block
        return loop_work(block.body) + (loop_work(block.init) if block.init is not None else 0)
    if isinstance(stmt, tirx.IfThenElse):
        return max(loop_work(stmt.then_case), loop_work(stmt.else_case) if stmt.else_case is not None else 0)
    body = getattr(stmt, "body", None)
    return loop_work(body) if isinstance(body, tirx.Stmt) else 1


def serial_small_loops(func: tirx.PrimFunc, threads: int) -> tirx.PrimFunc:
    """`func` with its parallel loops of less work than `min_parallel_work(threads)` serial
    (`func` itself on one thread)."""
    if threads <= 1:
        return func
    body = _serialized(func.body, min_parallel_work(threads))
    return func if body.same_as(func.body) else func.with_body(body)


def _serialized(stmt: tirx.Stmt, min_work: float) -> tirx.Stmt:
    """`stmt` with its small parallel loops serial. MetaSchedule and the kernels `prepare`
    schedules put them outermost, under the root block and loops or sequences of loops, so those
    are the statements searched (a loop under anything else is left as it is)."""
    if isinstance(stmt, tirx.For):
        if stmt.kind == tirx.ForKind.PARALLEL and loop_work(stmt) < min_work:
            return _loop(stmt, tirx.ForKind.SERIAL, stmt.body)
        body = _serialized(stmt.body, min_work)
        return stmt if body.same_as(stmt.body) else _loop(stmt, stmt.kind, body)
    if isinstance(stmt, tirx.SeqStmt):
        seq = [_serialized(s, min_work) for s in stmt.seq]
        return stmt if all(a.same_as(b) for a, b in zip(seq, stmt.seq)) else tirx.SeqStmt(seq)
    if isinstance(stmt, s_tir.SBlockRealize):
        block = stmt.block
        body = _serialized(block.body, min_work)
        if body.same_as(block.body):
            return stmt
        new_block = s_tir.SBlock(
            block.iter_vars,
            block.reads,
            block.writes,
            block.name_hint,
            body,
            block.init,
            block.alloc_buffers,
            block.match_buffers,
            block.annotations,
        )
        return s_tir.SBlockRealize(stmt.iter_values, stmt.predicate, new_block)
    return stmt


def _loop(loop: tirx.For, kind: tirx.ForKind, body: tirx.Stmt) -> tirx.For:
    return tirx.For(loop.loop_var, loop.min, loop.extent, kind, body, loop.thread_binding, loop.annotations, loop.step)


def serial_small_loops_pass(target: tvm.target.Target) -> tvm.transform.Pass:
    """A module pass applying `serial_small_loops` to every PrimFunc for the threads the
    target's kernels run on, its `num-cores` (`build_target` sets it to the profile's runtime
    threads); a target without `num-cores`, or of one core, keeps every loop as it is."""
    cores = target.attrs.get("num-cores")

    def transform(mod: tvm.IRModule, _ctx: object) -> tvm.IRModule:
        if cores is None:
            return mod
        threads, updated = int(cores), mod
        for gvar, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc):
                serial = serial_small_loops(func, threads)
                if not serial.same_as(func):
                    updated = mod.clone() if updated is mod else updated
                    updated[gvar] = serial
        return updated

    return tvm.transform.module_pass(transform, opt_level=0, name="SerialSmallLoops")
