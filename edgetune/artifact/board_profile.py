"""`edgetune profile`: where a built artifact's time goes on a board of its class, next to
onnxruntime's per-operator profile of the same ONNX model.

The TVM side runs on one board of the class, through the tracker. The artifact's library
(`relax.build(exec_mode="compiled")`) cannot be instrumented, and its kernels sit in a module its
RPC handle does not reach; so the kernels are rebuilt on the host from the artifact's own
recorded inputs (the inventory's model, whose digest must still be the artifact's, and the
database snapshot the artifact ships: the same schedules), compiled on their own as tuning
compiled its candidates, and each is timed on the board with TVM's time_evaluator and the class
profile's tuning settings (`measurement.number/repeat/min_repeat_ms`), on arguments of its
shapes, counted as many times as the model's entry function calls it. The artifact's own
library then times the whole model call the way builds are compared (`measurement.compare`)
on its reference input; the difference is the time outside kernels (the VM, allocation,
copies), small or below zero when kernels run faster warm and alone than inside the model.

The onnxruntime side runs on the host, in this process: a board image has the TVM runtime,
not onnxruntime. Its rows are the host's times, as many intra-op threads as the class's
`runtime_threads`; on a simulated fleet the boards are this host's CPU (under their cgroup
quota). Kernel and operator rows meet in kernel kinds (`profile.tvm_kernel_kinds`, `_ort_kind`):
TVM fuses operators into kernels whose names list the Relax operators they cover, and keeps no
ONNX node names.
"""

from __future__ import annotations

import logging
import math
import statistics
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import tvm
from tabulate import tabulate
from tvm import relax, rpc

from edgetune.artifact.measure import time_interleaved
from edgetune.artifact.profile import (
    OTHER,
    KernelRow,
    ModelProfile,
    kernel_kind,
    profile_onnxruntime,
    tvm_kernel_kinds,
)
from edgetune.artifact.store import ArtifactStore, StoredVersion
from edgetune.artifact.tuning_inputs import build_records
from edgetune.artifact_format.codec import sha256_hex
from edgetune.artifact_format.files import sha256_file
from edgetune.artifact_format.manifest import (
    DATABASE_DIR,
    LIBRARY_NAME,
    REFERENCE_INPUT_NAME,
)
from edgetune.artifact_format.reference import read_npz
from edgetune.compiler.models import entry_function, import_model, reference_inputs
from edgetune.compiler.prepare import apply_database, prepare
from edgetune.compiler.target import build_target
from edgetune.errors import ArtifactError
from edgetune.fleet.errors import FleetError
from edgetune.fleet.process import port_answers
from edgetune.fleet.ssh_route import rpc_address
from edgetune.fleet.tracker import (
    RpcEndpoint,
    board_sessions,
    read_summary,
    rpc_endpoint,
)
from edgetune.inventory.schema import Board, DeviceClass, Fleet, Model
from edgetune.tune.candidate_builder import CandidateBuild, SharedLibraryExport

log = logging.getLogger(__name__)
Progress = Callable[[str], None]
ORT_RUNS = 20  # onnxruntime's profiled runs (after one warm-up run)
TOP_ROWS = 15  # kernels and operators in the table (all in --json)


@dataclass(frozen=True)
class Kernel:
    """One kernel of the built library: its signature and how often the model calls it."""

    name: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    calls: int


@dataclass(frozen=True)
class ArtifactProfile:
    model: str
    device_class: str
    version: int
    board: str
    layout: str
    tvm: ModelProfile  # kernels timed one by one on the board; model_ms the whole call there
    onnxruntime: ModelProfile | None  # None for built-in models (no ONNX graph)
    onnxruntime_threads: int
    kernel_repeat: int

    def as_json(self) -> dict:
        return {
            "model": self.model,
            "class": self.device_class,
            "version": self.version,
            "board": self.board,
            "layout": self.layout,
            "kernel_repeat": self.kernel_repeat,
            "tvm": _profile_json(self.tvm, "board"),
            "onnxruntime": _profile_json(self.onnxruntime, "host") if self.onnxruntime else None,
            "onnxruntime_threads": self.onnxruntime_threads,
            "kinds": [{"kind": kind, "tvm_ms": t, "onnxruntime_ms": o} for kind, t, o in self._kinds()],
        }

    def table(self) -> str:
        """The slowest kernels, the slowest onnxruntime operators, both by kind, and totals."""
        tvm_total = self.tvm.model_ms
        lines = [
            (
                f"{self.model} v{self.version} for {self.device_class} on board {self.board} (convolutions {self.layout}): "
                f"kernels timed one by one on the board ({self.kernel_repeat} samples each, median), model call timed whole"
            ),
            "",
            tabulate(
                [
                    [k.name, k.kind, k.calls, f"{k.ms:.3f}", _gflops(k), f"{100 * k.ms / tvm_total:.1f}"]
                    for k in self.tvm.kernels[:TOP_ROWS]
                ],
                headers=["TVM kernel", "kind", "calls", "ms", "GFLOP/s", "% model"],
            ),
            _more(len(self.tvm.kernels)),
        ]
        if self.onnxruntime is None:
            lines += ["onnxruntime: none (a built-in model has no ONNX graph)", ""]
        else:
            ort_total = self.onnxruntime.model_ms
            lines += [
                tabulate(
                    [
                        [k.name, k.op, k.kind, f"{k.ms:.3f}", f"{100 * k.ms / ort_total:.1f}"]
                        for k in self.onnxruntime.kernels[:TOP_ROWS]
                    ],
                    headers=["onnxruntime operator (host)", "op", "kind", "ms", "% model"],
                ),
                _more(len(self.onnxruntime.kernels)),
            ]
        lines += [
            tabulate(
                [[kind, f"{t:.3f}", _ms(o), _ratio(t, o)] for kind, t, o in self._kinds()] + self._totals(),
                headers=["kind", "TVM ms", "onnxruntime ms", "TVM / onnxruntime"],
            ),
        ]
        return "\n".join(lines)

    def _kinds(self) -> list[tuple[str, float, float | None]]:
        tvm_kinds = self.tvm.by_kind()
        ort_kinds = self.onnxruntime.by_kind() if self.onnxruntime else {}
        kinds = sorted(set(tvm_kinds) | set(ort_kinds), key=lambda kind: -tvm_kinds.get(kind, (0.0, 0))[0])
        return [
            (kind, tvm_kinds.get(kind, (0.0, 0))[0], ort_kinds.get(kind, (0.0, 0))[0] if self.onnxruntime else None)
            for kind in kinds
        ]

    def _totals(self) -> list[list[str]]:
        ort = self.onnxruntime
        rows = [
            ("all kernels", self.tvm.kernels_ms, ort.kernels_ms if ort else None),
            ("outside kernels", self.tvm.outside_ms, ort.outside_ms if ort else None),
            ("model call", self.tvm.model_ms, ort.model_ms if ort else None),
        ]
        return [[f"= {name}", f"{t:.3f}", _ms(o), _ratio(t, o)] for name, t, o in rows]


def profile_artifact(
    fleet: Fleet,
    model_name: str,
    class_name: str | None = None,
    version: int | None = None,
    board_name: str | None = None,
    repeat: int | None = None,
    progress: Progress = log.info,
) -> ArtifactProfile:
    """Profile a stored artifact of `model_name` (the latest version unless `version`) for
    `class_name` (default: the one class the model has artifacts for) on `board_name` (default:
    the first of the class's boards registered with the tracker); `repeat` samples per kernel
    (default: the class profile's `measurement.repeat`)."""
    model = _model(fleet, model_name)
    store = ArtifactStore(fleet.artifacts.dir)
    device_class = _device_class(fleet, store, model, class_name)
    stored = _stored_version(fleet, store, model, device_class, version)
    endpoint, board = _board(fleet, device_class, board_name)
    measurement = device_class.profile.measurement
    repeat = repeat or measurement.repeat
    progress(f"{model.name} v{stored.version} for {device_class.name}: rebuilding its kernels' signatures")
    imported = import_model(model)
    _check_model_unchanged(fleet, stored, imported.mod)
    target = build_target(device_class.profile)
    prepared = prepare(imported.mod, target)
    applied = apply_database(prepared, build_records(stored.path / DATABASE_DIR).database, target)
    kernels = library_kernels(applied)
    kinds = tvm_kernel_kinds(prepared, imported.layout.layout)
    inputs = read_npz(stored.path / REFERENCE_INPUT_NAME)
    with tempfile.TemporaryDirectory(prefix="edgetune-profile-") as work:
        kernel_library = _kernel_library(applied, kernels, target, device_class.profile.cross_compiler, work)
        progress(f"  timing {len(kernels)} kernels and the model on {board.name}")
        with board_sessions(endpoint, [board]) as (sessions, failed):
            if board.name not in sessions:
                raise FleetError(failed[board.name])
            session = sessions[board.name]
            rows = _kernel_rows(session, kernel_library, kernels, kinds, measurement, repeat)
            model_ms = _model_ms(session, stored, inputs, measurement)
    tvm_profile = ModelProfile(tuple(sorted(rows, key=lambda row: -row.ms)), model_ms, 0.0)
    ort_profile = None
    threads = device_class.profile.runtime_threads
    if model.onnx is not None:
        progress(f"  onnxruntime on the host: {ORT_RUNS} profiled runs, {threads} threads")
        ort_profile = profile_onnxruntime(model.onnx, reference_inputs(model), ORT_RUNS, threads)
    return ArtifactProfile(
        model.name,
        device_class.name,
        stored.version,
        board.name,
        imported.layout.layout,
        tvm_profile,
        ort_profile,
        threads,
        repeat,
    )


def library_kernels(applied: tvm.IRModule) -> list[Kernel]:
    """The kernels of the library built from `applied` (`prepare.apply_database`) that its
    entry function calls, with their argument shapes and the calls per model call."""
    calls: Counter[str] = Counter()

    def count(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call) and expr.op.same_as(tvm.ir.Op.get("relax.call_tir")):
            calls[expr.args[0].name_hint] += 1

    relax.analysis.post_order_visit(applied[entry_function(applied)], count)
    kernels = []
    for gv, func in applied.functions.items():
        if gv.name_hint not in calls or not isinstance(func, tvm.tirx.PrimFunc):
            continue
        kernels.append(
            Kernel(
                gv.name_hint,
                tuple(tuple(int(d) for d in p.shape) for p in func.params),
                tuple(str(p.dtype) for p in func.params),
                calls[gv.name_hint],
            )
        )
    return kernels


def _kernel_library(
    applied: tvm.IRModule, kernels: list[Kernel], target: tvm.target.Target, cross_compiler: str | None, work: str
) -> Path:
    """The artifact's kernels on their own, compiled as tuning compiled their candidates: a
    library whose every kernel TVM's time_evaluator finds by name on a board (in the artifact's
    library they sit in an imported module, which its RPC handle does not reach)."""
    names = {k.name for k in kernels}
    only_kernels = tvm.IRModule(
        {
            gv: func.with_attr("global_symbol", gv.name_hint)  # what relax.build gives them
            for gv, func in applied.functions.items()
            if gv.name_hint in names
        }
    )
    return Path(SharedLibraryExport(work, cross_compiler)(CandidateBuild()(only_kernels, target, None)))


def _kernel_rows(
    session: rpc.RPCSession, library: Path, kernels: list[Kernel], kinds, measurement, repeat: int
) -> list[KernelRow]:
    with _uploaded(session, library) as remote:
        return [_kernel_row(remote, session.cpu(), kernel, kinds, measurement, repeat) for kernel in kernels]


def _model_ms(session: rpc.RPCSession, stored: StoredVersion, inputs: dict[str, np.ndarray], measurement) -> float:
    """The artifact's whole model call on the board, timed as builds are compared, on its reference input."""
    with _uploaded(session, stored.path / LIBRARY_NAME) as remote:
        dev = session.cpu()
        vm = relax.VirtualMachine(remote, dev)
        entry = stored.manifest.entry
        vm.set_input(entry.function, *[tvm.runtime.tensor(inputs[name], dev) for name in entry.inputs])
        return time_interleaved({"model": vm}, dev, entry.function, measurement)["model"].median_ms


@contextmanager
def _uploaded(session: rpc.RPCSession, library: Path) -> Iterator[tvm.runtime.Module]:
    remote_name = f"edgetune-profile-{sha256_file(library)[:16]}.so"
    session.upload(str(library), target=remote_name)
    try:
        yield session.load_module(remote_name)
    finally:
        session.remove(remote_name)


def _kernel_row(library, dev, kernel: Kernel, kinds, measurement, repeat: int) -> KernelRow:
    """The kernel alone on the board, on arguments of its shapes (random floats; integer
    arguments zero, so that an index into a table stays in range)."""
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(_argument(rng, shape, dtype), dev) for shape, dtype in zip(kernel.shapes, kernel.dtypes)]
    timer = library.time_evaluator(
        kernel.name, dev, number=measurement.number, repeat=repeat, min_repeat_ms=measurement.min_repeat_ms
    )
    one_call_ms = statistics.median(timer(*args).results) * 1e3
    kind, flops = kernel_kind(kernel.name, kinds)
    return KernelRow(kernel.name, kind, flops * kernel.calls, one_call_ms * kernel.calls, kernel.calls)


def _argument(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype.startswith("float"):
        return rng.standard_normal(shape).astype(dtype)
    return np.zeros(shape, dtype=dtype)


def _model(fleet: Fleet, name: str) -> Model:
    for model in fleet.models:
        if model.name == name:
            return model
    raise ArtifactError(f"unknown model '{name}' (models in {fleet.path}: {', '.join(m.name for m in fleet.models)})")


def _device_class(fleet: Fleet, store: ArtifactStore, model: Model, name: str | None) -> DeviceClass:
    known = [c.name for c in fleet.device_classes]
    if name is not None:
        if name not in known:
            raise ArtifactError(f"unknown device class '{name}' (classes in {fleet.path}: {', '.join(known)})")
        return fleet.device_class(name)
    built = [c for c in fleet.device_classes if store.versions(model.name, c.name)]
    if not built:
        raise ArtifactError(
            f"no built artifact of {model.name} in {fleet.artifacts.dir}: run "
            f"`edgetune build -f {fleet.path} --model {model.name}` first"
        )
    if len(built) > 1:
        raise ArtifactError(
            f"{model.name} is built for several classes ({', '.join(c.name for c in built)}): name one with --class"
        )
    return built[0]


def _stored_version(
    fleet: Fleet, store: ArtifactStore, model: Model, device_class: DeviceClass, version: int | None
) -> StoredVersion:
    versions = store.versions(model.name, device_class.name)
    if not versions:
        raise ArtifactError(
            f"no built artifact of {model.name} for class {device_class.name} in {fleet.artifacts.dir}: run "
            f"`edgetune build -f {fleet.path} --class {device_class.name} --model {model.name}` first"
        )
    if version is not None and version not in versions:
        raise ArtifactError(
            f"{model.name} for {device_class.name} has no version {version} "
            f"(stored: {', '.join(f'v{v}' for v in versions)})"
        )
    return store.get(model.name, device_class.name, versions[-1] if version is None else version)


def _board(fleet: Fleet, device_class: DeviceClass, name: str | None) -> tuple[RpcEndpoint, Board]:
    """The tracker endpoint and the board to profile on: `name` (a board of the class's tuning
    pool, the boards with an rpc_server), or the first of the pool registered with the tracker."""
    _check_profiled_board(fleet, device_class, name)
    boards = fleet.pool_of(device_class.name)
    endpoint = rpc_endpoint(fleet, device_class.name)
    if not port_answers(endpoint.host, endpoint.port):
        raise FleetError(f"the tracker at {endpoint.address} does not answer: run `edgetune fleet up -f {fleet.path}`")
    summary = read_summary(endpoint.host, endpoint.port)
    up = [b for b in boards if summary.registered(device_class.name, rpc_address(b))]
    chosen = [b for b in up if name is None or b.name == name]
    if not chosen:
        which = f"board {name}" if name else f"no board of class {device_class.name}"
        raise FleetError(
            f"{which} is not registered with the tracker at {endpoint.address}: run `edgetune fleet up -f {fleet.path}`"
        )
    return endpoint, chosen[0]


def _check_profiled_board(fleet: Fleet, device_class: DeviceClass, name: str | None) -> None:
    """`name`, if given, is a board of the class's tuning pool."""
    boards, pool = fleet.boards_of(device_class.name), fleet.pool_of(device_class.name)
    if name is not None and name not in [b.name for b in boards]:
        raise FleetError(
            f"'{name}' is not a board of class {device_class.name} "
            f"(its boards: {', '.join(b.name for b in boards) or 'none'})"
        )
    if name is not None and name not in [b.name for b in pool]:
        raise FleetError(
            f"'{name}' is outside class {device_class.name}'s tuning pool, so it runs no rpc_server to "
            f"profile on; profile on a pool board ({', '.join(b.name for b in pool)})"
        )


def _check_model_unchanged(fleet: Fleet, stored: StoredVersion, mod: tvm.IRModule) -> None:
    if sha256_hex(tvm.ir.save_json(mod).encode("utf-8")) != stored.manifest.inputs.model_source_sha256:
        raise ArtifactError(
            f"model {stored.model} in {fleet.path} is no longer the model v{stored.version} was built from: "
            f"build it again (`edgetune build -f {fleet.path} --class {stored.device_class} --model {stored.model}`)"
        )


def _profile_json(profile: ModelProfile, where: str) -> dict:
    return {
        "ran_on": where,
        "model_ms": profile.model_ms,
        "kernels_ms": profile.kernels_ms,
        "outside_ms": profile.outside_ms,
        "kernels": [asdict(k) for k in profile.kernels],
    }


def _gflops(kernel: KernelRow) -> str:
    return f"{kernel.flops / kernel.ms / 1e6:.1f}" if kernel.flops and kernel.ms > 0 and kernel.kind != OTHER else ""


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def _ratio(tvm_ms: float, ort_ms: float | None) -> str:
    return f"{tvm_ms / ort_ms:.2f}" if ort_ms and tvm_ms > 0 and math.isfinite(ort_ms) else ""


def _more(count: int) -> str:
    return f"({count - TOP_ROWS} more in --json)\n" if count > TOP_ROWS else ""
