"""Manifest: round trip, canonical bytes, inputs digest independent of time and latency."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from edgetune.artifact_format.manifest import SCHEMA, SCHEMA_VERSION, Manifest, Timing
from edgetune.artifact_format.reference import npz_bytes
from edgetune.errors import ArtifactError


def test_round_trip_is_identity(make_manifest):
    manifest = make_manifest()
    again = Manifest.from_bytes(manifest.to_bytes())
    assert again == manifest
    assert again.to_bytes() == manifest.to_bytes()


def test_canonical_bytes_are_sorted_compact_utf8(make_manifest):
    data = make_manifest().to_bytes()
    raw = json.loads(data)
    assert data == json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert raw["schema"] == SCHEMA and raw["schema_version"] == SCHEMA_VERSION
    assert not data.endswith(b"\n")


def test_inputs_digest_ignores_time_and_latency(make_manifest):
    first = make_manifest(created="2025-01-01T00:00:00Z")
    later = replace(
        make_manifest(created="2026-06-06T12:00:00Z"),
        boards=(replace(first.boards[0], tuned=Timing.from_samples_ms([9.0, 8.0, 10.0])),),
    )
    assert first.inputs_sha256 == later.inputs_sha256
    assert first.digest() != later.digest()


def test_inputs_digest_changes_with_any_input(make_manifest, make_inputs):
    base = make_manifest().inputs_sha256
    assert make_manifest(make_inputs(database_sha256="f" * 64)).inputs_sha256 != base
    assert make_manifest(make_inputs(target={"kind": "llvm"})).inputs_sha256 != base


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda raw: raw.update(schema="other"), "manifest.json: schema: not an edgetune.artifact manifest"),
        (
            lambda raw: raw.update(schema_version=99),
            "manifest.json: schema_version: 99 is not supported (this edgetune reads version 3)",
        ),
        (
            lambda raw: raw.update(extra=1),
            "manifest.json: extra: unknown key (did you mean 'entry'?); allowed here: schema, schema_version",
        ),
        (lambda raw: raw["inputs"].pop("model"), "manifest.json: inputs.model: required field is missing"),
        (
            lambda raw: raw["tuning"].update(trials="many"),
            "manifest.json: tuning.trials: must be an integer, got str 'many'",
        ),
        (
            lambda raw: raw["boards"][0]["tuned"]["samples_ms"].append("0.3"),
            "manifest.json: boards[0].tuned.samples_ms[3]: must be a number, got str '0.3'",
        ),
        (
            lambda raw: raw["boards"][0]["untuned"].pop("iqr_ms"),
            "manifest.json: boards[0].untuned.iqr_ms: required field is missing",
        ),
        (
            lambda raw: raw["boards"][0]["tuned"].update(spread_ms=0.1),
            "manifest.json: boards[0].tuned.spread_ms: unknown key; allowed here: median_ms, iqr_ms",
        ),
        (lambda raw: raw["inputs"].update(model="other"), "inputs_sha256 does not match"),
        (
            lambda raw: raw.pop("interface"),
            "manifest.json: interface: required from schema_version 3 on, and only there",
        ),
        (
            lambda raw: raw.update(schema_version=2),
            "manifest.json: interface: required from schema_version 3 on, and only there",
        ),
        (
            lambda raw: raw["interface"]["inputs"][0].update(shape=[1, 2.5]),
            "manifest.json: interface.inputs[0].shape[1]: must be an integer, got float 2.5",
        ),
    ],
)
def test_invalid_manifests_are_rejected_precisely(make_manifest, edit, message):
    raw = json.loads(make_manifest().to_bytes())
    edit(raw)
    with pytest.raises(ArtifactError) as err:
        Manifest.from_bytes(json.dumps(raw).encode())
    assert message in str(err.value)


def test_a_version_2_manifest_reads_back_byte_for_byte(make_manifest):
    """Signed before the interface: the same bytes, so its signature still holds."""
    raw = json.loads(make_manifest().to_bytes())
    del raw["interface"]
    raw["schema_version"] = 2
    data = json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()
    manifest = Manifest.from_bytes(data)
    assert manifest.schema_version == 2 and manifest.interface is None and manifest.to_bytes() == data


def test_a_new_manifest_must_name_its_interface(make_manifest):
    with pytest.raises(ArtifactError, match="names the model's interface"):
        Manifest.create(
            **{
                f: getattr(make_manifest(), f)
                for f in (
                    "version",
                    "created",
                    "inputs",
                    "entry",
                    "files",
                    "tuning",
                    "record_hits",
                    "reference",
                    "boards",
                )
            }
        )


def test_timing_keeps_every_sample_in_order_with_its_summary():
    timing = Timing.from_samples_s([0.003, 0.001, 0.002, 0.010])  # IQR: 4.75 - 1.75 (linear interpolation)
    assert timing == Timing(
        median_ms=2.5, iqr_ms=3.0, min_ms=1.0, max_ms=10.0, samples=4, samples_ms=(3.0, 1.0, 2.0, 10.0)
    )


def test_raw_samples_round_trip_exactly(make_manifest):
    samples = [0.1 + i / 7 for i in range(24)]  # floats with long expansions
    manifest = make_manifest()
    manifest = replace(manifest, boards=(replace(manifest.boards[0], untuned=Timing.from_samples_ms(samples)),))
    again = Manifest.from_bytes(manifest.to_bytes())
    assert again.boards[0].untuned.samples_ms == tuple(samples)
    assert again == manifest


def test_npz_bytes_are_deterministic_and_loadable(tmp_path):
    arrays = {"x": np.arange(6, dtype="float32").reshape(2, 3), "a": np.ones(2)}
    first = npz_bytes(arrays)
    assert first == npz_bytes(dict(reversed(list(arrays.items()))))
    (tmp_path / "r.npz").write_bytes(first)
    with np.load(tmp_path / "r.npz") as loaded:
        np.testing.assert_array_equal(loaded["x"], arrays["x"])


def test_the_runtimes_on_a_board_round_trip_and_their_absence_leaves_the_signed_bytes_as_they_were(make_manifest):
    from edgetune.artifact.release import best_runtime_names, best_runtime_ratios, runtime_ratios
    from edgetune.artifact_format.manifest import RuntimeRun

    plain = make_manifest()
    raw = json.loads(plain.to_bytes())
    assert "onnxruntime" not in raw["boards"][0] and "openvino" not in raw["boards"][0]  # written before the fields
    assert Manifest.from_bytes(plain.to_bytes()).to_bytes() == plain.to_bytes()
    assert runtime_ratios(plain.boards, "onnxruntime") == runtime_ratios(plain.boards, "openvino") == {}
    assert best_runtime_ratios(plain.boards) == {} and best_runtime_names(plain.boards) is None

    ort = RuntimeRun("onnxruntime 1.32.0, 1 thread", Timing.from_samples_ms([0.52, 0.50, 0.48]), 2e-6)
    measured = replace(plain, boards=(replace(plain.boards[0], onnxruntime=ort),))
    assert "openvino" not in json.loads(measured.to_bytes())["boards"][0]  # a board without OpenVINO
    again = Manifest.from_bytes(measured.to_bytes())
    assert again == measured and again.boards[0].onnxruntime.timing.samples_ms == (0.52, 0.50, 0.48)
    ratio = runtime_ratios(again.boards, "onnxruntime")["gw-a1"]
    assert ratio.ratio == pytest.approx(0.50 / 0.25) and ratio.low <= ratio.ratio <= ratio.high
    assert best_runtime_ratios(again.boards)["gw-a1"] == ratio and best_runtime_names(again.boards) == "onnxruntime"

    ov = RuntimeRun("openvino 2026.4.1, 1 thread", Timing.from_samples_ms([0.41, 0.40, 0.39]), 3e-6)
    both = replace(measured, boards=(replace(measured.boards[0], openvino=ov),))
    again = Manifest.from_bytes(both.to_bytes())
    assert again == both and again.boards[0].openvino.timing.samples_ms == (0.41, 0.40, 0.39)
    assert best_runtime_names(again.boards) == "openvino"  # the faster of the two on that board
    assert best_runtime_ratios(again.boards)["gw-a1"].ratio == pytest.approx(0.40 / 0.25)

    raw = json.loads(both.to_bytes())
    raw["boards"][0]["onnxruntime"]["timing"] = "fast"
    with pytest.raises(ArtifactError, match=r"boards\[0\]\.onnxruntime\.timing: .*mapping"):
        Manifest.from_bytes(json.dumps(raw).encode())
    raw = json.loads(both.to_bytes())
    del raw["boards"][0]["openvino"]["max_abs_error"]
    with pytest.raises(ArtifactError, match=r"boards\[0\]\.openvino.*max_abs_error"):
        Manifest.from_bytes(json.dumps(raw).encode())
