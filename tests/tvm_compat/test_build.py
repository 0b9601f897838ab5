"""edgetune.tvm_compat.build: LocalBuilder's default build imports all tensor intrinsics, and its
workers live one batch. `PooledBuilder`: real builds of a small TIR kernel into shared
libraries, in worker processes kept across batches and replaced after their uses; a build that
fails comes back as data."""

from __future__ import annotations

import ctypes
from pathlib import Path

import psutil
import pytest
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import BuilderInput

from edgetune.tune.candidate_builder import SharedLibraryExport
from edgetune.tvm_compat.build import FastBuild, PooledBuilder

HOST = tvm.target.Target("llvm")
NO_SUCH_TARGET = tvm.target.Target({"kind": "llvm", "mtriple": "nonexistent-unknown-none"})  # LLVM refuses it

DEFAULT_BUILD = """
import tvm
from tvm import te
from tvm.s_tir.meta_schedule.builder.local_builder import default_build
a = te.placeholder((64,), name="a")
mod = tvm.IRModule({"main": te.create_prim_func([a, te.compute((64,), lambda i: a[i] + 1.0, name="b")])})
default_build(mod, tvm.target.Target("llvm"), None)
"""


def vector_add() -> tvm.IRModule:
    a = te.placeholder((64,), name="a")
    b = te.compute((64,), lambda i: a[i] + 1.0, name="b")
    return tvm.IRModule({"main": te.create_prim_func([a, b])})


def candidates(count: int, target: tvm.target.Target = HOST) -> list[BuilderInput]:
    return [BuilderInput(vector_add(), target) for _ in range(count)]


def build_workers() -> set[int]:
    """PIDs of this process's live TVM popen workers."""
    return {
        p.pid
        for p in psutil.Process().children(recursive=True)
        if p.status() != psutil.STATUS_ZOMBIE and "tvm.exec.popen_worker" in " ".join(p.cmdline())
    }


def pooled_builder(directory: Path, max_workers: int, worker_uses: int = 64, shared: bool = False) -> PooledBuilder:
    return PooledBuilder(
        FastBuild(), SharedLibraryExport(str(directory), None), max_workers, 60.0, worker_uses, shared=shared
    )


@pytest.mark.xfail(strict=True, reason="TVM 0.27: LocalBuilder's default build imports all of tvm.s_tir.tensor_intrin")
def test_the_default_build_needs_no_tensor_intrinsics(python_without):
    run = python_without(DEFAULT_BUILD, ["tvm.s_tir.tensor_intrin"])
    assert run.returncode == 0, run.stderr[-800:]


@pytest.mark.xfail(
    strict=True, reason="TVM 0.27: LocalBuilder starts its workers anew for every batch (apache/tvm#11074)"
)
def test_local_builders_workers_outlive_a_batch(tmp_path):
    before = build_workers()
    builder = ms.builder.LocalBuilder(
        max_workers=1, f_build=FastBuild(), f_export=SharedLibraryExport(str(tmp_path), None)
    )
    assert builder.build(candidates(1))[0].error_msg is None
    assert build_workers() - before, "no build worker is left after the batch"


def test_workers_are_kept_across_batches_and_replaced_after_their_uses(tmp_path):
    before = build_workers()
    builder = pooled_builder(tmp_path, max_workers=1, worker_uses=3)
    try:
        first = builder.build(candidates(2))
        assert [r.error_msg for r in first] == [None, None]
        for result in first:
            ctypes.CDLL(result.artifact_path)  # a real shared library
        worker = build_workers() - before
        assert len(worker) == 1
        assert builder.build(candidates(1))[0].error_msg is None
        assert build_workers() - before == worker  # the same process built the second batch
        assert builder.build(candidates(1))[0].error_msg is None
        replaced = build_workers() - before
        assert len(replaced) == 1 and replaced != worker  # its three uses were spent
    finally:
        builder.close()
    assert build_workers() - before == set()


def test_a_failed_build_is_an_error_result_and_the_others_still_build(tmp_path):
    builder = pooled_builder(tmp_path, max_workers=2)
    try:
        results = builder.build([*candidates(1, NO_SUCH_TARGET), *candidates(1)])
    finally:
        builder.close()
    assert results[0].artifact_path is None and results[0].error_msg.startswith("PooledBuilder: An exception occurred")
    assert results[1].error_msg is None and Path(results[1].artifact_path).is_file()


def test_shared_builders_build_in_one_pool_that_outlives_them(tmp_path):
    """Two runs one after another in one process (make_builder's builders are shared): the second
    builds in the worker the first started, which `close()` leaves running; a pool of other
    settings is another pool."""
    uses = 977  # settings no other builder of this process has: the shared pool is this test's
    before = build_workers()
    first = pooled_builder(tmp_path, 1, uses, shared=True)
    assert first.build(candidates(1))[0].error_msg is None
    first.close()
    worker = build_workers() - before
    assert len(worker) == 1
    second = pooled_builder(tmp_path, 1, uses, shared=True)
    assert second.pool is first.pool and second.build(candidates(1))[0].error_msg is None
    assert build_workers() - before == worker
    other = pooled_builder(tmp_path, 1, uses + 1, shared=True)
    assert other.pool is not first.pool
