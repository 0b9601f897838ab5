"""The artifact manifest (`manifest.json`), schema `edgetune.artifact` version 3 (2 still read).

A manifest is plain frozen dataclasses serialized as canonical JSON (`codec.canonical_bytes`).
Its signature is NOT part of it: `manifest.sig` (see `signing.py`) holds an ed25519 signature
over the exact bytes of `manifest.json`, so the signed bytes are the file itself.

Two digests matter:
- `BuildInputs.digest()` (stored as `inputs_sha256`): a hash of everything that decides the
  artifact's content (model source, class, profile, target, TVM versions, database snapshot,
  reference input, tolerance, edgetune version). Creation time and measured latency are not
  in it. The store makes a new version only when it differs from the latest version's.
- the manifest digest: sha256 of the `manifest.json` bytes, listed in `artifacts/index.json`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from edgetune.artifact_format.codec import added_field, canonical_bytes, load_json, load_versioned, sha256_hex
from edgetune.artifact_format.timing_stats import summarize
from edgetune.errors import ArtifactError

SCHEMA = "edgetune.artifact"
SCHEMA_VERSION = 3  # 2: the entry function and input order; every timing sample. 3: the interface
READABLE_VERSIONS = (2, 3)

MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "manifest.sig"
LIBRARY_NAME = "model.so"
REFERENCE_INPUT_NAME = "reference_input.npz"
EXPECTED_OUTPUT_NAME = "expected_output.npz"
DATABASE_DIR = "database"
REPORT_DIR = "report"


@dataclass(frozen=True)
class FileEntry:
    """One file of the artifact, relative to the version directory (POSIX separators)."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Tolerance:
    """Outputs match when |actual - expected| <= atol + rtol * |expected| (numpy.allclose)."""

    rtol: float
    atol: float


@dataclass(frozen=True)
class BuildInputs:
    """Everything that decides an artifact's content; equal inputs mean no new version."""

    model: str
    model_source_sha256: str
    device_class: str
    profile_sha256: str
    target: dict[str, Any]
    tvm_version: str
    tvm_ffi_version: str
    database_sha256: str
    reference_input_sha256: str
    tolerance: Tolerance
    edgetune_version: str

    def digest(self) -> str:
        return sha256_hex(canonical_bytes(self))


@dataclass(frozen=True)
class Timing:
    """One library timed on one board: every sample in milliseconds, in the order taken
    (round by round, see `measure.py`), and their summary (`timing_stats.summarize`). The
    samples are kept so that a later check can compare its own against them."""

    median_ms: float
    iqr_ms: float  # interquartile range of the samples
    min_ms: float
    max_ms: float
    samples: int
    samples_ms: tuple[float, ...]

    @classmethod
    def from_samples_ms(cls, samples_ms: Sequence[float]) -> Timing:
        summary = summarize(samples_ms)
        return cls(
            median_ms=summary.median,
            iqr_ms=summary.iqr,
            min_ms=summary.min,
            max_ms=summary.max,
            samples=summary.count,
            samples_ms=tuple(float(v) for v in samples_ms),
        )

    @classmethod
    def from_samples_s(cls, samples_s: Sequence[float]) -> Timing:
        return cls.from_samples_ms([s * 1e3 for s in samples_s])


@dataclass(frozen=True)
class RuntimeRun:
    """A runtime (onnxruntime, OpenVINO) running the model's ONNX file on a board that has it,
    timed in the same interleaved rounds as the tuned and untuned builds (`measure.py`)."""

    runtime: str  # "<runtime> <version>, <n> threads"
    timing: Timing
    max_abs_error: float  # its output vs the expected output, on the reference input


@dataclass(frozen=True)
class BoardResult:
    """The artifact measured and checked on one board of its class. `tuned` and `untuned`
    were timed in the same interleaved rounds, so their samples compare directly; so were
    `onnxruntime`'s and `openvino`'s, where the board has the runtime, the model is an ONNX file
    and the runtime answered like the reference (else None, and the key absent: manifests from
    before the field read back as they were signed)."""

    board: str
    firmware: str  # the output of the profile's firmware_command on that board
    tuned: Timing
    untuned: Timing
    max_abs_error: float  # tuned output vs the expected output, on the reference input
    onnxruntime: RuntimeRun | None = added_field()
    openvino: RuntimeRun | None = added_field()
    threads: int | None = added_field()  # TVM's thread count in the board's process the builds were timed in


@dataclass(frozen=True)
class TuningStats:
    """From the tuning report of (model, class)."""

    trials: int
    tuning_time_s: float


@dataclass(frozen=True)
class RecordHits:
    """Tuning tasks of the model that found a record in the class database, and those that did not."""

    tasks_with_record: int
    tasks_without_record: tuple[str, ...]


@dataclass(frozen=True)
class Reference:
    """Where the expected output came from and its digest (the input's is in BuildInputs)."""

    source: str  # "onnxruntime" or "tvm-untuned-host"
    output_sha256: str


@dataclass(frozen=True)
class Entry:
    """How to call the library: the Relax VM function and its inputs in call order
    (the names of `reference_input.npz`)."""

    function: str
    inputs: tuple[str, ...]


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of the model: its shape (an integer per dimension, or the name of a
    dimension the model leaves free) and element type (numpy's name: "float32", "int8", ...)."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str


@dataclass(frozen=True)
class Interface:
    """What the library takes and answers: the inputs in call order (`entry.inputs`), the
    outputs in return order, named `output0`, `output1`, ... (`expected_output.npz`'s names)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass(frozen=True)
class Manifest:
    schema: str
    schema_version: int
    version: int  # the artifact version of (model, class): 1, 2, ...; set by the store
    created: str  # ISO 8601, UTC
    inputs: BuildInputs
    inputs_sha256: str
    entry: Entry
    files: tuple[FileEntry, ...]
    tuning: TuningStats
    record_hits: RecordHits
    reference: Reference
    boards: tuple[BoardResult, ...]
    interface: Interface | None = added_field()  # from version 3 on

    @classmethod
    def create(cls, **fields: Any) -> Manifest:
        """A manifest of the current schema; `inputs_sha256` is derived from `inputs`."""
        if fields.get("interface") is None:
            raise ArtifactError("a manifest of schema version 3 names the model's interface (its inputs and outputs)")
        return cls(
            schema=SCHEMA,
            schema_version=SCHEMA_VERSION,
            inputs_sha256=fields["inputs"].digest(),
            **fields,
        )

    def with_files(self, version: int, files: list[FileEntry]) -> Manifest:
        return replace(self, version=version, files=tuple(sorted(files, key=lambda f: f.path)))

    def to_bytes(self) -> bytes:
        return canonical_bytes(self)

    def digest(self) -> str:
        return sha256_hex(self.to_bytes())

    def tuned_median_ms(self) -> float | None:
        """The median over the boards of each board's tuned median (None: no board measured)."""
        medians = [b.tuned.median_ms for b in self.boards]
        return statistics.median(medians) if medians else None

    def untuned_median_ms(self) -> float | None:
        medians = [b.untuned.median_ms for b in self.boards]
        return statistics.median(medians) if medians else None

    @classmethod
    def from_bytes(cls, data: bytes, where: str = MANIFEST_NAME) -> Manifest:
        """Parse and check a manifest: schema, schema version, every field, inputs digest."""
        manifest = load_versioned(cls, data, where, SCHEMA, _readable_version(data, where), what="manifest")
        if manifest.inputs.digest() != manifest.inputs_sha256:
            raise ArtifactError(f"{where}: inputs_sha256 does not match its inputs")
        if (manifest.interface is None) != (manifest.schema_version < 3):
            raise ArtifactError(f"{where}: interface: required from schema_version 3 on, and only there")
        return manifest


def _readable_version(data: bytes, where: str) -> int:
    """The manifest's schema_version if this edgetune reads it, else the current one (whose
    check then names what is wrong)."""
    raw = load_json(data, where)
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    return version if version in READABLE_VERSIONS and not isinstance(version, bool) else SCHEMA_VERSION
