"""The class run's candidate builder: candidates built as the artifact build builds them (their
parallel loops too small for the target's threads made serial, edgetune.compiler.tir.small_loops),
without importing TVM's tensor intrinsics, in worker processes that live as long as the process
(edgetune.tvm_compat.build's shared pool), and exported as shared libraries the boards load as they are.

Export: MetaSchedule's default export is a `.tar` that the board must link with a compiler of
its own. `SharedLibraryExport` links a shared library on the host with
the profile's cross compiler, so boards need none. This module is pickled by value, so the build
workers need not be able to import edgetune.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass

import cloudpickle
import tvm

from edgetune.compiler.tir import small_loops
from edgetune.tvm_compat.build import FastBuild, PooledBuilder

__all__ = ["BUILD_TIMEOUT_S", "CandidateBuild", "FastBuild", "PooledBuilder", "SharedLibraryExport", "make_builder"]

BUILD_TIMEOUT_S = 60.0
WORKER_USES = 64  # builds per worker process before it is replaced (LocalBuilder: one batch)


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


@dataclass(frozen=True)
class CandidateBuild:
    """`f_build` of a class run: the candidate's small parallel loops made serial for the target's
    threads, as `apply_database` does for the artifact, so that a candidate is measured as it
    would ship; then `FastBuild`."""

    def __call__(self, mod: tvm.IRModule, target: tvm.target.Target, params: object) -> tvm.runtime.Module:
        return FastBuild()(small_loops.serial_small_loops_pass(target)(mod), target, params)


def make_builder(artifact_dir: str, cross_compiler: str | None, max_workers: int) -> PooledBuilder:
    """The class run's builder: candidates become shared libraries in `artifact_dir`, built in the
    process's shared pool of `max_workers` (a later run in this process finds TVM imported there)."""
    return PooledBuilder(
        CandidateBuild(),
        SharedLibraryExport(artifact_dir, cross_compiler),
        max_workers,
        BUILD_TIMEOUT_S,
        WORKER_USES,
        shared=True,
    )


cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(small_loops)
