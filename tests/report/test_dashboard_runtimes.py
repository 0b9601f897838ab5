"""The dashboard's artifacts table against the runtimes a class's boards have: per stored version,
the tuned build against onnxruntime and against the best runtime (the faster of onnxruntime and
OpenVINO on each board, named), and "not measured" where no board ran one. The versions are
real signed artifacts in the store of a synthetic fleet (tests/support/synthetic_fleet.py)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from support.synthetic_fleet import write_synthetic_fleet
from support.tests_samples import sample_inputs, sample_manifest

from edgetune.artifact.store import ArtifactStore
from edgetune.artifact_format.manifest import RuntimeRun, Timing
from edgetune.artifact_format.signing import init_keys, load_private_key
from edgetune.report import render

TUNED_MS = (0.26, 0.25, 0.24)


def runtime(name: str, *samples_ms: float) -> RuntimeRun:
    return RuntimeRun(f"{name} 1.0, 1 thread", Timing.from_samples_ms(samples_ms), 1e-6)


def publish(fleet, device_class: str, boards: list[dict]) -> None:
    """A signed version of mlp for `device_class` measured on one board per entry of `boards`
    (the runtimes each ran, by field name)."""
    key = load_private_key(fleet.artifacts.signing_key)
    plain = sample_manifest(sample_inputs(device_class=device_class))
    results = tuple(
        replace(plain.boards[0], board=f"{device_class}-{i}", tuned=Timing.from_samples_ms(TUNED_MS), **runs)
        for i, runs in enumerate(boards)
    )
    store = ArtifactStore(fleet.artifacts.dir)
    with store.stage("mlp", device_class) as staging:
        (staging.path / "model.so").write_bytes(b"\x7fELF-library")
        store.commit(staging, replace(plain, boards=results), key)


def version_cells(html: str, device_class: str) -> tuple[str, str]:
    """The 'vs onnxruntime' and 'vs best runtime' cells of the class's version row, as HTML."""
    row = next(r for r in re.findall(r"<tr>(.*?)</tr>", html) if r.startswith(f"<td>mlp</td><td>{device_class}</td>"))
    cells = re.findall(r"<td[^>]*>.*?</td>", row)
    return cells[7], cells[8]


@pytest.fixture
def fleet(tmp_path):
    fleet = write_synthetic_fleet(tmp_path, 4)
    init_keys(fleet.artifacts.signing_key, fleet.artifacts.public_key, fleet.artifacts.dir)
    return fleet


def test_each_version_is_shown_against_the_faster_runtime_named(fleet):
    publish(
        fleet,
        "gw-fast",
        [
            {
                "onnxruntime": runtime("onnxruntime", 0.52, 0.50, 0.48),
                "openvino": runtime("openvino", 0.42, 0.40, 0.38),
            },
            {"onnxruntime": runtime("onnxruntime", 0.52, 0.50, 0.48)},  # this board has no OpenVINO
        ],
    )
    html = render(fleet).decode()
    assert "<th>vs best runtime</th>" in html
    vs_ort, vs_best = version_cells(html, "gw-fast")
    assert ">2.00x [" in vs_ort and 'title="onnxruntime 1.0, 1 thread on 2 of 2 boards"' in vs_ort
    # per board the faster runtime: OpenVINO's 0.40 ms on the first, onnxruntime's 0.50 on the second
    assert re.search(r'class="num vs-best-runtime" data-sort="1\.8[0-9]*"', vs_best), vs_best
    assert re.search(r">1\.80x \[[0-9.]+, [0-9.]+\] onnxruntime, openvino</td>", vs_best), vs_best
    assert "openvino 1.0, 1 thread on 1 of 2 boards" in vs_best


def test_a_version_no_board_ran_a_runtime_for_says_not_measured(fleet):
    publish(fleet, "gw-fast", [{"openvino": runtime("openvino", 0.13, 0.125, 0.12)}])
    publish(fleet, "gw-slow", [{}, {}])
    html = render(fleet).decode()
    vs_ort, vs_best = version_cells(html, "gw-fast")
    assert ">not measured</td>" in vs_ort and ">0.50x [" in vs_best and vs_best.endswith(" openvino</td>")
    assert [">not measured</td>" in cell for cell in version_cells(html, "gw-slow")] == [True, True]
