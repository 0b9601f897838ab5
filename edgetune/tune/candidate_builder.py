"""The class run's candidate builder: MetaSchedule's local build, with a build and an export
that work on these machines, in worker processes that live as long as the run.

- Build: TVM's default build function imports `tvm.s_tir.tensor_intrin` (25-70 s here), longer
  than the builder's timeout, so every stock build times out (TVM_NOTES pitfall 1). `FastBuild`
  does the same work without that import. CPU targets here do not tensorize; a target that
  does would import only its own intrinsics module there.
- Export: the default export is a `.tar` that the board must link (pitfall 5). `SharedLibraryExport`
  links a shared library on the host with the profile's cross compiler, so boards need none.
- Workers: MetaSchedule's LocalBuilder starts a fresh pool of `popen_worker` processes for
  every batch (each importing TVM anew) because its workers leak memory over many builds.
  `PooledBuilder` keeps its workers for the run and replaces each after `WORKER_USES` builds,
  which bounds the leak and pays the start-up once per that many builds, not once per batch.

The workers get the functions with cloudpickle; this module is pickled by value, so the workers
need not be able to import edgetune.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass

import cloudpickle
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

BUILD_TIMEOUT_S = 60.0
WORKER_USES = 64  # builds per worker process before it is replaced (LocalBuilder: one batch)


@dataclass(frozen=True)
class FastBuild:
    """`f_build`: drop the weight-layout rewrite blocks (the weights arrive pre-packed) and
    compile the candidate's TIR, without importing the tensor intrinsics."""

    def __call__(self, mod: tvm.IRModule, target: tvm.target.Target, _params: object) -> tvm.runtime.Module:
        from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

        mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
        return tvm.driver.build(mod, target=target)


@dataclass(frozen=True)
class SharedLibraryExport:
    """`f_export`: link the candidate into a `.so` under `directory` with `cross_compiler`
    (a gcc-style driver such as aarch64-linux-gnu-gcc), or with the host compiler if None."""

    directory: str
    cross_compiler: str | None

    def __call__(self, rt_mod: tvm.runtime.Module) -> str:
        from tvm.support import cc

        # One directory per candidate: MetaSchedule's RemoveBuildArtifact deletes its dirname.
        path = os.path.join(tempfile.mkdtemp(prefix="candidate-", dir=self.directory), "candidate.so")
        fcompile = cc.cross_compiler(self.cross_compiler) if self.cross_compiler else cc.create_shared
        rt_mod.export_library(path, fcompile=fcompile)
        return path


def build_and_export(build: FastBuild, export: SharedLibraryExport, mod: tvm.IRModule, target: tvm.target.Target) -> str:
    """One candidate, in a worker: its shared library's path."""
    return export(build(mod, target, None))


@derived_object
class PooledBuilder(PyBuilder):
    """Builds candidates into shared libraries in `artifact_dir`, `max_workers` at a time, in
    worker processes kept across batches. As LocalBuilder's, a build that fails or outlives
    `timeout_s` is `BuilderResult(None, error)` (its worker is replaced), never raised.
    `close()` stops the workers."""

    def __init__(self, artifact_dir: str, cross_compiler: str | None, max_workers: int,
                 timeout_s: float = BUILD_TIMEOUT_S, worker_uses: int = WORKER_USES) -> None:
        super().__init__()
        self.build_function = FastBuild()
        self.export_function = SharedLibraryExport(artifact_dir, cross_compiler)
        self.timeout_s = timeout_s
        self.pool = PopenPoolExecutor(max_workers=max_workers, timeout=timeout_s, maximum_process_uses=worker_uses)

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        jobs = [(self.build_function, self.export_function, b.mod, b.target) for b in build_inputs]
        return [self._result(outcome) for outcome in self.pool.map_with_error_catching(lambda job: build_and_export(*job), jobs)]

    def _result(self, outcome) -> BuilderResult:
        if outcome.status == StatusKind.COMPLETE:
            return BuilderResult(outcome.value, None)
        if outcome.status == StatusKind.TIMEOUT:
            return BuilderResult(None, f"PooledBuilder: Timeout, killed after {self.timeout_s:g} seconds")
        return BuilderResult(None, f"PooledBuilder: An exception occurred\n{outcome.value}")

    def close(self) -> None:
        self.pool.shutdown()


def make_builder(artifact_dir: str, cross_compiler: str | None, max_workers: int) -> PooledBuilder:
    """The class run's builder: candidates become shared libraries in `artifact_dir`."""
    return PooledBuilder(artifact_dir, cross_compiler, max_workers)


cloudpickle.register_pickle_by_value(sys.modules[__name__])
