"""MetaSchedule's LocalBuilder with a build and an export that work on these machines.

- Build: TVM's default build function imports `tvm.s_tir.tensor_intrin` (25-70 s here), longer
  than the builder's timeout, so every stock build times out (TVM_NOTES pitfall 1). `FastBuild`
  does the same work without that import. CPU targets here do not tensorize; a target that
  does would import only its own intrinsics module there.
- Export: the default export is a `.tar` that the board must link (pitfall 5). `SharedLibraryExport`
  links a shared library on the host with the profile's cross compiler, so boards need none.

LocalBuilder runs both in fresh `popen_worker` processes and sends them with cloudpickle; this
module is pickled by value, so the workers need not be able to import edgetune.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass

import cloudpickle
import tvm
from tvm.s_tir import meta_schedule as ms

BUILD_TIMEOUT_S = 60.0


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


def make_builder(
    artifact_dir: str, cross_compiler: str | None, max_workers: int
) -> ms.builder.LocalBuilder:
    """A LocalBuilder whose candidates become shared libraries in `artifact_dir`."""
    return ms.builder.LocalBuilder(
        max_workers=max_workers,
        timeout_sec=BUILD_TIMEOUT_S,
        f_build=FastBuild(),
        f_export=SharedLibraryExport(artifact_dir, cross_compiler),
    )


cloudpickle.register_pickle_by_value(sys.modules[__name__])
