"""`edgetune build`: one signed, versioned artifact per (model, device class).

For each pair (`plan_builds`, pure), `build_pair`:
1. snapshots the class's tuning database and computes the build inputs (model source, class,
   profile, target, TVM versions, database snapshot, reference input, tolerance); if they equal
   the latest version's, stops there ("unchanged": no build, no new version);
2. prepares the model the way the tuner did, applies the snapshot and builds the tuned library
   (`relax.build(exec_mode="compiled")`, weights pre-packed and bound) and the untuned one,
   exported with the profile's cross compiler (host compiler when it has none);
3. runs both on every board of the class's tuning pool (`Fleet.pool_of`: every board of the
   class unless fleet.yaml names a pool) through the tracker, timed against each other in
   interleaved rounds (`measure.compare_on_board`, the profile's `measurement.compare`) at the
   board's runtime threads (TVM's count on the board, recorded per board and in the table), and
   checks the tuned outputs on the reference input against the host reference (onnxruntime
   for ONNX models, an untuned host build otherwise) within `reference.output_tolerance`
   (wider for quantized models, by how far onnxruntime's own int8 kernels lie from the graph);
   where the model is an ONNX file and a board's Python has onnxruntime or OpenVINO, each runs
   that file on the board in the same rounds once its outputs match the reference: recorded in
   the manifest (the build against the runtimes the board would otherwise run; "vs best
   runtime" against the faster of them), never a reason to refuse; the table also says when the
   class run's estimate of the model crossed the faster runtime's time ("parity", from the
   tuning report the artifact ships: `tune.report.parity_point`);
4. gates (`gate_refusal`): the tuned build must be faster than the untuned one beyond noise
   on every pool board (the bootstrap interval of untuned / tuned lies above `GATE_MIN_SPEEDUP`,
   `timing_stats.ratio_of_medians`); a build that is not is refused, nothing is stored;
5. stages the library, reference input / expected output, database snapshot and tuning report,
   and commits them to the store (manifest listed, signed, renamed, tarball, index).
Any failure fails that pair only (its staging directory is removed; older versions are
untouched) and is reported with what to do; `BuildReport.ok` says whether all pairs succeeded.
TVM's and onnxruntime's native warnings during a pair's build go to its class's
`logs/native.log` (`tune.native_log`), not the console.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import shutil
import statistics
import tempfile
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path

import numpy as np
import tvm
from tabulate import tabulate

from edgetune import __version__
from edgetune.artifact import tuning_inputs
from edgetune.artifact.measure import RunResult, firmware_fingerprint, run_on_boards
from edgetune.artifact.store import ArtifactStore, Staging
from edgetune.artifact.tuning_inputs import SUMMARY_NAME
from edgetune.artifact_format.codec import canonical_bytes, sha256_hex
from edgetune.artifact_format.files import tree_digest
from edgetune.artifact_format.manifest import (
    DATABASE_DIR,
    EXPECTED_OUTPUT_NAME,
    LIBRARY_NAME,
    REFERENCE_INPUT_NAME,
    REPORT_DIR,
    BoardResult,
    BuildInputs,
    Entry,
    Manifest,
    RecordHits,
    Reference,
    RuntimeRun,
    Tolerance,
)
from edgetune.artifact_format.reference import (
    check_outputs,
    npz_bytes,
    output_tolerance,
)
from edgetune.artifact_format.signing import load_private_key
from edgetune.artifact_format.timing_stats import (
    RatioEstimate,
    ratio_of_medians,
    ratio_text,
)
from edgetune.compiler.models import (
    entry_function,
    import_model,
    model_interface,
    reference_inputs,
    reference_outputs,
    rounding_spread,
)
from edgetune.compiler.prepare import (
    apply_database_and_build,
    build_untuned,
    count_tuned_tasks,
    prepare,
)
from edgetune.compiler.target import build_target, missing_cross_compiler
from edgetune.errors import ArtifactError, EdgetuneError, TuneError
from edgetune.fleet.board_runtimes import ONNXRUNTIME, OPENVINO, RUNTIMES, OnnxModel
from edgetune.fleet.tracker import rpc_endpoint
from edgetune.inventory.schema import DeviceClass, DeviceProfile, Fleet, Model
from edgetune.tune.candidate_builder import SharedLibraryExport
from edgetune.tune.database import ClassDatabasePaths
from edgetune.tune.native_log import NATIVE_LOG, native_warnings_to
from edgetune.tune.report import read_summary

# The least speed-up (untuned / tuned, lower interval bound) a tuned build must show on every
# board. Not 1: two loads of the very same library differed by up to 4 % on the simulated
# boards, consistently, so an interval just above 1 does not mean the tuning did anything
# (docs/measurement.md).
GATE_MIN_SPEEDUP = 1.05

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildOutcome:
    """What happened to one (model, class): built, unchanged (inputs equal), refused (built
    and measured, but the tuned build is not faster than the untuned one: not stored), or
    failed."""

    model: str
    device_class: str
    status: str  # "built" | "unchanged" | "refused" | "failed"
    version: int | None = None
    path: Path | None = None
    untuned_ms: float | None = None
    tuned_ms: float | None = None
    least_speedup: float | None = None  # the lowest interval bound of untuned/tuned over the boards
    vs_onnxruntime: float | None = None  # onnxruntime / tuned, the median over the boards that ran it
    vs_openvino: float | None = None  # openvino / tuned, likewise
    vs_best_runtime: float | None = None  # the faster runtime / tuned per board, the median over the boards
    best_runtime: str | None = (
        None  # which runtime was the faster on those boards ("openvino", "onnxruntime, openvino")
    )
    trials: int | None = None
    tasks_without_record: tuple[str, ...] = ()
    tasks_total: int | None = None
    library_mb: float | None = None
    error: str | None = None
    layout: str | None = None  # the layout the model was compiled in and why ('NHWC: ...')
    threads: str = ""  # TVM's threads on the boards it was timed on ("2"; "1, 2" where boards differ)
    parity: str = ""  # the tuning report's time to parity ("trial 12, 3.1 min vs openvino", "not yet", ...)

    @property
    def speedup(self) -> float | None:
        return self.untuned_ms / self.tuned_ms if self.untuned_ms and self.tuned_ms else None

    @classmethod
    def from_manifest(
        cls,
        status: str,
        manifest: Manifest,
        path: Path | None,
        error: str | None = None,
        layout: str | None = None,
        parity: str | None = None,
    ) -> BuildOutcome:
        """The outcome of a measured build; `parity` None: that of the tuning report the stored
        artifact at `path` ships ("" without one)."""
        hits = manifest.record_hits
        speedups = board_speedups(manifest.boards)
        return cls(
            model=manifest.inputs.model,
            device_class=manifest.inputs.device_class,
            status=status,
            version=manifest.version or None,
            path=path,
            untuned_ms=manifest.untuned_median_ms(),
            tuned_ms=manifest.tuned_median_ms(),
            least_speedup=min(e.low for e in speedups.values()) if speedups else None,
            vs_onnxruntime=over_boards(runtime_ratios(manifest.boards, ONNXRUNTIME))[0],
            vs_openvino=over_boards(runtime_ratios(manifest.boards, OPENVINO))[0],
            vs_best_runtime=over_boards(best_runtime_ratios(manifest.boards))[0],
            best_runtime=best_runtime_names(manifest.boards),
            trials=manifest.tuning.trials,
            tasks_without_record=hits.tasks_without_record,
            tasks_total=hits.tasks_with_record + len(hits.tasks_without_record),
            library_mb=next((f.size / 1e6 for f in manifest.files if f.path == LIBRARY_NAME), None),
            error=error,
            layout=layout,
            threads=timed_threads(manifest.boards),
            parity=time_to_parity(path / REPORT_DIR) if parity is None and path is not None else parity or "",
        )


@dataclass(frozen=True)
class BuildReport:
    outcomes: tuple[BuildOutcome, ...]

    @property
    def ok(self) -> bool:
        return all(o.status in ("built", "unchanged") for o in self.outcomes)

    def table(self) -> str:
        """model x class: the threads it was timed at, untuned ms, tuned ms, speed-up, against
        onnxruntime, OpenVINO and the faster of them (on the boards that have them), when the
        tuning estimate crossed the faster runtime's time (parity), trials, records, library
        size, artifact version."""
        rows = [
            [
                o.model,
                o.device_class,
                o.threads,
                _ms(o.untuned_ms),
                _ms(o.tuned_ms),
                _speedup(o),
                _versus(o, o.vs_onnxruntime),
                _versus(o, o.vs_openvino),
                _versus(o, o.vs_best_runtime, o.best_runtime),
                o.parity,
                "" if o.trials is None else o.trials,
                _records(o),
                "" if o.library_mb is None else f"{o.library_mb:.2f}",
                f"v{o.version}" if o.version else "",
                o.status,
            ]
            for o in self.outcomes
        ]
        headers = [
            "model",
            "class",
            "threads",
            "untuned ms",
            "tuned ms",
            "speed-up (min)",
            "vs onnxruntime",
            "vs openvino",
            "vs best runtime",
            "parity",
            "trials",
            "records",
            "library MB",
            "artifact",
            "status",
        ]
        return tabulate(rows, headers=headers, disable_numparse=True)

    def failures(self) -> list[str]:
        """One line per failed or refused pair: what happened and what to do."""
        return [f"{o.model} on {o.device_class}: {o.error}" for o in self.outcomes if o.error]

    def layouts(self) -> list[str]:
        """One line per model: the layout it was compiled in and why."""
        chosen = {o.model: o.layout for o in self.outcomes if o.layout}
        return [f"layout of {model}: {line}" for model, line in chosen.items()]

    def warnings(self) -> list[str]:
        """One line per artifact with kernels that found no tuning record (built, but untuned there)."""
        return [
            f"{o.model} on {o.device_class}: {len(o.tasks_without_record)} of {o.tasks_total} kernels found no "
            f"tuning record and run untuned ({', '.join(o.tasks_without_record)}): tune with a larger budget"
            for o in self.outcomes
            if o.status in ("built", "unchanged") and o.tasks_without_record
        ]


def plan_builds(
    fleet: Fleet, classes: Sequence[str] = (), models: Sequence[str] = ()
) -> list[tuple[Model, DeviceClass]]:
    """The (model, class) pairs to build, in inventory order; unknown names are errors."""
    _check_names("device class", classes, [c.name for c in fleet.device_classes])
    _check_names("model", models, [m.name for m in fleet.models])
    return [
        (model, device_class)
        for model in fleet.models
        if not models or model.name in models
        for device_class in fleet.device_classes
        if not classes or device_class.name in classes
    ]


def build_artifacts(fleet: Fleet, classes: Sequence[str] = (), models: Sequence[str] = ()) -> BuildReport:
    """Build every planned pair; fails fast only on what would fail them all (no key,
    unwritable store), before any build."""
    pairs = plan_builds(fleet, classes, models)
    store = ArtifactStore(fleet.artifacts.dir)
    store.check_writable()
    key = load_private_key(fleet.artifacts.signing_key)
    outcomes = []
    for model, device_class in pairs:
        log.info(f"{model.name} on {device_class.name}:")
        try:
            with native_warnings_to(ClassDatabasePaths.of(fleet.workdir, device_class.name).logs / NATIVE_LOG):
                outcome = build_pair(fleet, model, device_class, store, key)
        except EdgetuneError as err:
            outcome = BuildOutcome(model.name, device_class.name, "failed", error=str(err))
        except (RuntimeError, ValueError, OSError) as err:  # TVM and RPC errors are RuntimeErrors
            log.debug("%s on %s", model.name, device_class.name, exc_info=err)
            error = f"{type(err).__name__}: {err}"
            outcome = BuildOutcome(model.name, device_class.name, "failed", error=error)
        log.info(f"  {outcome.status}" + (f": {outcome.error}" if outcome.error else f" v{outcome.version}"))
        outcomes.append(outcome)
    return BuildReport(tuple(outcomes))


@dataclass(frozen=True)
class BuildPair:
    """One (model, class) being built, with what every step needs."""

    fleet: Fleet
    model: Model
    device_class: DeviceClass
    mod: tvm.IRModule  # the model as imported, weights bound
    ref_inputs: dict[str, np.ndarray]  # every declared input, fixed ones included
    work: Path  # scratch directory of this build

    @cached_property
    def tolerance(self) -> Tolerance:
        """How close the outputs must be to the reference: wider for quantized models."""
        return output_tolerance(rounding_spread(self.model, self.ref_inputs))

    @property
    def fed_inputs(self) -> dict[str, np.ndarray]:
        """The reference input the built library takes (fixed inputs are baked into it)."""
        return {i.name: self.ref_inputs[i.name] for i in self.model.fed_inputs}

    @property
    def args(self) -> list[np.ndarray]:
        return list(self.fed_inputs.values())


def build_pair(fleet: Fleet, model: Model, device_class: DeviceClass, store: ArtifactStore, key) -> BuildOutcome:
    """Build one (model, class) unless its inputs equal the latest version's."""
    with tempfile.TemporaryDirectory(prefix="edgetune-build-") as tmp:
        imported = import_model(model)
        pair = BuildPair(fleet, model, device_class, imported.mod, reference_inputs(model), Path(tmp))
        layout = imported.layout.line
        database_dir = tuning_inputs.snapshot_database(fleet, device_class.name, pair.work / DATABASE_DIR)
        inputs = build_inputs(pair, database_dir)
        latest = store.latest(model.name, device_class.name)
        if latest is not None and latest.manifest.inputs_sha256 == inputs.digest():
            return BuildOutcome.from_manifest("unchanged", latest.manifest, latest.path, layout=layout)
        with store.stage(model.name, device_class.name) as staging:
            manifest = _build_and_measure(pair, inputs, database_dir, staging)
            emulated = [b.name for b in fleet.boards if b.emulated]
            refusal = gate_refusal(manifest, fleet.path, emulated)
            if refusal is not None:
                parity = time_to_parity(staging.path / REPORT_DIR)
                return BuildOutcome.from_manifest(
                    "refused", manifest, None, error=refusal, layout=layout, parity=parity
                )
            result = store.commit(staging, manifest, key)
    status = "built" if result.created else "unchanged"
    return BuildOutcome.from_manifest(status, result.stored.manifest, result.stored.path, layout=layout)


def time_to_parity(report: Path) -> str:
    """The time to parity of the tuning report in `report` (an artifact's copy); "" without one,
    or with one this edgetune cannot read (the table shows what it can of the artifact)."""
    summary = report / SUMMARY_NAME
    try:
        return read_summary(summary).time_to_parity if summary.is_file() else ""
    except TuneError:
        return ""


def board_speedups(boards: Sequence[BoardResult]) -> dict[str, RatioEstimate]:
    """Per board: untuned / tuned time, the ratio of medians with its bootstrap interval."""
    return {b.board: ratio_of_medians(b.untuned.samples_ms, b.tuned.samples_ms) for b in boards}


def board_runtimes(board: BoardResult) -> dict[str, RuntimeRun]:
    """The runtimes of `RUNTIMES` timed on the board (each a BoardResult field of its name)."""
    return {name: run for name in RUNTIMES if (run := getattr(board, name)) is not None}


def runtime_ratios(boards: Sequence[BoardResult], runtime: str) -> dict[str, RatioEstimate]:
    """Per board that ran `runtime`: its time / the tuned time, the ratio of medians with its
    bootstrap interval (above 1: the tuned build is faster)."""
    return {
        b.board: ratio_of_medians(run.timing.samples_ms, b.tuned.samples_ms)
        for b in boards
        if (run := board_runtimes(b).get(runtime)) is not None
    }


def best_runtimes(boards: Sequence[BoardResult]) -> dict[str, str]:
    """Per board that ran a runtime: the faster of those it ran (the lower median)."""
    return {
        b.board: min(runs, key=lambda name: runs[name].timing.median_ms) for b in boards if (runs := board_runtimes(b))
    }


def best_runtime_ratios(boards: Sequence[BoardResult]) -> dict[str, RatioEstimate]:
    """Per board that ran a runtime: the faster runtime's time / the tuned time, as `runtime_ratios`."""
    best = best_runtimes(boards)
    return {board: runtime_ratios(boards, name)[board] for board, name in best.items()}


def best_runtime_names(boards: Sequence[BoardResult]) -> str | None:
    """Which runtime was the faster, over the boards that ran one ("onnxruntime, openvino" where
    it differs by board); None where no board ran one."""
    return ", ".join(sorted(set(best_runtimes(boards).values()))) or None


def timed_threads(boards: Sequence[BoardResult]) -> str:
    """The TVM threads the boards timed the builds at, each count once ("" where no board said)."""
    return ", ".join(str(n) for n in sorted({b.threads for b in boards if b.threads is not None}))


def over_boards(estimates: dict[str, RatioEstimate]) -> tuple[float | None, tuple[float, float] | None]:
    """The median ratio over the boards, and the lowest and highest bound of their intervals
    (None, None without a board)."""
    if not estimates:
        return None, None
    values = estimates.values()
    return statistics.median(e.ratio for e in values), (min(e.low for e in values), max(e.high for e in values))


def gate_refusal(manifest: Manifest, fleet_path: Path, emulated: Collection[str] = ()) -> str | None:
    """Why the tuned build must not be published (None: it may). It must be faster than the
    untuned build beyond noise on every board: the interval of untuned / tuned above
    `GATE_MIN_SPEEDUP`. Boards in `emulated` run under qemu-user, whose timings are not a real
    board's: there it must only not be slower beyond noise (the interval not wholly below 1)."""
    speedups = board_speedups(manifest.boards)
    not_faster = [b for b in manifest.boards if not _passes_gate(speedups[b.board], b.board in emulated)]
    if not not_faster:
        return None
    measured = "; ".join(
        f"{b.board}: untuned {b.untuned.median_ms:.3f} ms, tuned {b.tuned.median_ms:.3f} ms, "
        f"untuned/tuned {speedups[b.board].describe()} over {b.tuned.samples} samples each"
        for b in not_faster
    )
    hits = manifest.record_hits
    inputs = manifest.inputs
    return (
        f"the tuned build is not faster than the untuned one beyond noise (the interval of untuned/tuned must lie "
        f"above {GATE_MIN_SPEEDUP:g} on every board, and not below 1 on emulated ones; {measured}); "
        f"{hits.tasks_with_record} of {hits.tasks_with_record + len(hits.tasks_without_record)} kernels have a "
        f"tuning record, {manifest.tuning.trials} trials; nothing was published for this pair: tune the class "
        f"with a larger budget (raise tuning.trials_per_class, then `edgetune tune -f {fleet_path} --class "
        f"{inputs.device_class} --model {inputs.model}`) and build again"
    )


def _passes_gate(speedup: RatioEstimate, emulated: bool) -> bool:
    return not speedup.below(1.0) if emulated else speedup.above(GATE_MIN_SPEEDUP)


def _build_and_measure(pair: BuildPair, inputs: BuildInputs, database_dir: Path, staging: Staging) -> Manifest:
    """Fill `staging` with the artifact's files and return its (unsigned, unversioned) manifest."""
    profile = pair.device_class.profile
    target = build_target(profile)
    unlinkable = missing_cross_compiler(profile)
    if unlinkable:
        raise ArtifactError(unlinkable)
    records = tuning_inputs.build_records(database_dir)
    prepared = prepare(pair.mod, target)
    coverage = count_tuned_tasks(prepared, records.database, target, records.kept_untuned)
    log.info(f"  {coverage.tuned + len(coverage.kept_untuned)}/{coverage.total} kernels have a tuning record; building")
    if coverage.kept_untuned:
        log.info(
            f"  {len(coverage.kept_untuned)} of them built without their schedule, measured faster so on the "
            f"class's boards: {', '.join(coverage.kept_untuned)}"
        )
    export = SharedLibraryExport(str(pair.work), profile.cross_compiler)
    library = staging.path / LIBRARY_NAME
    shutil.move(export(apply_database_and_build(prepared, records.database, target)), library)
    log.info(f"  {library_size(pair.model, library)}")
    untuned = Path(export(build_untuned(prepared, target)))
    expected = {f"output{i}": out for i, out in enumerate(reference_outputs(pair.model, pair.ref_inputs))}
    (staging.path / REFERENCE_INPUT_NAME).write_bytes(npz_bytes(pair.fed_inputs))
    (staging.path / EXPECTED_OUTPUT_NAME).write_bytes(npz_bytes(expected))
    shutil.copytree(database_dir, staging.path / DATABASE_DIR)
    tuning = tuning_inputs.copy_report(pair.fleet, pair.device_class.name, pair.model.name, staging.path / REPORT_DIR)
    boards = _measure(pair, {"tuned": library, "untuned": untuned}, expected)
    return Manifest.create(
        version=0,
        created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        inputs=inputs,
        entry=Entry(function=entry_function(pair.mod), inputs=tuple(pair.fed_inputs)),
        interface=model_interface(pair.mod, tuple(pair.fed_inputs)),
        files=(),
        tuning=tuning,
        record_hits=RecordHits(
            tasks_with_record=coverage.tuned + len(coverage.kept_untuned), tasks_without_record=coverage.missing
        ),
        reference=Reference(
            source="onnxruntime" if pair.model.onnx is not None else "tvm-untuned-host",
            output_sha256=sha256_hex(npz_bytes(expected)),
        ),
        boards=boards,
    )


def _measure(pair: BuildPair, libraries: dict[str, Path], expected: dict[str, np.ndarray]) -> tuple[BoardResult, ...]:
    """Run the libraries on every board of the class's tuning pool; any board failing to run or
    to match fails the pair."""
    fleet, device_class = pair.fleet, pair.device_class
    boards = fleet.pool_of(device_class.name)
    if not boards:
        raise ArtifactError(f"class {device_class.name} has no board to measure on: add one to {fleet.path}")
    compare_settings = device_class.profile.measurement.compare
    log.info(
        f"  measuring on {len(boards)} boards: tuned and untuned in {compare_settings.rounds} interleaved rounds "
        f"of {compare_settings.repeat} samples (>= {compare_settings.min_repeat_ms} ms each)"
    )
    onnx = None if pair.model.onnx is None else OnnxModel(pair.model.onnx, pair.ref_inputs, expected, pair.tolerance)
    runs = run_on_boards(
        rpc_endpoint(fleet, device_class.name),
        boards,
        libraries,
        entry_function(pair.mod),
        pair.args,
        device_class.profile.measurement,
        onnx,
    )
    for runtime in RUNTIMES if onnx is not None else ():
        if not any(runtime in board_runs for board_runs in runs.succeeded.values()):
            log.info(
                f"  not compared against {runtime}: no board of {device_class.name} ran it (with "
                f"`{boards[0].python} -m pip install {runtime}` on a board, the next version built is)"
            )
    problems = list(runs.failed.values())
    results = []
    for board in boards:
        if board.name not in runs.succeeded:
            continue
        firmware = firmware_fingerprint(fleet, board)
        result, problem = _board_result(board.name, firmware, runs.succeeded[board.name], expected, pair.tolerance)
        results.append(result)
        problems += [problem] if problem else []
    if problems:
        raise ArtifactError("; ".join(problems) + "; nothing was published for this pair")
    return tuple(results)


def _board_result(
    board: str, firmware: str, runs: dict[str, RunResult], expected: dict[str, np.ndarray], tolerance: Tolerance
) -> tuple[BoardResult, str | None]:
    """The board's manifest entry, and why its tuned output fails the check (None if it passes)."""
    tuned = runs["tuned"]
    check = check_outputs(tuned.outputs, expected, tolerance)
    problem = (
        None
        if check.ok
        else (
            f"{board}: tuned output differs from the reference ({check.detail}): the tuned build is wrong "
            "for this board; check its TVM runtime and target, then re-tune the class"
        )
    )
    runtimes = {
        name: RuntimeRun(run.runtime, run.timing, check_outputs(run.outputs, expected, tolerance).max_abs_error)
        for name, run in runs.items()
        if name in RUNTIMES
    }
    result = BoardResult(
        board, firmware, tuned.timing, runs["untuned"].timing, check.max_abs_error, **runtimes, threads=tuned.threads
    )
    return result, problem


def build_inputs(pair: BuildPair, database_dir: Path) -> BuildInputs:
    """What a build of `pair` over the database snapshot `database_dir` records as its inputs
    (the digest that says whether a version with them exists: `build_pair`, `pipeline.work`)."""
    profile = pair.device_class.profile
    return BuildInputs(
        model=pair.model.name,
        model_source_sha256=sha256_hex(tvm.ir.save_json(pair.mod).encode("utf-8")),
        device_class=pair.device_class.name,
        profile_sha256=profile_digest(profile),
        target=profile.target_json(),
        tvm_version=importlib.metadata.version("apache-tvm"),
        tvm_ffi_version=importlib.metadata.version("apache-tvm-ffi"),
        database_sha256=tree_digest(database_dir),
        reference_input_sha256=sha256_hex(npz_bytes(pair.fed_inputs)),
        tolerance=pair.tolerance,
        edgetune_version=__version__,
    )


def library_size(model: Model, library: Path) -> str:
    """The library's size, and for ONNX models its ratio to the ONNX file's (int8 weights of
    quantized models stay int8 unless `quantized_weights: float` widens them)."""
    size = library.stat().st_size
    if model.onnx is None:
        return f"library {size / 1e6:.2f} MB"
    widened = (
        " (quantized_weights: float: int8 weights widened to float32)" if model.quantized_weights == "float" else ""
    )
    return f"library {size / 1e6:.2f} MB, {size / model.onnx.stat().st_size:.2f}x the ONNX file{widened}"


def profile_digest(profile: DeviceProfile) -> str:
    """sha256 of the profile's content (not of its file: comments and location do not count)."""
    content = {f.name: getattr(profile, f.name) for f in dataclasses.fields(profile) if f.name != "path"}
    return sha256_hex(canonical_bytes(content))


def _check_names(kind: str, asked: Sequence[str], known: list[str]) -> None:
    unknown = [name for name in asked if name not in known]
    if unknown:
        raise ArtifactError(f"unknown {kind} {', '.join(unknown)} (known: {', '.join(known)})")


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def _speedup(outcome: BuildOutcome) -> str:
    """'23.4x (22.1x)': untuned / tuned of the class medians, and in brackets the least gain
    on any board at 95 % confidence (the lowest interval bound)."""
    if not outcome.speedup:
        return ""
    least = f" ({ratio_text(outcome.least_speedup)}x)" if outcome.least_speedup is not None else ""
    return f"{ratio_text(outcome.speedup)}x{least}"


def _versus(outcome: BuildOutcome, ratio: float | None, runtime: str | None = None) -> str:
    """'1.21x' (with `runtime`: '1.21x openvino'); 'not measured' for a measured build no board
    compared against that runtime; '' for a pair with no measurement at all."""
    if ratio is None:
        return "" if outcome.tuned_ms is None else "not measured"
    return f"{ratio_text(ratio)}x" + (f" {runtime}" if runtime else "")


def _records(outcome: BuildOutcome) -> str:
    if outcome.tasks_total is None:
        return ""
    with_record = outcome.tasks_total - len(outcome.tasks_without_record)
    flag = "  NO RECORD" if with_record == 0 else ("  partial" if outcome.tasks_without_record else "")
    return f"{with_record}/{outcome.tasks_total}{flag}"
