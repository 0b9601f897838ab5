"""A kernel whose work is too small for a second thread keeps serial loops; a big one still runs
its outer loop in parallel, and the result is the same either way."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import s_tir, te, tirx

from edgetune.compiler.tir.small_loops import MIN_WORK_PER_EXTRA_THREAD, loop_work, serial_small_loops_pass

pytestmark = pytest.mark.tvm


def x86_target(cores: int | None) -> tvm.target.Target:
    options = {"kind": "llvm", "mcpu": "x86-64-v3"}
    return tvm.target.Target(options if cores is None else {**options, "num-cores": cores})


def matmul_module(n: int) -> tvm.IRModule:
    """An n x n x n matmul scheduled as MetaSchedule's postprocs leave it: the outer loop
    parallel, the inner one vectorized."""
    a = te.placeholder((n, n), name="a")
    b = te.placeholder((n, n), name="b")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    sch = s_tir.Schedule(te.create_prim_func([a, b, c]))
    i, j, kk = sch.get_loops(sch.get_sblock("c"))
    sch.reorder(i, kk, j)
    sch.parallel(i)
    sch.vectorize(j)
    return sch.mod


def loop_kinds(mod: tvm.IRModule) -> list[tirx.ForKind]:
    kinds = []

    def visit(stmt):
        if isinstance(stmt, tirx.For):
            kinds.append(stmt.kind)
            visit(stmt.body)
        elif isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s)
        elif isinstance(stmt, s_tir.SBlockRealize):
            visit(stmt.block.body)

    visit(mod["main"].body)
    return kinds


TINY, BIG = 16, 128  # 16^3 and 128^3 multiply-adds: below and above what a second thread repays


def test_the_sizes_lie_on_either_side_of_the_threshold():
    assert (
        loop_work(matmul_module(TINY)["main"].body)
        < 2 * MIN_WORK_PER_EXTRA_THREAD
        < loop_work(matmul_module(BIG)["main"].body)
    )


def test_a_tiny_kernel_runs_serially_and_a_big_one_in_parallel_on_x86_target():
    tiny = serial_small_loops_pass(x86_target(2))(matmul_module(TINY))
    big = serial_small_loops_pass(x86_target(2))(matmul_module(BIG))
    assert loop_kinds(tiny)[0] == tirx.ForKind.SERIAL
    assert loop_kinds(big)[0] == tirx.ForKind.PARALLEL
    assert tirx.ForKind.VECTORIZED in loop_kinds(tiny)  # the rest of the schedule is kept


def test_one_core_or_no_core_count_keeps_the_loops_as_they_are():
    for cores in (1, None):
        assert loop_kinds(serial_small_loops_pass(x86_target(cores))(matmul_module(TINY)))[0] == tirx.ForKind.PARALLEL


def test_the_serial_kernel_computes_the_same():
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((TINY, TINY)).astype("float32") for _ in range(2))
    kernel = tvm.compile(serial_small_loops_pass(x86_target(2))(matmul_module(TINY)), target=x86_target(2))
    out = tvm.runtime.tensor(np.zeros((TINY, TINY), "float32"))
    kernel["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5, atol=1e-5)
