"""The build gate on measured samples: a real board needs the tuned build faster beyond noise;
an emulated board (qemu timings) only needs it not slower beyond noise."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from support.tests_samples import sample_manifest

from edgetune.artifact.release import gate_refusal
from edgetune.artifact_format.manifest import Timing

FLEET = Path("/srv/fleet.yaml")


def _with_timings(tuned_ms: list[float], untuned_ms: list[float]):
    manifest = sample_manifest()
    board = dataclasses.replace(
        manifest.boards[0], tuned=Timing.from_samples_ms(tuned_ms), untuned=Timing.from_samples_ms(untuned_ms)
    )
    return dataclasses.replace(manifest, boards=(board,))


def test_a_clear_speedup_passes_on_any_board():
    manifest = _with_timings([1.0, 1.01, 0.99] * 4, [2.0, 2.02, 1.98] * 4)
    assert gate_refusal(manifest, FLEET) is None
    assert gate_refusal(manifest, FLEET, emulated=["gw-a1"]) is None


def test_no_speedup_is_refused_on_a_real_board_but_passes_on_an_emulated_one():
    manifest = _with_timings([1.0, 1.1, 0.9] * 4, [1.02, 1.12, 0.92] * 4)
    refusal = gate_refusal(manifest, FLEET)
    assert refusal is not None and "gw-a1" in refusal and "edgetune tune -f /srv/fleet.yaml" in refusal
    assert gate_refusal(manifest, FLEET, emulated=["gw-a1"]) is None


def test_a_slower_tuned_build_is_refused_even_on_an_emulated_board():
    manifest = _with_timings([2.0, 2.02, 1.98] * 4, [1.0, 1.01, 0.99] * 4)
    refusal = gate_refusal(manifest, FLEET, emulated=["gw-a1"])
    assert refusal is not None and "not below 1 on emulated ones" in refusal
