"""The class run's candidate builder (`PooledBuilder`, edgetune/tune/candidate_builder.py): real
builds of a small TIR kernel into shared libraries, in worker processes kept across batches and
replaced after their uses; a build that fails comes back as data."""

from __future__ import annotations

import ctypes
from pathlib import Path

import psutil
import tvm
from tvm import te
from tvm.s_tir.meta_schedule.builder import BuilderInput

from edgetune.tune.candidate_builder import PooledBuilder

HOST = tvm.target.Target("llvm")
NO_SUCH_TARGET = tvm.target.Target({"kind": "llvm", "mtriple": "nonexistent-unknown-none"})  # LLVM refuses it


def vector_add() -> tvm.IRModule:
    a = te.placeholder((64,), name="a")
    b = te.compute((64,), lambda i: a[i] + 1.0, name="b")
    return tvm.IRModule({"main": te.create_prim_func([a, b])})


def candidates(count: int, target: tvm.target.Target = HOST) -> list[BuilderInput]:
    return [BuilderInput(vector_add(), target) for _ in range(count)]


def build_workers() -> set[int]:
    """PIDs of this process's live TVM popen workers."""
    return {p.pid for p in psutil.Process().children(recursive=True)
            if p.status() != psutil.STATUS_ZOMBIE and "tvm.exec.popen_worker" in " ".join(p.cmdline())}


def test_workers_are_kept_across_batches_and_replaced_after_their_uses(tmp_path):
    before = build_workers()
    builder = PooledBuilder(str(tmp_path), None, max_workers=1, worker_uses=3)
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
    builder = PooledBuilder(str(tmp_path), None, max_workers=2)
    try:
        results = builder.build([*candidates(1, NO_SUCH_TARGET), *candidates(1)])
    finally:
        builder.close()
    assert results[0].artifact_path is None and results[0].error_msg.startswith("PooledBuilder: An exception occurred")
    assert results[1].error_msg is None and Path(results[1].artifact_path).is_file()
