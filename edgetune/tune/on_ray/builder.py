"""`RayBuilder`: MetaSchedule's builder with every candidate built by a Ray task on the cluster.

A build task gets the candidate's IRModule as TVM JSON and the target as its JSON dict, builds
and links it with the same `CandidateBuild` and `SharedLibraryExport` as the local builder (with the
profile's cross compiler), and returns the shared library's bytes, or the error as data. The
builder writes the bytes to a file of its own scratch directory, which the RPC runner uploads
to the board, so nodes share no files with the class run.

As LocalBuilder does, a build that fails or outlives its timeout becomes `BuilderResult(None,
error)`: the trial is recorded as failed and the search goes on. A build whose node is lost is
retried on another node by Ray (`max_retries`), within its timeout.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path

import ray
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder

from edgetune.inventory.schema import RayCompute
from edgetune.tune.candidate_builder import (
    BUILD_TIMEOUT_S,
    CandidateBuild,
    SharedLibraryExport,
)

BUILD_RETRIES = 3  # on a lost node or worker; a build error is data, never retried

# Builds per node ("ip node-id") of the class run in this process, for the run's placement report.
builds_by_node: Counter[str] = Counter()


@dataclass(frozen=True)
class BuiltCandidate:
    """What a build task returns: the library's bytes, or why there is none; and where it ran."""

    library: bytes | None
    error: str | None
    node: str


def node_label() -> str:
    """This Ray node as the placement report names it: its IP and the start of its node id."""
    return f"{ray.util.get_node_ip_address()} {ray.get_runtime_context().get_node_id()[:8]}"


@ray.remote(max_retries=BUILD_RETRIES)
def build_candidate(mod_json: str, target: dict, cross_compiler: str | None) -> BuiltCandidate:
    """Build and export one candidate on this node; an error is returned, not raised."""
    try:
        rt_mod = CandidateBuild()(tvm.ir.load_json(mod_json), tvm.target.Target(target), None)
        with tempfile.TemporaryDirectory(prefix="edgetune-build-") as directory:
            library = Path(SharedLibraryExport(directory, cross_compiler)(rt_mod)).read_bytes()
        return BuiltCandidate(library, None, node_label())
    except Exception:  # noqa: BLE001 -- any failure of a candidate is the candidate's result
        return BuiltCandidate(None, "RayBuilder: An exception occurred\n" + traceback.format_exc(), node_label())


@derived_object
class RayBuilder(PyBuilder):
    """Builds candidates as Ray tasks, at most `settings.build_workers` at a time, each of
    `settings.cpus_per_build` CPUs; the libraries land in `artifact_dir`."""

    def __init__(
        self, artifact_dir: str, cross_compiler: str | None, settings: RayCompute, timeout_s: float = BUILD_TIMEOUT_S
    ) -> None:
        super().__init__()
        self.artifact_dir = artifact_dir
        self.cross_compiler = cross_compiler
        self.settings = settings
        self.timeout_s = timeout_s

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        results: list[BuilderResult | None] = [None] * len(build_inputs)
        waiting = deque(enumerate(build_inputs))
        running: dict[ray.ObjectRef, tuple[int, float]] = {}  # task -> (input index, deadline)
        while waiting or running:
            while waiting and len(running) < self.settings.build_workers:
                index, build_input = waiting.popleft()
                running[self._submit(build_input)] = (index, time.monotonic() + self.timeout_s)
            next_deadline = min(deadline for _, deadline in running.values())
            ready, _ = ray.wait(list(running), num_returns=1, timeout=max(next_deadline - time.monotonic(), 0.0))
            for ref in ready:
                index, _ = running.pop(ref)
                results[index] = self._result(ref)
            for ref, (index, deadline) in list(running.items()):
                if deadline <= time.monotonic():
                    ray.cancel(ref, force=True)
                    del running[ref]
                    results[index] = BuilderResult(
                        None, f"RayBuilder: Timeout, killed after {self.timeout_s:g} seconds"
                    )
        return results

    def close(self) -> None:
        """Nothing to stop: the build tasks are the cluster's, and none outlives `build`."""

    def _submit(self, build_input: BuilderInput) -> ray.ObjectRef:
        return build_candidate.options(num_cpus=self.settings.cpus_per_build).remote(
            tvm.ir.save_json(build_input.mod), build_input.target.export(), self.cross_compiler
        )

    def _result(self, ref: ray.ObjectRef) -> BuilderResult:
        try:
            built: BuiltCandidate = ray.get(ref)
        except ray.exceptions.RayError as err:  # its retries used up (nodes lost), or cancelled
            return BuilderResult(None, f"RayBuilder: the build task failed on the cluster: {err}")
        builds_by_node[built.node] += 1
        if built.library is None:
            return BuilderResult(None, built.error)
        # One directory per candidate, as SharedLibraryExport's: MetaSchedule's RemoveBuildArtifact deletes its dirname.
        path = os.path.join(tempfile.mkdtemp(prefix="candidate-", dir=self.artifact_dir), "candidate.so")
        Path(path).write_bytes(built.library)
        return BuilderResult(path, None)
