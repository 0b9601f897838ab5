"""The runtimes a build is compared against on its boards (onnxruntime and OpenVINO, where the
board's Python has them), on simulated fleets: a runtime is timed only once its outputs match
the reference (on `sim_fleet`, whose boards run the host's Python, which has both), and a class
whose board's Python is a board image (tests/support/board_image.py: neither runtime) builds, its
manifest, its row of the build's table and its class run's time to parity saying "not measured" (a
fleet of its own, `sim_slot`)."""

from __future__ import annotations

import logging
import sys

import onnxruntime
import openvino
import pytest
from support.board_image import board_image
from support.onnx_samples import conv_model
from support.quick_profiles import quick_profiles
from support.sim_checks import running
from support.sim_network import sim_fleet_yaml

from edgetune.artifact.measure import compare_on_board
from edgetune.artifact.release import build_artifacts
from edgetune.artifact.store import ArtifactStore
from edgetune.artifact_format.manifest import Tolerance
from edgetune.artifact_format.signing import init_keys
from edgetune.compiler.models import reference_inputs, reference_outputs
from edgetune.fleet.board_runtimes import ONNXRUNTIME, OPENVINO, OnnxModel, runtime_on_board
from edgetune.fleet.tracker import board_sessions, rpc_endpoint
from edgetune.inventory.workdir import Workdir
from edgetune.tune.database import ClassDatabasePaths
from edgetune.tune.report import read_summary
from edgetune.tune.tuner import SearchSettings, TuneOptions, tune_class

TOLERANCE = Tolerance(rtol=1e-4, atol=1e-5)
OPENVINO_VERSION = openvino.__version__.split("-")[0]


def test_a_runtime_answering_differently_from_the_reference_is_said_and_not_timed(sim_fleet, tmp_path, caplog):
    model = conv_model(tmp_path / "conv.onnx")
    inputs = reference_inputs(model)
    right = {f"output{i}": out for i, out in enumerate(reference_outputs(model, inputs))}
    wrong = {name: out + 0.5 for name, out in right.items()}
    measurement = sim_fleet.device_class("gw-fast").profile.measurement
    board = sim_fleet.boards_of("gw-fast")[0]
    with board_sessions(rpc_endpoint(sim_fleet, "gw-fast"), [board]) as (sessions, failed):
        assert not failed, failed
        session = sessions[board.name]
        assert (runtime_on_board(session, ONNXRUNTIME), runtime_on_board(session, OPENVINO)) == (
            onnxruntime.__version__,
            OPENVINO_VERSION,
        )
        checked = compare_on_board(
            session, {}, "main", [], measurement, OnnxModel(model.onnx, inputs, right, TOLERANCE)
        )
        with caplog.at_level(logging.WARNING, logger="edgetune.fleet.board_runtimes"):
            mismatched = compare_on_board(
                session, {}, "main", [], measurement, OnnxModel(model.onnx, inputs, wrong, TOLERANCE)
            )

    assert sorted(checked) == [ONNXRUNTIME, OPENVINO]
    assert checked[OPENVINO].runtime == f"openvino {OPENVINO_VERSION}, 1 thread"
    compare = measurement.compare
    assert checked[OPENVINO].timing.samples == checked[ONNXRUNTIME].timing.samples == compare.rounds * compare.repeat
    assert mismatched == {}  # neither answered like the (wrong) reference: neither was timed
    for name, version in ((ONNXRUNTIME, onnxruntime.__version__), (OPENVINO, OPENVINO_VERSION)):
        assert (
            f"{name} {version} on the board answers conv.onnx differently from the reference (output0: max |error| "
            in caplog.text
        ), caplog.text


FLEET_BODY = """\
device_classes:
  - {{name: gw-bare, profile: {profiles}/x86-64-v3.yaml}}
boards:
  - {{name: bare-1, address: 10.231.{subnet}.51, device_class: gw-bare, python: {python}, workdir: work/boards/bare-1,
      simulated: {{cpu_quota: 1.0}}}}
models:
  - {{name: convnet, onnx: {onnx}, inputs: [{{name: image, shape: [1, 3, 16, 16]}}]}}
tuning: {{trials_per_class: 16, trials_per_iter: 8, max_trials_per_task: 8}}
artifacts: {{dir: artifacts, signing_key: work/keys/signing.key, public_key: work/keys/signing.pub}}
"""


@pytest.fixture(scope="module")
def bare_build(sim_slot, tmp_path_factory):
    """An ONNX model tuned and built for a class whose one board's Python is a board image (no
    onnxruntime, no OpenVINO): (the fleet, the build's report, what the class run and the build logged)."""
    from edgetune.inventory import load_fleet

    directory = tmp_path_factory.mktemp("bare-fleet")
    path = directory / "fleet.yaml"
    path.write_text(
        sim_fleet_yaml(
            sim_slot,
            "bare",
            FLEET_BODY,
            profiles=quick_profiles(directory / "device_profiles", ("x86-64-v3",)),
            python=board_image() / "bin" / "python",
            onnx=conv_model(directory / "conv.onnx").onnx,
        )
    )
    fleet = load_fleet(path)
    init_keys(fleet.artifacts.signing_key, fleet.artifacts.public_key, fleet.artifacts.dir)
    handler, logger = _Collect(), logging.getLogger("edgetune")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        with running(fleet):
            tuned = tune_class(fleet, "gw-bare", TuneOptions(search=SearchSettings(population_size=64)))
            assert tuned.ok, tuned.error
            report = build_artifacts(fleet)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    print(report.table(), file=sys.stderr)
    return fleet, report, handler.lines


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_board_without_either_runtime_builds_and_its_table_row_says_not_measured(bare_build):
    fleet, report, logged = bare_build
    (outcome,) = report.outcomes
    assert report.ok and outcome.status == "built", report.failures()
    assert (outcome.vs_onnxruntime, outcome.vs_openvino, outcome.vs_best_runtime, outcome.best_runtime) == (None,) * 4
    header, _, row = report.table().splitlines()
    columns = [header.index(name) for name in ("vs onnxruntime", "vs openvino", "vs best runtime", "parity")]
    assert [row[at : at + len("not measured")] for at in columns] == ["not measured"] * 4
    summary = read_summary(Workdir(fleet.workdir).report("gw-bare", "convnet") / "summary.json")
    assert (summary.time_to_parity, summary.parity, dict(summary.runtimes)) == ("not measured", None, {})
    assert not ClassDatabasePaths.of(fleet.workdir, "gw-bare").runtimes.exists()  # nothing measured, nothing recorded
    assert (
        f"[gw-bare] convnet: no runtime on bare-1 ran it (neither onnxruntime nor openvino in {fleet.boards[0].python}, "
        "or they answered differently): time to parity not measured" in logged
    )
    for name in ("onnxruntime", "openvino"):
        assert (
            f"  not compared against {name}: no board of gw-bare ran it (with `{fleet.boards[0].python} -m pip "
            f"install {name}` on a board, the next version built is)" in logged
        )


def test_a_board_without_either_runtime_leaves_them_out_of_the_manifest(bare_build):
    fleet, *_ = bare_build
    manifest = ArtifactStore(fleet.artifacts.dir).latest("convnet", "gw-bare").manifest
    (board,) = manifest.boards
    assert board.board == "bare-1" and board.tuned.samples > 0
    assert board.onnxruntime is None and board.openvino is None
