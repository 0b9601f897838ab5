"""Integration: a quantized (QDQ int8) ONNX model with a fixed scalar input, tuned and built on
the simulated fleet (`sim_fleet`) by `edgetune build`: its artifact stays within 1.5x of the
ONNX file's size, takes only the fed input, and matches onnxruntime on the boards. The test
fleet's boards run the host's Python, which has onnxruntime: each board also timed the ONNX
file with it (every input, the fixed one too), and the build report and the dashboard show the
tuned build against it."""

from __future__ import annotations

import re
import statistics
from dataclasses import replace

import onnxruntime
import pytest
from support.onnx_samples import qdq_model

from edgetune.artifact.release import build_artifacts, runtime_ratios
from edgetune.artifact.store import ArtifactStore
from edgetune.artifact_format.manifest import LIBRARY_NAME, REFERENCE_INPUT_NAME
from edgetune.artifact_format.reference import read_npz
from edgetune.artifact_format.signing import init_keys
from edgetune.artifact_format.timing_stats import ratio_text
from edgetune.inventory.schema import FixedValue, Model, ModelInput
from edgetune.report import report as report_page
from edgetune.tune.tuner import SearchSettings, TuneOptions, tune_class

CLASS = "gw-fast"


def test_quantized_model_with_a_fixed_input_builds_an_artifact_the_size_of_its_onnx_file(sim_fleet, tmp_path):
    onnx_path = qdq_model(tmp_path / "vad-int8.onnx", rate_branch=True)
    model = Model(
        "vad-int8", (ModelInput("x", (1, 512)), ModelInput("sr", (), "int64", FixedValue(16000))), onnx=onnx_path
    )
    fleet = sim_fleet.replace(
        workdir=tmp_path / "work",
        models=(model,),
        artifacts=replace(
            sim_fleet.artifacts,
            dir=tmp_path / "artifacts",
            signing_key=tmp_path / "keys" / "signing.key",
            public_key=tmp_path / "keys" / "signing.pub",
        ),
    )
    init_keys(fleet.artifacts.signing_key, fleet.artifacts.public_key, fleet.artifacts.dir)
    tuned = tune_class(fleet, CLASS, TuneOptions(search=SearchSettings(population_size=64)))
    assert tuned.ok, tuned.error

    report = build_artifacts(fleet, classes=[CLASS])
    print(report.table())
    (outcome,) = report.outcomes
    assert report.ok and outcome.status == "built", report.failures()
    stored = ArtifactStore(fleet.artifacts.dir).latest("vad-int8", CLASS)
    library_bytes = (stored.path / LIBRARY_NAME).stat().st_size
    assert library_bytes <= 1.5 * onnx_path.stat().st_size, (library_bytes, onnx_path.stat().st_size)
    assert outcome.library_mb == library_bytes / 1e6
    assert stored.manifest.entry.inputs == ("x",)
    assert list(read_npz(stored.path / REFERENCE_INPUT_NAME)) == ["x"]
    assert all(board.max_abs_error < 1e-3 for board in stored.manifest.boards)

    ratios = runtime_ratios(stored.manifest.boards, "onnxruntime")
    assert sorted(ratios) == ["fast-1", "fast-2"]
    for board in stored.manifest.boards:
        ort = board.onnxruntime
        assert ort.runtime == f"onnxruntime {onnxruntime.__version__}, 1 thread"  # the profile's runtime threads
        assert ort.timing.samples == board.tuned.samples  # the same rounds, as many samples
        assert ort.max_abs_error <= stored.manifest.inputs.tolerance.atol  # twice its own int8 kernels' spread
    assert outcome.vs_onnxruntime == pytest.approx(statistics.median(r.ratio for r in ratios.values()))
    assert f"{ratio_text(outcome.vs_onnxruntime)}x" in report.table()

    page = (report_page(fleet, tmp_path / "dashboard")).read_text()
    cell = re.search(r'<td class="num vs-onnxruntime" data-sort="([^"]+)" title="([^"]+)">([^<]+)</td>', page)
    low = min(r.low for r in ratios.values())
    high = max(r.high for r in ratios.values())
    assert cell.group(3) == f"{outcome.vs_onnxruntime:.2f}x [{low:.2f}, {high:.2f}]"
    assert cell.group(2) == f"onnxruntime {onnxruntime.__version__}, 1 thread on 2 of 2 boards"
