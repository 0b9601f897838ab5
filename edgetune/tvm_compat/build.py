"""MetaSchedule's candidate build, as LocalBuilder does it, without its two costs here.

TVM 0.27's LocalBuilder
- builds with a default `f_build` that imports all of `tvm.s_tir.tensor_intrin` in the worker
  (25-80 s on these machines, edgetune.tvm_compat.tensor_intrin), more than its 30 s timeout,
  so every stock build times out. `FastBuild` is that build (drop the weight-layout rewrite
  blocks, compile) without the import; a target that tensorizes needs its own intrinsics
  module loaded in the worker first.
- starts a fresh pool of `popen_worker` processes for every batch, each importing TVM anew,
  because its workers leak memory over many builds (apache/tvm#11096, closed as won't fix;
  the pool restart is apache/tvm#11074). `PooledBuilder` keeps its workers and replaces each
  after `worker_uses` builds (PopenPoolExecutor's `maximum_process_uses`, apache/tvm#11094),
  which bounds the leak and pays the start-up once per that many builds. With `shared`, runs
  one after another in one process (a class process given a second class, a test session)
  build in the same workers: one pool per settings for the process, left running by `close()`.

`PooledBuilder` is a public `PyBuilder` taking `f_build` and `f_export` as LocalBuilder does.
The workers get the functions with cloudpickle; this module is pickled by value, so the workers
need not be able to import edgetune. Tests: tests/tvm_compat/test_build.py.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

import cloudpickle
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

BuildFunction = Callable[[tvm.IRModule, tvm.target.Target, object], tvm.runtime.Module]
ExportFunction = Callable[[tvm.runtime.Module], str]


@dataclass(frozen=True)
class FastBuild:
    """`f_build`: drop the weight-layout rewrite blocks (the weights arrive pre-packed) and
    compile the candidate's TIR, without importing the tensor intrinsics."""

    def __call__(self, mod: tvm.IRModule, target: tvm.target.Target, _params: object) -> tvm.runtime.Module:
        from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

        mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
        return tvm.tirx.build(mod, target=target)


def build_and_export(build: BuildFunction, export: ExportFunction, mod: tvm.IRModule, target: tvm.target.Target) -> str:
    """One candidate, in a worker: its exported file's path."""
    return export(build(mod, target, None))


_shared_pools: dict[tuple[int, float, int], PopenPoolExecutor] = {}
_shared_pools_lock = threading.Lock()


def shared_pool(max_workers: int, timeout_s: float, worker_uses: int) -> PopenPoolExecutor:
    """The process's pool of these settings, started on first use, shut down at exit."""
    key = (max_workers, timeout_s, worker_uses)
    with _shared_pools_lock:
        if key not in _shared_pools:
            if not _shared_pools:
                atexit.register(_shut_down_shared_pools)
            _shared_pools[key] = PopenPoolExecutor(
                max_workers=max_workers, timeout=timeout_s, maximum_process_uses=worker_uses
            )
        return _shared_pools[key]


def _shut_down_shared_pools() -> None:
    with _shared_pools_lock:
        for pool in _shared_pools.values():
            pool.shutdown()
        _shared_pools.clear()


os.register_at_fork(after_in_child=_shared_pools.clear)  # a forked child's workers are its parent's


@derived_object
class PooledBuilder(PyBuilder):
    """Builds candidates with `build` and `export`, `max_workers` at a time, in worker processes
    kept across batches (with `shared`, across builders: `shared_pool`). As LocalBuilder's, a
    build that fails or outlives `timeout_s` is `BuilderResult(None, error)` (its worker is
    replaced), never raised. `close()` stops the workers of a pool of its own."""

    def __init__(
        self,
        build: BuildFunction,
        export: ExportFunction,
        max_workers: int,
        timeout_s: float,
        worker_uses: int,
        shared: bool = False,
    ) -> None:
        super().__init__()
        self.build_function = build
        self.export_function = export
        self.timeout_s = timeout_s
        self.shared = shared
        self.pool = (
            shared_pool(max_workers, timeout_s, worker_uses)
            if shared
            else PopenPoolExecutor(max_workers=max_workers, timeout=timeout_s, maximum_process_uses=worker_uses)
        )

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        jobs = [(self.build_function, self.export_function, b.mod, b.target) for b in build_inputs]
        return [
            self._result(outcome)
            for outcome in self.pool.map_with_error_catching(lambda job: build_and_export(*job), jobs)
        ]

    def _result(self, outcome) -> BuilderResult:
        if outcome.status == StatusKind.COMPLETE:
            return BuilderResult(outcome.value, None)
        if outcome.status == StatusKind.TIMEOUT:
            return BuilderResult(None, f"PooledBuilder: Timeout, killed after {self.timeout_s:g} seconds")
        return BuilderResult(None, f"PooledBuilder: An exception occurred\n{outcome.value}")

    def close(self) -> None:
        if not self.shared:
            self.pool.shutdown()


cloudpickle.register_pickle_by_value(sys.modules[__name__])
