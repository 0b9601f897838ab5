"""Sample artifact records shared by the artifact and deploy tests (plain data, no I/O)."""

from __future__ import annotations

from dataclasses import replace

from edgetune.artifact_format.manifest import (
    BoardResult,
    BuildInputs,
    Entry,
    Interface,
    Manifest,
    RecordHits,
    Reference,
    TensorSpec,
    Timing,
    Tolerance,
    TuningStats,
)


def sample_inputs(**changes) -> BuildInputs:
    inputs = BuildInputs(
        model="mlp",
        model_source_sha256="a" * 64,
        device_class="gateway-avx512",
        profile_sha256="b" * 64,
        target={"kind": "llvm", "mcpu": "icelake-server", "num-cores": 1},
        tvm_version="0.27.0.post1",
        tvm_ffi_version="0.1.14.post1",
        database_sha256="c" * 64,
        reference_input_sha256="d" * 64,
        tolerance=Tolerance(rtol=1e-4, atol=1e-5),
        edgetune_version="0.1.0",
    )
    return replace(inputs, **changes)


def sample_manifest(inputs: BuildInputs | None = None, created: str = "2025-01-01T00:00:00Z") -> Manifest:
    return Manifest.create(
        version=0,
        created=created,
        inputs=inputs or sample_inputs(),
        entry=Entry(function="forward", inputs=("x",)),
        files=(),
        tuning=TuningStats(trials=64, tuning_time_s=12.5),
        record_hits=RecordHits(tasks_with_record=2, tasks_without_record=("fused_add",)),
        reference=Reference(source="tvm-untuned-host", output_sha256="e" * 64),
        boards=(
            BoardResult(
                board="gw-a1",
                firmware="Linux 6.1 x86_64",
                tuned=Timing.from_samples_ms([0.26, 0.25, 0.24]),
                untuned=Timing.from_samples_ms([2.5, 2.6, 2.4]),
                max_abs_error=1e-7,
            ),
        ),
        interface=Interface(
            inputs=(TensorSpec("x", (1, 256), "float32"),), outputs=(TensorSpec("output0", (1, 10), "float32"),)
        ),
    )


# Shaped like a private key (the loader checks only the PEM header), never used to log in.
FAKE_PRIVATE_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real key\n-----END OPENSSH PRIVATE KEY-----\n"
